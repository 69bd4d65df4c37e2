"""``RecordReader``: the rows of planned sample ids, decoded and augmented.

A records block holds a stretch of rows; the reader knows the samples its consumer
takes next (its plan), fetches the blocks they lie in ahead of their first use (one
range request each, on I/O threads, as Arrow record batches), keeps a block while the
plan still needs it, and makes each batch's samples on decode threads (Pillow lets go
of the interpreter lock while it decodes and resizes, so a batch's images decode on
every core the threads are given). What a sample becomes is the dataset's ``make``: a
function of its row, its epoch and its id alone.
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

#: Makes one sample's fields from its row: ``(row, epoch, sample id, out, i)`` writes
#: row ``i`` of every field of ``out``.
Make = Callable[[dict[str, Any], int, int, dict[str, np.ndarray], int], None]


class RecordReader:
    """Rows of a records dataset by sample id (its row number), made by ``make``.

    ``columns``: the columns ``make`` reads; ``horizon``: the samples it asks to be
    planned ahead; ``ahead``: blocks fetched ahead of the next sample's; ``decoding``:
    samples made at once."""

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
    ) -> None:
        self.source, self.layout, self.make = source, layout, make
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
        self._last: dict[int, int] = {}  # block -> its last use in the plan
        self._pos = 0
        self._closed = False

    # -- the plan -----------------------------------------------------------------------
    def plan(self, upcoming: np.ndarray) -> None:
        ids = np.asarray(upcoming, dtype=np.int64)
        blocks = self.source.block_of(ids)  # (IndexError for an id outside the dataset)
        self._seq, self._bseq, self._pos = ids, blocks, 0
        first = np.unique(blocks, return_index=True)[1]
        self._order = blocks[np.sort(first)]
        rev = len(blocks) - 1 - np.unique(blocks[::-1], return_index=True)[1]
        self._last = dict(zip(np.unique(blocks).tolist(), rev.tolist(), strict=True))
        for b in [b for b in self._blocks if b not in self._last]:
            self._blocks.pop(b).cancel()
        self._fetch_ahead()

    def _fetch_ahead(self) -> None:
        """Start fetching the next ``ahead`` blocks of the plan not fetched yet."""
        if self._pos >= len(self._bseq):
            return  # the plan is read: nothing ahead (its first blocks are not fetched again)
        now = self._bseq[self._pos]
        at = int(np.flatnonzero(self._order == now)[0])
        for b in self._order[at : at + self._ahead].tolist():
            if b not in self._blocks:
                self._blocks[b] = self._pool().submit(self.source.block, b)

    def _pool(self) -> ThreadPoolExecutor:
        if self._io is None:
            self._io = ThreadPoolExecutor(
                max(2, min(self._ahead, self.source.storage.max_inflight)),
                thread_name_prefix="stoker-records-io",
            )
        return self._io

    # -- taking -------------------------------------------------------------------------
    def fill(self, ids: np.ndarray, out: dict[str, np.ndarray]) -> None:
        if self._closed:
            raise RuntimeError("this RecordReader is closed")
        ids = np.asarray(ids, dtype=np.int64)
        n, p = len(ids), self._pos
        if self._seq[p : p + n].tobytes() != ids.tobytes():
            self.plan(ids)  # not what was planned: these, and nothing known after them
            p = 0
        blocks = self._bseq[p : p + n]
        for b in np.unique(blocks).tolist():
            if b not in self._blocks:
                self._blocks[b] = self._pool().submit(self.source.block, b)
        batches = {b: self._blocks[b].result() for b in np.unique(blocks).tolist()}
        local = ids - self.source.first_rows[blocks]
        columns = {b: {c: batch.column(c) for c in self.columns} for b, batch in batches.items()}
        epoch = self.epoch

        def one(i: int) -> None:
            b, r = int(blocks[i]), int(local[i])
            row = {c: col[r].as_py() for c, col in columns[b].items()}
            try:
                self.make(row, epoch, int(ids[i]), out, i)
            except Exception as exc:
                ref = self.source.manifest.block_file(b)
                where = f"{self.source.storage.url_of(ref.path)}: row {int(ids[i])} (block {b})"
                if isinstance(exc, DatasetError):
                    raise type(exc)(f"{where}: {exc}") from exc
                note = getattr(exc, "add_note", None)  # (Python 3.11 and later)
                if note is not None:  # a user's transform failed: its own error, named
                    note(f"(making {where})")
                raise

        if n > 1 and self._decoding > 1:
            for f in [self._workers().submit(one, i) for i in range(n)]:
                f.result()
        else:
            for i in range(n):
                one(i)
        self._pos = p + n
        for b in [b for b, last in self._last.items() if last < self._pos and b in self._blocks]:
            del self._blocks[b]  # the plan needs it no more
        self._fetch_ahead()

    def _workers(self) -> ThreadPoolExecutor:
        if self._work is None:
            self._work = ThreadPoolExecutor(self._decoding, thread_name_prefix="stoker-decode")
        return self._work

    def close(self) -> None:
        if os.getpid() != self._pid:
            return  # a forked child closing its parent's reader: the threads are the parent's
        self._closed = True
        for f in self._blocks.values():
            f.cancel()
        self._blocks.clear()
        for pool in (self._io, self._work):
            if pool is not None:
                pool.shutdown(wait=True, cancel_futures=True)
        self._io = self._work = None
