"""Batches handed to the caller in their workers' shared-memory slots, not copies: a slot
goes back to its worker once every tensor of its batch (and every view of one, and every
numpy array made from one) is gone.

Each field is handed out as ``torch.from_numpy`` of a fresh numpy view of the slot's
rows: the tensor's storage holds that view, and only that view, so the view is freed
exactly when the last tensor sharing the storage is; a finalizer on it then queues the
slot, and the loader gives queued slots back before it next waits on a worker. A worker
keeps at least one slot of its ring: once ``most`` of its slots are out with the
caller (a caller that keeps batches, ``list(loader)``), its next batches are copied out
of the slot instead, as every batch was before. The slots' memory stays mapped while a
view of it lives, the pass's end and the pool's close included.

A process forked from the caller's (``multiprocessing`` with fork, ``os.fork``) shares
those pages rather than getting a copy of them: the slots out with the caller when it
forks are never given back (the child may be reading its inherited batch), at the cost
of fewer slots for their workers for the rest of the pass. The loader's own workers,
forked at a pass's start, do not count (they never read what they inherit).
"""

from __future__ import annotations

import os
import threading
import weakref
from collections import deque
from typing import Any

import numpy as np
import torch

_live: weakref.WeakSet[Handout] = weakref.WeakSet()  # handouts of passes not ended
_own_fork = threading.local()  # the loader forking its own workers (not the caller)
_hooked = False  # the fork hook is installed (by the first handout, not by importing)


def _before_fork() -> None:
    if getattr(_own_fork, "on", False):
        return
    for h in list(_live):
        h.freeze()


class own_workers:
    """Around forking the loader's own workers: the slots out with the caller stay out
    only until the caller lets go of them, as without a fork."""

    def __enter__(self) -> None:
        _own_fork.on = True

    def __exit__(self, *exc: object) -> None:
        _own_fork.on = False


class Handout:
    """The slots of one pass's workers that are out with the caller."""

    def __init__(self, workers: int, most: int) -> None:
        global _hooked
        self.most = most
        self.out = [0] * workers  # slots of each worker out with the caller
        self.freed: deque[Any] = deque()  # their Got, once the caller let go of them
        self.lent = 0  # batches handed out in their slots (tests)
        self.frozen = 0  # slots kept out for good: the caller forked while it held them
        self._lock = threading.Lock()
        self._outstanding: dict[int, Any] = {}  # id(Got) -> Got, out with the caller now
        self._kept: set[int] = set()  # ids of those never to be given back
        self._ended = False
        _live.add(self)
        if not _hooked:
            _hooked = True
            os.register_at_fork(before=_before_fork)

    def can_lend(self, worker: int) -> bool:
        return self.out[worker] < self.most

    def lend(self, got: Any, arrays: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
        """The batch of ``got`` (its slot's rows as numpy ``arrays``, views made for this
        handout alone) as tensors over the slot; ``got`` is queued in :attr:`freed` when
        all of them are gone."""
        left = [len(arrays)]
        key = id(got)

        def gone() -> None:  # (on whichever thread drops the last reference)
            with self._lock:
                left[0] -= 1
                if left[0]:
                    return
                self._outstanding.pop(key, None)
                if key in self._kept or self._ended:
                    self._kept.discard(key)
                    return
                self.freed.append(got)

        with self._lock:
            self._outstanding[key] = got
        out = {}
        for k, a in arrays.items():
            weakref.finalize(a, gone)
            out[k] = torch.from_numpy(a)
        self.out[got.worker] += 1
        self.lent += 1
        return out

    def returned(self) -> list[Any]:
        """The slots the caller let go of since the last call (to give back)."""
        got = []
        while self.freed:
            g = self.freed.popleft()
            self.out[g.worker] -= 1
            got.append(g)
        return got

    def freeze(self) -> None:
        """The caller forks: what it holds now is never given back."""
        with self._lock:
            new = set(self._outstanding) - self._kept
            self._kept |= new
            self.frozen += len(new)

    def end(self) -> None:
        """The pass ended: nothing is given back any more (and nothing kept for it)."""
        with self._lock:
            self._ended = True
            self.freed.clear()
            self._outstanding.clear()
        live = _live
        if live is not None:  # (None while the interpreter exits)
            live.discard(self)
