"""Storage: byte-range reads from any fsspec URL, with retries and accounting.

This is the seam between stoker and remote storage: everything above it asks
for ``read_range(path, start, stop)``. The fsspec filesystem behind it is made
lazily in each process and remade after ``fork``, so a DataLoader worker never
shares its parent's connections or event loop.

Errors: a missing file raises ``FileNotFoundError``; a host that cannot be
reached raises :class:`UnreachableError` after a couple of quick tries (it
never hangs: connect and read timeouts are always set); other failures are
retried with exponential backoff and then raise :class:`StorageError`.
"""

from __future__ import annotations

import os
import posixpath
import socket
import threading
import time
import uuid
import weakref
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

from stoker._httpfs import HTTPFS
from stoker._localfs import LocalFS
from stoker.errors import StorageError, UnreachableError
from stoker.metrics import METRICS

T = TypeVar("T")

_UNREACHABLE_HINTS = (
    "connection refused",
    "cannot connect",
    "name or service not known",
    "nodename nor servname",
    "no route to host",
    "temporary failure in name resolution",
    "could not connect",
    "connect timeout",
    "network is unreachable",
)


@dataclass(frozen=True)
class RetryPolicy:
    """How storage retries. Timeouts are seconds."""

    attempts: int = 5
    backoff: float = 0.1
    max_backoff: float = 5.0
    unreachable_attempts: int = 2
    connect_timeout: float = 5.0
    read_timeout: float = 60.0


@dataclass
class StorageStats:
    """Counters of one process's storage traffic."""

    requests: int = 0
    bytes_read: int = 0
    retries: int = 0
    errors: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, nbytes: int) -> None:
        with self._lock:
            self.requests += 1
            self.bytes_read += nbytes


def split_url(url: str) -> tuple[str, str]:
    """``(protocol, root)`` of a URL; a plain path is ``file``."""
    if "://" not in url:
        return "file", os.path.abspath(url)
    protocol, rest = url.split("://", 1)
    if protocol == "file":
        return "file", os.path.abspath(rest) if not rest.startswith("/") else rest
    return protocol, url if protocol in ("http", "https") else rest


def _classify(exc: BaseException) -> str:
    """'missing', 'unreachable', 'fatal' or 'transient'."""
    if isinstance(exc, FileNotFoundError):
        return "missing"
    if isinstance(
        exc,
        (
            PermissionError,
            IsADirectoryError,
            NotADirectoryError,
            TypeError,
            AttributeError,
            NotImplementedError,
        ),
    ):
        return "fatal"  # retrying cannot help (the last three are programming errors)
    if isinstance(exc, (ConnectionRefusedError, socket.gaierror)):
        return "unreachable"
    text = f"{type(exc).__name__}: {exc}".lower()
    if any(h in text for h in _UNREACHABLE_HINTS) or "clientconnectorerror" in text:
        return "unreachable"
    status = getattr(exc, "status", None)
    if isinstance(status, int) and 400 <= status < 500 and status not in (408, 429):
        return "missing" if status == 404 else "fatal"
    return "transient"


