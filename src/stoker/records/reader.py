"""``RecordReader``: the rows of planned sample ids, decoded and augmented.

A records block holds a stretch of rows; the reader knows the samples its consumer
takes next (its plan), fetches the blocks they lie in ahead of their first use (one
range request each, on I/O threads, as Arrow record batches), keeps a block while the
plan still needs it, and makes each batch's samples on decode threads (Pillow lets go
of the interpreter lock while it decodes and resizes, so a batch's images decode on
every core the threads are given). What a sample becomes is the dataset's ``make``: a
function of its row, its epoch and its id alone.

Through a node agent (``agent``, with a :class:`~stoker.records.held.View`) a block
comes from the agent's shared memory instead: its stored bytes (one fetch per node)
or its images decoded (one decode per node), mapped read-only and pinned while the
plan needs it; the reader sends the agent its plan, so the agent loads blocks ahead
and keeps what is needed soonest. A block the agent has no room for comes inline, and
without an answering agent the reader reads storage itself: the samples are the same.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np

from stoker.errors import DatasetError
from stoker.formats.records import RecordSource
from stoker.loader.batch import Layout
from stoker.records.held import View, held_rows, held_schema, map_file, read_held

#: Makes one sample's fields from its row: ``(row, epoch, sample id, out, i, draws)``
#: writes row ``i`` of every field of ``out``; ``draws`` is the sample's row of what
#: the reader's ``draws`` gave for the batch (None without one).
Make = Callable[[dict[str, Any], int, int, dict[str, np.ndarray], int, Any], None]
#: A batch's random draws, made at once: ``(sample ids, their epochs)`` to one item a
#: sample (the augmentation's uniforms: one array operation a batch, not one a sample).
Draws = Callable[[np.ndarray, np.ndarray], list[Any]]
#: A block's row ``r`` as a dict of its columns.
Rows = Callable[[int], dict[str, Any]]


class _Block:
    """A fetched block: its rows, and whether the agent holds a pin on it for us."""

    __slots__ = ("pinned", "rows")

    def __init__(self, rows: Rows, pinned: bool = False) -> None:
        self.rows, self.pinned = rows, pinned


def stored_rows(batch: Any, columns: list[str]) -> Rows:
    """Row ``r`` of a stored block: ``columns`` as Python values."""
    cols = {c: batch.column(c) for c in columns}
    return lambda r: {c: col[r].as_py() for c, col in cols.items()}


#: Bytes of rows a reader keeps alone at most (:meth:`RecordReader._keep_later`); past
#: it, a block is fetched again for its later rows.
KEPT_BYTES = 64 << 20


def _size(row: dict[str, Any]) -> int:
    return sum(len(v) if isinstance(v, (bytes, str)) else 8 for v in row.values())


def thinning(blocks: np.ndarray, gap: int | None) -> tuple[dict[int, int], np.ndarray]:
    """Where a plan lets go of each block, and which of its uses come after that (pure).

    ``blocks``: the block of each planned sample, in plan order. A block is let go after
    its last use before its uses thin out (the next one more than ``gap`` positions
    later; with ``gap`` None, after its last use): ``{block: that position}``, and per
    planned sample whether it is one of the later uses, whose rows are kept alone when
    the block goes (the spread order deals a unit's last rows out a few a turn over many
    turns: holding the block for them, or fetching it again, costs a block for a row)."""
    n = len(blocks)
    if not n:
        return {}, np.zeros(0, dtype=bool)
    order = np.argsort(blocks, kind="stable")  # each block's uses together, in plan order
    sb = blocks[order]
    new = np.ones(n, dtype=bool)
    new[1:] = sb[1:] != sb[:-1]
    starts = np.flatnonzero(new)
    cut = np.zeros(n, dtype=bool)
    cut[np.r_[starts[1:], n] - 1] = True  # a block's last use
    if gap is not None:
        cut[:-1] |= (order[1:] - order[:-1]) > gap
    cuts = np.flatnonzero(cut)
    first_cut = cuts[np.searchsorted(cuts, starts)]  # each block's first cut
    group = np.cumsum(new) - 1
    later = np.zeros(n, dtype=bool)
    later[order] = np.arange(n) > first_cut[group]
    return dict(zip(sb[starts].tolist(), order[first_cut].tolist(), strict=True)), later


class RecordReader:
    """Rows of a records dataset by sample id (its row number), made by ``make``.

    ``columns``: the columns ``make`` reads; ``horizon``: the samples it asks to be
    planned ahead; ``ahead``: blocks fetched ahead of the next sample's; ``decoding``:
    samples made at once; ``draws``: each batch's random draws, handed to ``make``;
    ``gap``: a block is let go once its next use is further than this, the rows of its
    later uses kept alone (:func:`thinning`; None: a block is held to its last use, and
    fetched again for a use the plan had not reached when it was let go)."""

    def __init__(
        self,
        source: RecordSource,
        layout: Layout,
        make: Make,
        columns: list[str],
        epoch: int,
        *,
        horizon: int,
        ahead: int = 4,
        decoding: int = 2,
        agent: Any = None,
        view: View | None = None,
        draws: Draws | None = None,
        gap: int | None = None,
    ) -> None:
        self.source, self.layout, self.make, self.draws = source, layout, make, draws
        # (a row of the agent's memory is a view of it, gone with the block's pin)
        self._gap = None if agent is not None else gap
        self.columns, self.epoch = columns, epoch
        self.horizon = max(1, horizon)
        self._ahead = max(1, ahead)
        self._decoding = max(1, decoding)
        self._pid = os.getpid()
        self._io: ThreadPoolExecutor | None = None
        self._work: ThreadPoolExecutor | None = None
        self._blocks: dict[int, Future[Any]] = {}  # fetched or being fetched
        self._seq = np.zeros(0, dtype=np.int64)  # the plan: sample ids
        self._bseq = np.zeros(0, dtype=np.int64)  # their blocks
        self._order = np.zeros(0, dtype=np.int64)  # the plan's blocks by first use
        self._first_use = np.zeros(0, dtype=np.int64)  # (that use's place in the plan)
        self._last: dict[int, int] = {}  # block -> where the plan lets go of it
        self._later = np.zeros(0, dtype=bool)  # per planned sample: a use after that
        self._alone = np.zeros(0, dtype=bool)  # per planned sample: its row is kept alone
        self._kept: dict[int, dict[str, Any]] = {}  # sample id -> its row, kept alone
        self._kept_to: dict[int, int] = {}  # sample id -> its last use in the plan
        self._kept_bytes = 0  # (their values' bytes, about)
        self._pos = 0
        self._closed = False
        self.agent = agent
        self.view = view or View()
        self._key = ""
        if agent is not None:
            m = source.manifest
            self._key = agent.open(
                source.url, source.storage.storage_options, m.dataset_id, self.view
            )

    # -- the plan -----------------------------------------------------------------------
    def plan(self, upcoming: np.ndarray) -> None:
        ids = np.asarray(upcoming, dtype=np.int64)
        blocks = self.source.block_of(ids)  # (IndexError for an id outside the dataset)
        self._seq, self._bseq, self._pos = ids, blocks, 0
        alone = np.zeros(len(ids), dtype=bool)
        if self._kept:  # rows kept alone that this plan uses again, to their last use
            kept = np.fromiter(self._kept, dtype=np.int64, count=len(self._kept))
            alone = np.isin(ids, kept)
            at = np.flatnonzero(alone)
            last = dict(zip(ids[at].tolist(), at.tolist(), strict=True))  # (the last wins)
            self._kept = {i: r for i, r in self._kept.items() if i in last}
            self._kept_to = {i: last[i] for i in self._kept}
            self._kept_bytes = sum(_size(r) for r in self._kept.values())
        self._alone = alone
        rest = np.flatnonzero(~alone)
        last_of, later = thinning(blocks[rest], self._gap)
        self._last = {b: int(rest[k]) for b, k in last_of.items()}
        self._later = np.zeros(len(ids), dtype=bool)
        self._later[rest] = later
        first = rest[np.sort(np.unique(blocks[rest], return_index=True)[1])]
        self._order, self._first_use = blocks[first], first  # blocks by first use
        for b in [b for b in self._blocks if b not in self._last]:
            self._drop(b)
        if self.agent is not None:
            self.agent.plan(self._key, self._order.tolist())
        self._fetch_ahead()

    def _fetch_ahead(self) -> None:
        """Start fetching the next ``ahead`` blocks the plan comes to (by their first use
        from here on: a block first used earlier is held, or the plan is done with it, or
        its later rows are kept alone)."""
        at = int(np.searchsorted(self._first_use, self._pos))
        for b in self._order[at : at + self._ahead].tolist():
            if b not in self._blocks:
                self._blocks[b] = self._pool().submit(self._fetch, b)

    def _fetch(self, b: int) -> _Block:
        """Block ``b``: through the agent when there is one, else from storage."""
        if self.agent is not None:
            got = self.agent.get(self._key, b)
            if got.path:
                try:
                    return _Block(self._mapped(b, got.path), pinned=got.pinned)
                except BaseException:
                    if got.pinned:
                        self.agent.release(self._key, [b])
                    raise
            if got.record:  # no room in the agent's memory: its stored bytes, inline
                return _Block(stored_rows(self.source.decode(b, got.record), self.columns))
        return _Block(stored_rows(self.source.block(b), self.columns))

    def _mapped(self, b: int, path: str) -> Rows:
        buffer = map_file(path)
        if self.view.hold == "images":
            ref = self.source.manifest.block_file(b)
            where = f"{self.source.storage.url_of(ref.path)}: block {b}"
            rows = int(self.source.index[b]["rows"])
            schema = held_schema(self.source.schema, self.view.columns)
            return held_rows(read_held(buffer, rows, schema, where), self.view.columns)
        return stored_rows(self.source.decode(b, buffer), self.columns)

    def _drop(self, b: int) -> None:
        """Let go of block ``b`` (its pin on the agent too, once its fetch is done)."""
        f = self._blocks.pop(b)
        if f.cancel() or self.agent is None:
            return
        agent, key = self.agent, self._key

        def release(done: Future[Any]) -> None:
            if not done.cancelled() and done.exception() is None and done.result().pinned:
                agent.release(key, [b])

        f.add_done_callback(release)

    def _pool(self) -> ThreadPoolExecutor:
        if self._io is None:
            self._io = ThreadPoolExecutor(
                max(2, min(self._ahead, self.source.storage.max_inflight)),
                thread_name_prefix="stoker-records-io",
            )
        return self._io

    # -- taking -------------------------------------------------------------------------
    #: a mixture's reader tells it each row's epoch (the source's own: its samples are
    #: random, drawn from the epoch and the id)
    per_row_epochs = True

    def fill(
        self, ids: np.ndarray, out: dict[str, np.ndarray], epochs: np.ndarray | None = None
    ) -> None:
        """The rows of ``ids`` made into ``out``, each of the reader's epoch, or of its
        own in ``epochs`` (a mixture's source: the source's epoch)."""
        if self._closed:
            raise RuntimeError("this RecordReader is closed")
        ids = np.asarray(ids, dtype=np.int64)
        n, p = len(ids), self._pos
        if self._seq[p : p + n].tobytes() != ids.tobytes():
            self.plan(ids)  # not what was planned: these, and nothing known after them
            p = 0
        blocks = self._bseq[p : p + n]
        alone = self._alone[p : p + n]
        needed = np.unique(blocks[~alone]).tolist()
        for b in needed:
            if b not in self._blocks:
                self._blocks[b] = self._pool().submit(self._fetch, b)
        got = {b: self._blocks[b].result().rows for b in needed}
        kept = self._kept
        local = ids - self.source.first_rows[blocks]
        rows = [
            kept[i] if a else got[b](r)
            for i, a, b, r in zip(ids.tolist(), alone.tolist(), blocks.tolist(), local.tolist(),
                                  strict=True)
        ]  # fmt: skip
        each = None if epochs is None else np.asarray(epochs, dtype=np.int64).tolist()
        epoch = self.epoch
        drawn: list[Any] = [None] * n
        if self.draws is not None and n:
            drawn = self.draws(ids, np.full(n, epoch) if epochs is None else np.asarray(epochs))

        def one(i: int) -> None:
            b = int(blocks[i])
            try:
                e = epoch if each is None else each[i]
                self.make(rows[i], e, int(ids[i]), out, i, drawn[i])
            except Exception as exc:
                where = self.source.where(int(ids[i]), b)
                if isinstance(exc, DatasetError):
                    raise type(exc)(f"{where}: {exc}") from exc
                note = getattr(exc, "add_note", None)  # (Python 3.11 and later)
                if note is not None:  # a user's transform failed: its own error, named
                    note(f"(making {where})")
                raise

        k = min(n, self._decoding)
        if k > 1:
            # one task a thread, every k-th row each (a task a row cost the threads a
            # hand-off and a wake-up an image); the error raised is the first row's that
            # failed, as decoding row by row would raise: each thread stops at its first
            failed: list[tuple[int, BaseException]] = []

            def every(j: int) -> None:
                for i in range(j, n, k):
                    try:
                        one(i)
                    except BaseException as exc:
                        failed.append((i, exc))
                        return

            for f in [self._workers().submit(every, j) for j in range(k)]:
                f.result()
            if failed:
                raise min(failed, key=lambda x: x[0])[1]
        else:
            for i in range(n):
                one(i)
        self._pos = p + n
        for i in ids[alone].tolist():
            if self._kept_to.get(i, -1) < self._pos and i in kept:
                self._kept_bytes -= _size(kept.pop(i))
                self._kept_to.pop(i, None)
        for b in [b for b, last in self._last.items() if last < self._pos and b in self._blocks]:
            if self._keep_later(b):
                self._drop(b)  # the plan needs it no more (but for rows kept alone)
        self._fetch_ahead()

    def _keep_later(self, b: int) -> bool:
        """Before block ``b`` goes: the rows of its later uses in the plan, kept alone;
        False (the block held to its last use) when they are past :data:`KEPT_BYTES`."""
        at = self._pos + np.flatnonzero(
            (self._bseq[self._pos :] == b) & self._later[self._pos :] & ~self._alone[self._pos :]
        )
        if not len(at):
            return True
        if self._kept_bytes >= KEPT_BYTES:
            self._last[b] = int(at[-1])
            return False
        rows = self._blocks[b].result().rows
        first = int(self.source.first_rows[b])
        for k, i in zip(at.tolist(), self._seq[at].tolist(), strict=True):
            if i not in self._kept:
                row = self._kept[i] = rows(i - first)
                self._kept_bytes += _size(row)
            self._kept_to[i] = max(k, self._kept_to.get(i, -1))
        self._alone[at] = True
        return True

    def _workers(self) -> ThreadPoolExecutor:
        if self._work is None:
            self._work = ThreadPoolExecutor(self._decoding, thread_name_prefix="stoker-decode")
        return self._work

    def close(self) -> None:
        if os.getpid() != self._pid:
            return  # a forked child closing its parent's reader: the threads are the parent's
        self._closed = True
        self._kept.clear()
        self._kept_bytes = 0
        for b in list(self._blocks):
            self._drop(b)
        for pool in (self._io, self._work):
            if pool is not None:
                pool.shutdown(wait=True, cancel_futures=True)
        self._io = self._work = None
        if self.agent is not None:
            try:
                self.agent.hand_over(self._key)  # what it read itself while the agent started
                self.agent.flush_releases()
            except Exception:  # the agent is gone: its pins went with it
                pass
