"""A consumer's planner and reader, kept from one pass to the next in one process.

A pass of the static plan in the process that uses its batches (a
:class:`~stoker.TokenLoader` with ``num_workers=0``, or a dataset iterated directly)
plans its reader past its epoch's end, into the first positions of the pass that
follows it (its source's ``following``). When it reads its whole share, its planner
and reader are kept on the dataset (:class:`Kept`), under the name of the pass
predicted to follow: the same rank, workers and batch interleave, the next epoch and
the epoch set the finished one carries into it. The next pass adopts them when it is
that pass; its first blocks were decoded while the last pass was read, and nothing
is opened, mapped or planned again. Any other pass (another epoch set, a loaded
state, workers of another process) closes what was kept, and so do
:meth:`~stoker.loader.planned.PlannedDataset.set_epoch` to another epoch,
``load_state_dict`` and :meth:`~stoker.TokenLoader.close`.

Only a kind whose reader reads any epoch's samples is carried
(:attr:`~stoker.loader.planned.PlannedDataset.reader_spans_epochs`): token samples
are the same whatever the epoch, augmented records are not.
"""

from __future__ import annotations

import os
import threading
import warnings
import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING

from stoker.loader import state as st

if TYPE_CHECKING:
    from stoker.loader.consumer import Planner, Reader

PassKey = tuple[str, int, int, int, int, int, int, int, bytes]


def pass_key(
    progress: st.Progress, rank: int, num_workers: int, interleave: int, stream: str = ""
) -> PassKey:
    """What a pass's samples follow from: how the dataset maps positions (``stream``, its
    :meth:`~stoker.loader.planned.PlannedDataset.stream_identity`), the rank, its workers
    and their batch interleave, the epoch, its set, the world, its chunk and what was
    consumed of it."""
    p = progress
    return (
        stream,
        rank,
        num_workers,
        interleave,
        p.epoch,
        p.world,
        p.chunk,
        p.consumed,
        p.epoch_set.tobytes(),
    )


class Kept:
    """The planners and readers a dataset's last pass kept for the pass it predicted
    (one per consumer of that pass), in the process they were made in.

    Whatever is kept is closed before this process forks (``os.fork``, a torch
    DataLoader's workers): a kept reader's threads go on decoding the next epoch's
    first blocks, and a child must not inherit a lock one of them holds."""

    def __init__(self) -> None:
        self._key: PassKey | None = None
        self._held: dict[int, tuple[Planner, Reader]] = {}
        self._lock = threading.Lock()

    def put(self, key: PassKey, worker: int, planner: Planner, reader: Reader) -> None:
        _closed_before_forks(self)
        with self._lock:
            if key != self._key:
                stale = self._take_all()
                self._key = key
            else:
                stale = [self._held.pop(worker)] if worker in self._held else []
            self._held[worker] = (planner, reader)
        _close(stale)

    def take(self, key: PassKey, worker: int) -> tuple[Planner, Reader] | None:
        """Worker ``worker``'s planner and reader, when they were kept for the pass
        ``key``; otherwise None, and what was kept for another pass is closed."""
        with self._lock:
            if key == self._key:
                return self._held.pop(worker, None)
            stale = self._take_all()
        _close(stale)
        return None

    def release(self) -> None:
        """Close whatever is kept."""
        with self._lock:
            stale = self._take_all()
        _close(stale)

    def _take_all(self) -> list[tuple[Planner, Reader]]:
        """Everything kept, let go of here (under the lock). (A forked child finds
        nothing: what was kept is closed before the fork.)"""
        held, self._held, self._key = list(self._held.values()), {}, None
        return held

    def __bool__(self) -> bool:
        return bool(self._held)

    def __reduce__(self) -> tuple[type[Kept], tuple[()]]:
        """A pickled dataset (a spawned DataLoader worker's) keeps nothing: a reader and
        its threads are this process's."""
        return (Kept, ())


def _close(held: list[tuple[Planner, Reader]]) -> None:
    """Close every reader (one that fails to close is warned of: it read nothing more)."""
    for _, reader in held:
        try:
            reader.close()
        except Exception as exc:
            warnings.warn(f"a kept reader failed to close: {exc!r}", RuntimeWarning, stacklevel=2)


_live: weakref.WeakSet[Kept] = weakref.WeakSet()  # (those that ever kept something)
_hooked = False


def _closed_before_forks(kept: Kept) -> None:
    """Release ``kept`` before any fork of this process (a hook the first keep installs)."""
    global _hooked
    _live.add(kept)
    if not _hooked:
        _hooked = True
        os.register_at_fork(before=_release_all, after_in_child=_relock)


def _release_all() -> None:
    for kept in list(_live):
        kept.release()


def _relock() -> None:
    for kept in list(_live):
        kept._lock = threading.Lock()


@dataclass(frozen=True)
class PassCarry:
    """:class:`~stoker.loader.consumer.Carry` of one pass: it adopts what was kept for
    ``this`` pass and keeps its own for ``following`` (None: nothing is kept)."""

    kept: Kept
    this: PassKey
    following: PassKey | None

    def adopt(self, worker: int) -> tuple[Planner, Reader] | None:
        return self.kept.take(self.this, worker)

    def keep(self, worker: int, planner: Planner, reader: Reader) -> bool:
        # (a reader whose read-ahead failed keeps its error: the next pass opens a fresh
        # one, which tries the block again)
        if self.following is None or getattr(reader, "failed", False):
            return False
        self.kept.put(self.following, worker, planner, reader)
        return True
