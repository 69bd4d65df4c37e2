"""The decoded-block arena: the blocks a reader holds, filled ahead of use.

A held block is a pair of arrays, its tokens and its document-start flags.
Without a node agent they are slices of the arena's own slots (one
contiguous array, reused without allocating) and the arena decodes into them;
with an agent they are read-only views of the agent's shared-memory file,
pinned while held. Either way the arena holds at most ``slots`` blocks, and
the reader tells it the order in which blocks will be needed next (the plan
is known in advance): the first of them are loaded on a thread pool ahead of
time, and room is made by letting go of the held block whose next use is
furthest away (Belady's rule). A window inside one block is copied out with
one slice.
"""

from __future__ import annotations

import os
import threading
import time
import weakref
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING

import numpy as np

from stoker.formats.tokens import TokenSource

if TYPE_CHECKING:
    from stoker.cache.client import AgentClient

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


#: Reader processes of the loader this process reads for, as the loader's worker pool
#: told this worker (:func:`reader_processes`); 1 in a process that reads alone.
_readers = 1


def reader_processes(n: int) -> None:
    """Called by a worker pool in each worker it starts: the loader runs ``n`` of them."""
    global _readers
    _readers = max(1, n)


def decoding_threads() -> int:
    """How many blocks a reader decodes at once by default: two, unless the reader
    processes of its loader (a stoker pool's or a torch DataLoader's workers) would then
    run more decoding threads than this process may use cores: one. (At
    ``num_workers=2`` on 2 cores, one a worker read about 10% faster than two.)"""
    n = _readers
    from torch.utils.data import get_worker_info

    info = get_worker_info()
    if info is not None:
        n = max(n, info.num_workers)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return 2 if 2 * n <= (cores or 1) else 1


def decode_threads(source: TokenSource, n: int) -> ThreadPoolExecutor:
    """A reader's ``n`` threads that read and decode blocks of ``source``, counted by its
    storage's observer while they exist."""
    pool = ThreadPoolExecutor(n, thread_name_prefix="stoker-io")
    observer = source.storage.observer
    observer.threads_opened(n)
    weakref.finalize(pool, observer.threads_closed, n)
    return pool


