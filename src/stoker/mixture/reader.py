"""``MixReader``: a mixture's rows, each source's read by that source's own reader.

A rank's batch of a mixture holds a few samples of each source. Asking each source's
reader for its few every batch would pay each reader's fixed cost (its lock, its
check of the plan, its bookkeeping) once per source per batch; instead a source's
samples are read up to ``chunk`` at a time, in plan order, into a small buffer of
that source's rows (in the narrow dtypes it stores them in: the copy out converts),
and a batch copies its rows out of the buffers. A source's reader sees only its own
samples, planned ahead as that source's alone. Each read is timed: the seconds a
source's reader took to hand its rows (what the consumer waited on it) are the
process's per-source read figures (``stoker_loader_source_read_seconds``), by which
``stoker doctor`` names a source that stalls the job.
"""

from __future__ import annotations

import time

import numpy as np

from stoker.loader.batch import SAMPLE_ID, Layout
from stoker.loader.consumer import Reader
from stoker.mixture.stream import SOURCE_SHIFT, decode, source_epochs
from stoker.observe.registry import registry

SOURCE = "source"
#: Samples of a source read at once at most (fewer where that many rows would take
#: more than ``_BUFFER`` bytes): a read's fixed cost, about 6 us, is paid once per up to
#: this many samples instead of once per source per batch (with batches of 8 rows of
#: 2,049 tokens, a third of what a mixture's batch cost beyond one source's).
CHUNK = 64
_BUFFER = 1 << 20
_EMPTY = np.zeros(0, dtype=np.int64)
_KEY = (1 << SOURCE_SHIFT) - 1  # a mixture id's bits below the source: epoch and id


class _Ahead:
    """One source's reader, the keys it is planned with (each a sample id and the
    source's epoch it is of), and rows read of them but not yet handed out. A reader whose
    samples are random (``per_row_epochs``: augmented records) is told each row's epoch;
    it was opened for the mixture's."""

    def __init__(self, reader: Reader, layout: Layout, chunk: int, name: str) -> None:
        self.reader, self.layout, self.chunk, self.name = reader, layout, chunk, name
        self.epochs = bool(getattr(reader, "per_row_epochs", False))
        self.fields = [k for k in layout if k not in (SOURCE, SAMPLE_ID)]
        self.buf = self._allocate(chunk)
        self.held = np.zeros(chunk, dtype=np.int64)  # of buffer rows [lo, hi): their keys
        self.lo = self.hi = 0
        self.ids = _EMPTY  # the reader's plan: keys not read from it yet, from ``at`` on
        self.at = 0
        # rows a read fetches beyond the batch's need: none after a new plan (its first
        # batch waits only for its own rows), then doubling up to a chunk
        self.step = 0

    def _allocate(self, rows: int) -> dict[str, np.ndarray]:
        return {k: v for k, v in self.layout.allocate(rows).items() if k in self.fields}

    def plan(self, ids: np.ndarray) -> None:
        """The source's keys that come next; rows held that are still their head stay
        (those of them that begin it: the rest are let go)."""
        n = self.hi - self.lo
        if n:
            head = ids[:n]
            diff = np.flatnonzero(head != self.held[self.lo : self.lo + len(head)])
            keep = int(diff[0]) if len(diff) else len(head)
            if keep < n:
                self.hi = self.lo + keep
                n = keep
                self.step = 0
        self.ids, self.at = ids[n:], 0
        self.reader.plan(decode(self.ids)[1])

    def take(self, n: int) -> int:
        """Hand out the next ``n`` rows (reading the next ones first when fewer are held,
        up to a chunk as far as the plan goes): the buffer row of the first."""
        held = self.hi - self.lo
        if held < n:
            self._read(n, held)
        r = self.lo
        self.lo += n
        return r

    def _read(self, n: int, held: int) -> None:
        """Read enough that ``n`` rows are held; the ``held`` rows still held go to the
        front of the buffer (a larger one when a batch needs more rows than a chunk)."""
        grow = n > len(self.held)
        if grow or self.lo:
            buf = self._allocate(n) if grow else self.buf
            kept = np.zeros(n, dtype=np.int64) if grow else self.held
            for k, v in buf.items():
                v[:held] = self.buf[k][self.lo : self.hi]
            kept[:held] = self.held[self.lo : self.hi]
            self.buf, self.held = buf, kept
        self.lo, self.hi = 0, held
        m = min(len(self.held) - held, len(self.ids) - self.at, max(n - held, self.step))
        assert m >= n - held, "the mixture's reader reads only planned ids"
        self.step = min(self.chunk, 2 * m)
        ids = self.ids[self.at : self.at + m]
        start = time.perf_counter()
        rows = decode(ids)[1]
        out = {k: v[held : held + m] for k, v in self.buf.items()}
        if self.epochs:
            self.reader.fill(rows, out, epochs=source_epochs(ids))  # type: ignore[call-arg]
        else:
            self.reader.fill(rows, out)
        registry().source_read(self.name, time.perf_counter() - start, m)
        self.held[held : held + m] = ids
        self.at += m
        self.hi += m


class MixReader:
    """Rows of a mixture's samples: each source's ids go to that source's reader, planned
    in the order they come, and are read ahead up to ``chunk`` at a time."""

    def __init__(
        self,
        readers: list[Reader],
        layouts: list[Layout],
        layout: Layout,
        horizon: int,
        chunk: int = CHUNK,
        names: list[str] | None = None,
    ) -> None:
        self.layout, self.horizon = layout, horizon
        names = names if names is not None else [str(i) for i in range(len(readers))]
        self._ahead = [
            _Ahead(r, lay, max(1, min(chunk, _BUFFER // lay.row_bytes())), name)
            for r, lay, name in zip(readers, layouts, names, strict=True)
        ]
        self._planned = self._src = _EMPTY  # mixture ids planned (and their sources)
        self._at = 0  # the next fill's index in them

    def plan(self, upcoming: np.ndarray) -> None:
        upcoming = np.asarray(upcoming, dtype=np.int64)
        src, keys = upcoming >> SOURCE_SHIFT, upcoming & _KEY
        for i, a in enumerate(self._ahead):
            a.plan(keys[src == i])
        self._planned, self._src, self._at = upcoming, src, 0

    def fill(self, ids: np.ndarray, out: dict[str, np.ndarray]) -> None:
        n = len(ids)
        ids = np.asarray(ids, dtype=np.int64)
        at = self._at
        if self._planned[at : at + n].tobytes() != ids.tobytes():
            self.plan(ids)  # not what was planned: these, and nothing known after them
            at = 0
        self._at = at + n
        src = self._src[at : at + n]
        out[SOURCE][...] = src
        if not n:
            return
        # a rank's step holds its sources' samples in runs: each run copied from its
        # source's buffer into its rows (once a batch: kept cheap)
        s = src.tolist()
        a = 0
        for b in range(1, n + 1):
            if b < n and s[b] == s[a]:
                continue
            ahead = self._ahead[s[a]]
            r = ahead.take(b - a)
            for k, v in ahead.buf.items():
                out[k][a:b] = v[r : r + b - a]
            a = b

    @property
    def failed(self) -> bool:
        """Whether a source's reader holds an error (see ``SampleReader.failed``)."""
        return any(getattr(a.reader, "failed", False) for a in self._ahead)

    def close(self) -> None:
        for a in self._ahead:
            a.reader.close()
