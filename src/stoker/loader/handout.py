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
"""

from __future__ import annotations

import threading
import weakref
from collections import deque
from typing import Any

import numpy as np
import torch


class Handout:
    """The slots of one pass's workers that are out with the caller."""

    def __init__(self, workers: int, most: int) -> None:
        self.most = most
        self.out = [0] * workers  # slots of each worker out with the caller
        self.freed: deque[Any] = deque()  # their Got, once the caller let go of them
        self.lent = 0  # batches handed out in their slots (tests)

    def can_lend(self, worker: int) -> bool:
        return self.out[worker] < self.most

    def lend(self, got: Any, arrays: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
        """The batch of ``got`` (its slot's rows as numpy ``arrays``, views made for this
        handout alone) as tensors over the slot; ``got`` is queued in :attr:`freed` when
        all of them are gone."""
        left = [len(arrays)]
        lock = threading.Lock()
        freed = self.freed

        def gone() -> None:  # (on whichever thread drops the last reference)
            with lock:
                left[0] -= 1
                last = left[0] == 0
            if last:
                freed.append(got)

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
