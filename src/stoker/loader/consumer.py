"""The one consumer loop: source -> positions -> sample ids -> reader -> slot.

Every way stoker reads runs this loop: a :class:`~stoker.TokenLoader` worker
process, the loader's main process with ``num_workers=0``, a torch DataLoader
worker iterating a dataset, for the static plan and for the coordinator's leases
alike. What differs is only what is plugged in:

* the *source* of positions (:class:`~stoker.loader.sources.PositionSource`:
  the static split, or a :class:`~stoker.coordinator.consumer.LeaseStream`);
* the mapping of positions to sample ids (the pure plan, ``plan.Stream``);
* the *reader* of the kind of data (:class:`Reader`: what a row holds, in its
  :class:`~stoker.loader.batch.Layout`, and how to fill rows);
* where a batch goes (``take``: a free shared-memory slot of a worker, or fresh
  arrays in the process that reads);
* optionally a :class:`Carry`: a consumer in the process that uses its batches keeps
  its planner and reader at the end of a pass that read its whole share, planned into
  the next epoch's first positions, and the next pass adopts them when it is the pass
  predicted (nothing loaded or set in between): its first batches were decoded while
  the last one was read, and nothing is planned or opened again.

:class:`Planner` keeps the reader planned ahead of use: it asks the source what
comes after each batch (``upcoming``) and re-plans the reader whenever less
than its ``horizon`` is known, so the blocks of the next shuffle window are
decoded while the current one is read, whatever the source.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from stoker.loader.batch import SAMPLE_ID, Layout
from stoker.loader.sources import PositionSource, Segments

_EMPTY = np.zeros(0, dtype=np.int64)


class Reader(Protocol):
    """Reads rows of one kind of data by sample id, planned ahead of use."""

    layout: Layout
    horizon: int  # samples it wants planned ahead

    def plan(self, upcoming: np.ndarray) -> None:
        """The sample ids that come next, in order (the next fill starts with the first)."""
        ...

    def fill(self, ids: np.ndarray, out: dict[str, np.ndarray]) -> None:
        """Write the rows of ``ids`` into ``out`` (the layout's fields, each ``len(ids)``
        rows; ``sample_id`` is already filled)."""
        ...

    def close(self) -> None: ...


class Carry(Protocol):
    """Where a consumer's planner and reader wait between two passes of one process."""

    def adopt(self, worker: int) -> tuple[Planner, Reader] | None:
        """What the pass before kept for worker ``worker``, when this pass is the one it
        was planned for (else None, and whatever was kept is closed)."""
        ...

    def keep(self, worker: int, planner: Planner, reader: Reader) -> bool:
        """Keep them for the next pass (after this one read its whole share); False
        when this pass plans none (the caller closes the reader)."""
        ...


@dataclass(frozen=True)
class ConsumerSpec:
    """What one consumer runs, made in the process that runs it (after a fork):
    ``source(worker)`` its positions, ``samples`` the plan, ``reader(epoch)`` its reader
    for the epoch its positions are of (a kind whose samples are random, as augmented
    records are, draws them from the epoch and the sample id); ``carry`` keeps the
    planner and reader from one pass to the next (a consumer in the process that uses
    its batches)."""

    source: Callable[[int], PositionSource]
    samples: Callable[[np.ndarray], np.ndarray]
    reader: Callable[[int], Reader]
    batch_size: int
    carry: Carry | None = None


