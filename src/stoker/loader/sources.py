"""Where a consumer's positions come from: one interface, two sources.

A consumer (a loader worker, or the main process with ``num_workers=0``) asks
its source for batches of stream positions and turns them into sample ids with
the pure plan (``plan.Stream``). :class:`StaticSource` hands out the static
split by arithmetic (``plan.worker_indices``), with nothing to confirm;
:class:`~stoker.coordinator.consumer.LeaseStream` hands out the coordinator's
leases, and each batch comes with the ``(lease, upto, rows)`` segments the
rank must confirm before training sees it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol, runtime_checkable

import numpy as np

from stoker import plan
from stoker.loader import state as st

Segments = list[tuple[int, int, int]]  # (lease, upto, rows); empty: nothing to confirm

_CHUNK = 2048  # positions the static source works out at a time


@runtime_checkable
class PositionSource(Protocol):
    """A consumer's positions of the current epoch, a batch at a time.

    ``consumer`` is the id the coordinator knows the consumer by (0 for the static
    plan), ``first_step`` the rank's batch number its epoch starts at (after a
    restore), and ``reregistered`` counts the times it registered again (a new id).
    """

    epoch: int
    consumer: int
    first_step: int
    reregistered: int

    def batches(self, size: int) -> Iterator[tuple[np.ndarray, Segments]]:
        """``(positions, segments)`` of up to ``size`` positions each, in order."""
        ...

    def upcoming(self, limit: int) -> np.ndarray:
        """Up to ``limit`` positions that follow the last batch, as far as known (to plan
        prefetching)."""
        ...


class StaticSource:
    """Worker ``worker`` of ``num_workers`` of rank ``rank``: its share of the static split,
    from sample ``skip`` of that share on (what is already consumed is not handed out).

    ``following`` (the same worker's source of the next epoch) extends
    :meth:`upcoming` past the end of this epoch: its first positions are planned
    (prefetched) but never handed out.
    """

    consumer = 0
    first_step = 0
    reregistered = 0

    def __init__(
        self,
        progress: st.Progress,
        rank: int,
        worker: int,
        num_workers: int,
        interleave: int,
        skip: int = 0,
        following: StaticSource | None = None,
    ) -> None:
        self.epoch = progress.epoch
        self.split = progress.split
        self.rank, self.worker, self.num_workers = rank, worker, num_workers
        self.interleave = interleave  # consecutive samples per worker turn (the batch size)
        self.m0 = progress.consumed
        self.remaining = self.split.per_rank - self.m0
        self.count = plan.worker_count(self.remaining, worker, num_workers, interleave)
        self.next = skip
        self.following = following

    def _positions(self, lo: int, hi: int) -> np.ndarray:
        local = self.m0 + plan.worker_indices(
            self.remaining, self.worker, self.num_workers, self.interleave, lo, hi
        )
        return self.split.rank_positions(self.rank, local)

    def batches(self, size: int) -> Iterator[tuple[np.ndarray, Segments]]:
        step = size * max(1, _CHUNK // size)  # worked out a stretch at a time, handed out
        while self.next < self.count:  # a batch at a time
            lo = self.next
            chunk = self._positions(lo, min(self.count, lo + step))
            for a in range(0, len(chunk), size):
                part = chunk[a : a + size]
                self.next = lo + a + len(part)
                yield part, []

    def upcoming(self, limit: int) -> np.ndarray:
        here = self._positions(self.next, min(self.count, self.next + limit))
        if len(here) < limit and self.following is not None:
            return np.concatenate([here, self.following.upcoming(limit - len(here))])
        return here
