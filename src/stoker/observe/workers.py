"""A :class:`~stoker.TokenLoader` worker's counts: what changed since its last batch
(:class:`WorkerMeter`, in the worker), folded into the main process's registry
(:func:`apply_worker`). torch DataLoader workers export theirs through files
instead (:mod:`stoker.observe.export`)."""

from __future__ import annotations

import time
from typing import Any

from stoker.observe.registry import delta, registry


class WorkerMeter:
    """A loader worker's counting: what changed since its last batch message."""

    def __init__(self) -> None:
        self.last = registry().snapshot()  # a forked worker starts with its parent's counts
        self.since = time.monotonic()

    def delta(self, busy: float) -> dict[str, Any]:
        now, t = registry().snapshot(), time.monotonic()
        out = {**delta(now, self.last), "busy": busy, "alive": t - self.since}
        self.last, self.since = now, t
        return out


def apply_worker(rank: int, worker: int, change: dict[str, Any]) -> None:
    """Fold a worker's :meth:`WorkerMeter.delta` into this (the main) process's metrics."""
    reg = registry()
    reg.add(change)
    stats = reg.loader(rank)
    with reg.lock:
        stats.worker(worker, change["busy"], change["alive"])
