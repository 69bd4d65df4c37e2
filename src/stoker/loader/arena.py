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

NEVER = np.iinfo(np.int64).max


def first_uses(blocks: np.ndarray, table: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Distinct ``blocks`` in order of first appearance, and the index of each first appearance.

    What ``np.unique(return_index=True)`` sorted by index gives, without a sort:
    a minimum per block into ``table`` (all ``NEVER``, longer than the largest
    block number), which is left as it was found.
    """
    pos = np.arange(len(blocks))
    np.minimum.at(table, blocks, pos)
    is_first = table[blocks] == pos
    order = blocks[is_first]
    table[order] = NEVER
    return order, pos[is_first]


class BlockArena:
    def __init__(self, source: TokenSource, slots: int, doc_starts: bool = True) -> None:
        m = source.manifest
        self.source = source
        self.bt = m.block_tokens
        self.slots = max(2, min(slots, m.num_blocks))
        self.tokens = np.zeros(self.slots * self.bt, dtype=m.np_dtype)
        self.doc_starts = doc_starts
        # True where a document starts, beside the tokens: a window's mask is a slice
        self.flags = np.zeros(self.slots * self.bt if doc_starts else 0, dtype=bool)
        # resident block -> slot
        self._slot_of: dict[int, int] = {}
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
                use = self._next_use.get(block, NEVER)
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
            if self.doc_starts:
                flags = self.flags[base : base + self.bt]
                flags[:] = False
                flags[starts] = True
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
        """Blocks in order of next use: prefetch up to ``ahead`` that are not resident.

        Prefetching stops at the first block for which no slot can be freed
        without evicting a block needed sooner (Belady's rule), so it never
        thrashes the arena.
        """
        self._next_use = dict(zip(order.tolist(), next_use.tolist()))
        pool = self.source.storage.pool
        started = 0
        for b, use in zip(order.tolist(), next_use.tolist()):
            if started >= ahead:
                return
            with self._lock:
                if b in self._slot_of or b in self._loading:
                    continue
            slot = self._claim(set(), before=use)
            if slot is None:
                return
            with self._lock:
                self._loading[b] = pool.submit(self._load, b, slot)
            started += 1

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
        ``mask`` (bool, like ``out``) receives the document-start flags.
        """
        bt = self.bt
        slot_of = self._slot_of
        tokens, flags = self.tokens, self.flags
        bases = []
        for s in starts.tolist():  # plain Python: cheaper than numpy for a batch of rows
            block, offset = divmod(s, bt)
            slot = slot_of.get(block)
            if slot is None or offset + length > bt:
                break
            bases.append(slot * bt + offset)
        else:
            # the common case: every window inside one resident block
            self.hits += len(bases)
            for i, a in enumerate(bases):
                out[i] = tokens[a : a + length]
                if mask is not None:
                    mask[i] = flags[a : a + length]
            return
        first = starts // bt
        last = (starts + length - 1) // bt
        ub = np.unique(np.concatenate([first, last]))
        if int((last - first).max()) > 1:  # windows longer than a block
            ub = np.unique(np.concatenate([np.arange(a, b + 1) for a, b in zip(first, last)]))
        slot_of = dict(zip(ub.tolist(), self.require(ub).tolist()))
        for i, (s, f, e) in enumerate(zip(starts.tolist(), first.tolist(), last.tolist())):
            pos = 0
            for b in range(f, e + 1):
                lo = max(s, b * bt) - b * bt  # offsets inside block b
                hi = min(s + length, (b + 1) * bt) - b * bt
                a = slot_of[b] * bt
                out[i, pos : pos + hi - lo] = self.tokens[a + lo : a + hi]
                if mask is not None:
                    mask[i, pos : pos + hi - lo] = self.flags[a + lo : a + hi]
                pos += hi - lo

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