class BlockArena:
    def __init__(
        self,
        source: TokenSource,
        slots: int,
        doc_starts: bool = True,
        agent: AgentClient | None = None,
    ) -> None:
        m = source.manifest
        self.source = source
        self.bt = m.block_tokens
        self.slots = max(2, min(slots, m.num_blocks))
        self.tokens = np.zeros(self.slots * self.bt, dtype=m.np_dtype)
        self.doc_starts = doc_starts
        # True where a document starts, beside the tokens: a window's mask is a slice
        self.flags = np.zeros(self.slots * self.bt if doc_starts else 0, dtype=bool)
        # resident block -> slot, and -> (tokens, flags) arrays
        self._slot_of: dict[int, int] = {}
        self._views: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self.agent = agent
        self.dataset_id = m.dataset_id
        self._pinned: set[int] = set()  # held blocks pinned on the agent
        if agent is not None:
            agent.open(source.url, source.storage.storage_options, m.dataset_id)
        self._free = list(range(self.slots))
        self._loading: dict[int, Future[int]] = {}
        self._next_use: dict[int, int] = {}
        self._lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None
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
            self._views.pop(victim, None)
            slot = self._slot_of.pop(victim)
            pinned = victim in self._pinned
            self._pinned.discard(victim)
        if pinned and self.agent is not None:
            self.agent.release(self.dataset_id, [victim])
        return slot

    def _load_ahead(self, block: int, slot: int) -> int:
        """:meth:`_load` on a block thread, its time counted as the threads' busy time."""
        t = time.perf_counter()
        try:
            return self._load(block, slot)
        finally:
            self.source.storage.observer.thread_busy(time.perf_counter() - t)

    def _load(self, block: int, slot: int) -> int:
        pinned = False
        try:
            record = None
            if self.agent is not None:
                got = self.agent.get(self.dataset_id, block)
                if got.pinned:
                    from stoker.cache.layout import map_block

                    toks, starts = map_block(got.path, int(got.tokens), self.tokens.dtype)
                    view = (toks, self._flags_of(slot, len(toks), starts))
                    pinned = True
                else:
                    # inline: the agent had no room in shared memory; empty: no agent answered
                    record = got.record or None
            if not pinned:
                if record is not None:
                    toks, starts = self.source.decode(block, record)
                else:
                    toks, starts = self.source.block(block)
                base = slot * self.bt
                n = len(toks)
                self.tokens[base : base + n] = toks
                view = (self.tokens[base : base + n], self._flags_of(slot, n, starts))
        except BaseException:
            with self._lock:
                self._free.append(slot)
                self._loading.pop(block, None)
            raise
        with self._lock:
            self._slot_of[block] = slot
            self._views[block] = view
            if pinned:
                self._pinned.add(block)
            self._loading.pop(block, None)
        return slot

    def _flags_of(self, slot: int, n: int, starts: np.ndarray) -> np.ndarray:
        """Slot ``slot``'s document-start flags for a block of ``n`` tokens (set from its
        ``starts``; an empty array without document starts)."""
        if not self.doc_starts:
            return self.flags
        base = slot * self.bt
        flags = self.flags[base : base + n]
        flags[:] = False
        flags[starts] = True
        return flags

    def schedule(self, order: np.ndarray, next_use: np.ndarray, ahead: int) -> None:
        """Blocks in order of next use: prefetch up to ``ahead`` that are not resident.

        Prefetching stops at the first block for which no slot can be freed
        without evicting a block needed sooner (Belady's rule), so it never
        thrashes the arena.
        """
        self._next_use = dict(zip(order.tolist(), next_use.tolist()))
        if self.agent is not None:
            # a first schedule (``ahead`` short of the arena) plans only what it loads, so
            # that the agent prefetches nothing ahead of the first batch's blocks
            self.agent.plan(
                self.dataset_id, order[: 4 * self.slots if ahead >= self.slots else ahead].tolist()
            )
        pool = self._decoders()
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
                self._loading[b] = pool.submit(self._load_ahead, b, slot)
            started += 1

    def _decoders(self) -> ThreadPoolExecutor:
        """This arena's threads that read and decode blocks ahead of use (as many as its
        storage allows reads in flight), started on first use, stopped by :meth:`close`."""
        if self._pool is None:
            self._pool = decode_threads(self.source, self.source.storage.max_inflight)
        return self._pool

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
        views = self._views
        held = []
        for s in starts.tolist():  # plain Python: cheaper than numpy for a batch of rows
            block, offset = divmod(s, bt)
            view = views.get(block)
            if view is None or offset + length > bt:
                break
            held.append((view, offset))
        else:
            # the common case: every window inside one held block
            self.hits += len(held)
            for i, ((toks, flags), a) in enumerate(held):
                out[i] = toks[a : a + length]
                if mask is not None:
                    mask[i] = flags[a : a + length]
            return
        first = starts // bt
        last = (starts + length - 1) // bt
        ub = np.unique(np.concatenate([first, last]))
        if int((last - first).max()) > 1:  # windows longer than a block
            ub = np.unique(np.concatenate([np.arange(a, b + 1) for a, b in zip(first, last)]))
        self.require(ub)
        for i, (s, f, e) in enumerate(zip(starts.tolist(), first.tolist(), last.tolist())):
            pos = 0
            for b in range(f, e + 1):
                lo = max(s, b * bt) - b * bt  # offsets inside block b
                hi = min(s + length, (b + 1) * bt) - b * bt
                toks, flags = views[b]
                out[i, pos : pos + hi - lo] = toks[lo:hi]
                if mask is not None:
                    mask[i, pos : pos + hi - lo] = flags[lo:hi]
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
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False)  # idle now: its threads end
        with self._lock:
            pinned = sorted(self._pinned)
            self._pinned.clear()
            self._views.clear()
            self._slot_of.clear()
        if self.agent is not None:
            try:
                if pinned:
                    self.agent.release(self.dataset_id, pinned)
                # what this reader read itself while its agent started goes to the agent
                self.agent.hand_over(self.dataset_id)
                self.agent.flush_releases()  # sent now, not with a next get
            except Exception:
                pass  # the agent is gone: its pins went with it
