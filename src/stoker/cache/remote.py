"""The node agent's side of remote storage: per-node caps on concurrency and request rate."""

from __future__ import annotations

import threading
import time
from typing import Any

from stoker.observe.agent import Counters
from stoker.storage import Storage


class RateLimiter:
    """At most ``rate`` requests per second, with bursts of up to ``rate`` (token bucket)."""

    def __init__(self, rate: float) -> None:
        self.rate = rate
        self._tokens = rate
        self._last = time.monotonic()
        self._lock = threading.Lock()

    def acquire(self) -> None:
        if self.rate <= 0:
            return
        while True:
            with self._lock:
                now = time.monotonic()
                self._tokens = min(self.rate, self._tokens + (now - self._last) * self.rate)
                self._last = now
                if self._tokens >= 1:
                    self._tokens -= 1
                    return
                wait = (1 - self._tokens) / self.rate
            time.sleep(wait)  # pacing toward the origin, not synchronisation


class RemoteStorage(Storage):
    """Storage whose range reads respect the node's caps and are counted."""

    def __init__(
        self,
        url: str,
        storage_options: dict[str, Any] | None,
        slots: threading.BoundedSemaphore,
        limiter: RateLimiter,
        counters: Counters,
    ) -> None:
        super().__init__(url, storage_options)
        self._slots, self._limiter, self._counters = slots, limiter, counters

    def read_range(self, path: str, start: int, stop: int) -> bytes:
        with self._slots:
            self._limiter.acquire()
            t = time.perf_counter()
            try:
                data = super().read_range(path, start, stop)
            except BaseException:
                self._counters.add("remote_errors")
                raise
            self._counters.observe(time.perf_counter() - t)
        self._counters.add("remote_requests")
        self._counters.add("remote_bytes", len(data))
        return data