class Storage:
    """Reads and writes files under one dataset root URL."""

    def __init__(
        self,
        url: str,
        storage_options: dict[str, Any] | None = None,
        retry: RetryPolicy | None = None,
        max_inflight: int = 8,
    ) -> None:
        self.url = url.rstrip("/")
        self.protocol, self.root = split_url(self.url)
        self.storage_options = dict(storage_options or {})
        self.retry = retry or RetryPolicy()
        self.max_inflight = max_inflight
        self.stats = StorageStats()
        self._pid: int | None = None
        self._fs: Any = None
        self._pool: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()

    # -- per-process clients --------------------------------------------
    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state.update(_pid=None, _fs=None, _pool=None, _lock=None, stats=None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()
        self.stats = StorageStats()

    def _check_pid(self) -> None:
        if self._pid != os.getpid():
            self._pid = os.getpid()
            self._fs = None
            self._pool = None
            self._lock = threading.Lock()
            self.stats = StorageStats()

    @property
    def fs(self) -> Any:
        """The filesystem (an fsspec one, or stoker's LocalFS for local paths)."""
        self._check_pid()
        if self._fs is None:
            with self._lock:
                if self._fs is None and not self.storage_options:
                    if self.protocol == "file":
                        self._fs = LocalFS()
                    elif self.protocol in ("http", "https"):
                        self._fs = HTTPFS(self.retry.connect_timeout, self.retry.read_timeout)
                if self._fs is None:
                    import fsspec

                    fs = fsspec.filesystem(
                        self.protocol, skip_instance_cache=True, **self._options()
                    )
                    if self.protocol in ("s3", "s3a"):
                        fs.retries = 1  # stoker retries (with backoff) itself
                    self._fs = fs
        return self._fs

    @property
    def pool(self) -> ThreadPoolExecutor:
        self._check_pid()
        if self._pool is None:
            with self._lock:
                if self._pool is None:
                    self._pool = ThreadPoolExecutor(
                        self.max_inflight, thread_name_prefix="stoker-io"
                    )
                    METRICS.threads_opened(self.max_inflight)
                    weakref.finalize(self._pool, METRICS.threads_closed, self.max_inflight)
        return self._pool

    def _options(self) -> dict[str, Any]:
        opts = dict(self.storage_options)
        r = self.retry
        if self.protocol in ("http", "https") and "client_kwargs" not in opts:
            import aiohttp

            opts["client_kwargs"] = {
                "timeout": aiohttp.ClientTimeout(
                    total=None, connect=r.connect_timeout, sock_read=r.read_timeout
                )
            }
        if self.protocol in ("s3", "s3a"):
            config = dict(opts.get("config_kwargs") or {})
            config.setdefault("connect_timeout", r.connect_timeout)
            config.setdefault("read_timeout", r.read_timeout)
            config.setdefault("retries", {"max_attempts": 1})
            opts["config_kwargs"] = config
        return opts

    # -- paths ---------------------------------------------------------------
    def full(self, path: str) -> str:
        if self.protocol in ("http", "https"):
            return f"{self.root}/{path}"
        return posixpath.join(self.root, path)

    def url_of(self, path: str) -> str:
        return f"{self.url}/{path}"

    # -- reads ---------------------------------------------------------------
    def _with_retries(self, what: str, fn: Callable[[], T]) -> T:
        r = self.retry
        attempt = 0
        unreachable = 0
        while True:
            try:
                return fn()
            except Exception as exc:
                kind = _classify(exc)
                self.stats.errors += 1
                METRICS.storage_event("errors")
                if kind == "missing":
                    raise FileNotFoundError(f"{what}: not found") from exc
                if kind == "fatal":
                    raise StorageError(f"{what}: {type(exc).__name__}: {exc}") from exc
                attempt += 1
                if kind == "unreachable":
                    unreachable += 1
                    if unreachable >= r.unreachable_attempts:
                        raise UnreachableError(
                            f"{what}: cannot reach the storage at {self.url} "
                            f"({type(exc).__name__}: {exc})"
                        ) from exc
                if attempt >= r.attempts:
                    raise StorageError(
                        f"{what}: failed after {attempt} attempts ({type(exc).__name__}: {exc})"
                    ) from exc
                self.stats.retries += 1
                METRICS.storage_event("retries")
                time.sleep(min(r.max_backoff, r.backoff * 2 ** (attempt - 1)))

    def read(self, path: str) -> bytes:
        """A whole file."""
        full = self.full(path)
        t = time.perf_counter()
        data = self._with_retries(self.url_of(path), lambda: self.fs.cat_file(full))
        self.stats.add(len(data))
        METRICS.storage_read(len(data), time.perf_counter() - t)
        return bytes(data)

    def read_range(self, path: str, start: int, stop: int) -> bytes:
        """Bytes ``[start, stop)`` of a file: one range request."""
        full = self.full(path)
        where = f"{self.url_of(path)} bytes [{start}, {stop})"

        def get() -> bytes:
            data = self.fs.cat_file(full, start=start, end=stop)
            if len(data) != stop - start:
                raise StorageError(f"{where}: short read of {len(data)} bytes")
            return bytes(data)

        t = time.perf_counter()
        data = self._with_retries(where, get)
        self.stats.add(len(data))
        METRICS.storage_read(len(data), time.perf_counter() - t)
        return data

    def exists(self, path: str) -> bool:
        full = self.full(path)
        return bool(self._with_retries(self.url_of(path), lambda: self.fs.exists(full)))

    def size(self, path: str) -> int:
        full = self.full(path)
        return int(self._with_retries(self.url_of(path), lambda: self.fs.size(full)))

    # -- writes --------------------------------------------------------------
    def open_write(self, path: str) -> Any:
        full = self.full(path)
        if self.protocol == "file":
            self.fs.makedirs(posixpath.dirname(full), exist_ok=True)
        return self.fs.open(full, "wb")

    def write_atomic(self, path: str, data: bytes) -> None:
        """Write a whole file so readers see the old one or the new one, never a part.

        Local files are written aside and renamed; object stores make a single
        PUT visible atomically.
        """
        full = self.full(path)
        if self.protocol == "file":
            tmp = f"{full}.tmp-{uuid.uuid4().hex}"
            os.makedirs(os.path.dirname(full), exist_ok=True)
            with open(tmp, "wb") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, full)
            return
        self._with_retries(self.url_of(path), lambda: self.fs.pipe_file(full, data))

    def remove(self, path: str) -> None:
        try:
            self.fs.rm_file(self.full(path))
        except FileNotFoundError:
            pass
