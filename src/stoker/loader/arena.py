"""The decoded-block arena: fixed slots of decoded tokens, filled ahead of use.

Blocks are decoded into slots of one contiguous array, so a whole batch is
gathered with one fancy-index (no per-sample Python work), and slots are
reused without allocating. The reader tells the arena the order in which
blocks will be needed next (the plan is known in advance): the first of them
are fetched on a thread pool ahead of time, and a slot is freed by evicting
the resident block whose next use is furthest away (Belady's rule).
"""

from __future__ import annotations

import threading
from concurrent.futures import Future

import numpy as np

from stoker.formats.tokens import TokenSource

_NEVER = 1 << 62


class BlockArena:
    def __init__(self, source: TokenSource, slots: int, doc_starts: bool = True) -> None:
        m = source.manifest
        self.source = source
        self.bt = m.block_tokens
        self.slots = max(2, min(slots, m.num_blocks))
        self.tokens = np.zeros(self.slots * self.bt, dtype=m.np_dtype)
        self.doc_starts = doc_starts
        # per slot: sorted offsets of the documents that start in its block
        self._bounds: list[np.ndarray] = [np.zeros(0, dtype=np.int64)] * self.slots
        self._slot_of: dict[int, int] = {}  # resident block -> slot
        self._free = list(range(self.slots))
        self._loading: dict[int, Future[int]] = {}
        self._next_use: dict[int, int] = {}
        self._lock = threading.Lock()
        self.hits = self.loads = self.evictions = 0

    def _claim(self, keep: set[int], before: int = -1) -> int | None:
        """A free slot, evicting the block used furthest ahead (not in ``keep``).

        Returns None when every candidate is needed no later than ``before``.
        """
        with self._lock:
            if self._free:
                return self._free.pop()
            victim, furthest = None, -1
            for block in self._slot_of:
                if block in keep:
                    continue
                use = self._next_use.get(block, _NEVER)
                if use > furthest:
                    victim, furthest = block, use
            if victim is None or furthest <= before:
                return None
            self.evictions += 1
            return self._slot_of.pop(victim)

    def _load(self, block: int, slot: int) -> int:
        try:
            toks, starts = self.source.block(block)
            base = slot * self.bt
            self.tokens[base : base + len(toks)] = toks
            self._bounds[slot] = starts.astype(np.int64)
        except BaseException:
            with self._lock:
                self._free.append(slot)
                self._loading.pop(block, None)
            raise
        with self._lock:
            self._slot_of[block] = slot
            self._loading.pop(block, None)
        return slot

    def schedule(self, order: np.ndarray, next_use: np.ndarray, ahead: int) -> None:
        """Blocks in order of next use; prefetch up to ``ahead`` of them."""
        self._next_use = dict(zip(order.tolist(), next_use.tolist()))
        pool = self.source.storage.pool
        for b, use in zip(order[:ahead].tolist(), next_use[:ahead].tolist()):
            with self._lock:
                if b in self._slot_of or b in self._loading:
                    continue
            slot = self._claim(set(), before=use)
            if slot is None:
                return
            with self._lock:
                self._loading[b] = pool.submit(self._load, b, slot)

    def require(self, blocks: np.ndarray) -> np.ndarray:
        """Slots of ``blocks`` (unique), loading what is missing."""
        keep = set(blocks.tolist())
        out = np.empty(len(blocks), dtype=np.int64)
        for i, b in enumerate(blocks.tolist()):
            with self._lock:
                slot = self._slot_of.get(b)
                fut = self._loading.get(b)
            if slot is not None:
                self.hits += 1
            else:
                self.loads += 1
                if fut is not None:
                    slot = fut.result()
                else:
                    free = self._claim(keep)
                    while free is None and self._loading:
                        self._wait_any()
                        free = self._claim(keep)
                    if free is None:
                        raise RuntimeError(
                            f"decoded-block arena of {self.slots} slots cannot hold the "
                            f"{len(blocks)} blocks one read needs; raise arena_blocks"
                        )
                    slot = self._load(b, free)
            out[i] = slot
        return out

    def _wait_any(self) -> None:
        from concurrent.futures import FIRST_COMPLETED, wait

        with self._lock:
            pending = list(self._loading.values())
        if pending:
            wait(pending, return_when=FIRST_COMPLETED)
            for fut in pending:
                if fut.done():
                    fut.result()  # surface a failed load

    def windows(
        self, starts: np.ndarray, length: int, out: np.ndarray, mask: np.ndarray | None
    ) -> None:
        """Copy tokens ``[s, s + length)`` for each ``s`` in ``starts`` into rows of ``out``.

        ``out`` may be wider than the stored dtype (int64); the copy widens.
        """
        bt = self.bt
        first = starts // bt
        last = (starts + length - 1) // bt
        ub = np.unique(np.concatenate([first, last]))
        if len(ub) and int((last - first).max()) > 1:  # windows longer than a block
            ub = np.unique(np.concatenate([np.arange(a, b + 1) for a, b in zip(first, last)]))
        slots = self.require(ub)
        slot_of = dict(zip(ub.tolist(), slots.tolist()))
        tokens = self.tokens
        for i, (s, f, e) in enumerate(zip(starts.tolist(), first.tolist(), last.tolist())):
            pos = 0
            for b in range(f, e + 1):
                lo = max(s, b * bt) - b * bt  # offsets inside block b
                hi = min(s + length, (b + 1) * bt) - b * bt
                a = slot_of[b] * bt
                out[i, pos : pos + hi - lo] = tokens[a + lo : a + hi]
                pos += hi - lo
        if mask is not None:
            self._mask(starts, length, ub, slots, mask)

    def _mask(
        self,
        starts: np.ndarray,
        length: int,
        blocks: np.ndarray,
        slots: np.ndarray,
        mask: np.ndarray,
    ) -> None:
        """Document-start flags of every window, with a few vectorised searches."""
        mask[:] = False
        # absolute positions of the document starts in the (sorted) blocks the windows use
        docs = np.concatenate(
            [self._bounds[slot] + b * self.bt for b, slot in zip(blocks.tolist(), slots.tolist())]
        )
        if not len(docs):
            return
        lo = docs.searchsorted(starts)
        hi = docs.searchsorted(starts + length)
        counts = hi - lo
        total = int(counts.sum())
        if not total:
            return
        rows = np.repeat(np.arange(len(starts)), counts)
        # the k-th start of a row is docs[lo[row] + k]
        k = np.arange(total) - np.repeat(np.cumsum(counts) - counts, counts)
        mask[rows, docs[lo[rows] + k] - starts[rows]] = True

    def close(self) -> None:
        for fut in list(self._loading.values()):
            fut.cancel()
        for fut in list(self._loading.values()):
            if not fut.cancelled():
                try:
                    fut.result()
                except BaseException:
                    pass
        self._loading.clear()