class Planner:
    """Sample ids of a consumer's positions, with its reader planned ``horizon`` ahead."""

    def __init__(
        self,
        source: PositionSource,
        samples: Callable[[np.ndarray], np.ndarray],
        reader: Reader,
        horizon: int,
    ) -> None:
        self.source, self.samples, self.reader = source, samples, reader
        self.horizon = max(1, horizon)
        self.pos = self.ids = _EMPTY
        self.i = 0
        self._known_all = False  # the source told all it knows beyond what is planned
        # ... but a coordinator's source learns more (a lease granted ahead): asked again
        # every ``horizon // 8`` positions taken while the plan is short
        self._idle = 0

    def adopt(self, source: PositionSource, samples: Callable[[np.ndarray], np.ndarray]) -> None:
        """Go on with the next pass's ``source`` (and plan): what is planned already
        holds as long as its positions are the ones the source hands out."""
        self.source, self.samples = source, samples

    def __call__(self, positions: np.ndarray) -> np.ndarray:
        n = len(positions)
        # bytes compare: a fraction of np.array_equal's cost on a batch of positions
        if (
            self.pos[self.i : self.i + n].tobytes()
            != positions.astype(np.int64, copy=False).tobytes()
        ):
            # the first batch, a new lease, an end stolen by another consumer: plan again
            ahead = self.source.upcoming(2 * self.horizon)
            self.pos = np.concatenate([positions, ahead])
            self.ids = self.samples(self.pos)
            self.i = 0
            self._known_all = len(ahead) < 2 * self.horizon
            self.reader.plan(self.ids)
        elif len(self.pos) - self.i - n < self.horizon:
            if not self._known_all:
                self._extend(n)
            else:
                self._idle += n
                if self._idle >= self.horizon // 8:
                    self._idle = 0
                    self._extend(n)
        self.i += n
        return self.ids[self.i - n : self.i]

    def _extend(self, n: int) -> None:
        """Plan further ahead, mapping only the positions not mapped yet."""
        known = self.pos[self.i + n :]
        ahead = self.source.upcoming(2 * self.horizon)
        self._known_all = len(ahead) < 2 * self.horizon
        if np.array_equal(ahead[: len(known)], known):
            new = ahead[len(known) :]
            if not len(new):
                self._known_all = True
                return
            self.pos = np.concatenate([self.pos[self.i :], new])
            self.ids = np.concatenate([self.ids[self.i :], self.samples(new)])
        else:  # the source changed its mind (part of a lease was stolen)
            self.pos = np.concatenate([self.pos[self.i : self.i + n], ahead])
            self.ids = np.concatenate([self.ids[self.i : self.i + n], self.samples(ahead)])
        self.i = 0
        self.reader.plan(self.ids)


@dataclass(frozen=True)
class Began:
    """A consumer registered (again): its id, the epoch and the rank's first batch number."""

    consumer: int
    epoch: int
    first_step: int


@dataclass(frozen=True)
class Made:
    """A batch of ``rows`` rows is in ``slot`` (or, read in process, in ``arrays``);
    ``busy`` seconds of work went into it."""

    slot: int
    rows: int
    segments: Segments
    busy: float
    arrays: dict[str, np.ndarray] | None = None


Take = Callable[[int], "tuple[int, dict[str, np.ndarray]] | None"]


def produce(spec: ConsumerSpec, worker: int, take: Take) -> Iterator[Began | Made]:
    """The consumer loop: every batch of worker ``worker``'s positions, read into what
    ``take(rows)`` gives (``(slot, arrays)``, or None to stop), announced as it is made.
    The reader is closed at the end, however the loop ends, unless ``spec.carry`` keeps
    it (with its planner) for the next pass, after a pass that read its whole share."""
    source = spec.source(worker)
    kept = spec.carry.adopt(worker) if spec.carry is not None else None
    planner, reader = kept if kept is not None else (None, spec.reader(source.epoch))
    whole = False  # the pass read all its source handed out
    try:
        yield Began(source.consumer, source.epoch, source.first_step)
        seen = source.reregistered
        if planner is None:
            planner = Planner(source, spec.samples, reader, max(spec.batch_size, reader.horizon))
        else:
            planner.adopt(source, spec.samples)
        batches = source.batches(spec.batch_size)
        while True:
            t = time.perf_counter()
            got = next(batches, None)
            if got is None:
                whole = True
                return
            positions, segments = got
            ids = planner(positions)
            busy = time.perf_counter() - t
            dest = take(len(ids))
            if dest is None:
                return
            t = time.perf_counter()
            slot, arrays = dest
            arrays[SAMPLE_ID][...] = ids
            reader.fill(ids, arrays)
            busy += time.perf_counter() - t
            if source.reregistered != seen:  # it expired and registered again: a new id
                seen = source.reregistered
                yield Began(source.consumer, source.epoch, source.first_step)
            yield Made(slot, len(ids), segments, busy, None if slot >= 0 else arrays)
    finally:
        carry = spec.carry
        if not (
            whole
            and carry is not None
            and planner is not None
            and carry.keep(worker, planner, reader)
        ):
            reader.close()


def allocate(layout: Layout) -> Take:
    """``take`` for a consumer in the process that uses its batches: fresh arrays."""
    return lambda rows: (-1, layout.allocate(rows))
