"""The sample-resident reader: it holds decoded samples, not decoded blocks.

A :class:`SampleReader` knows the samples its consumer takes next, in order (its
plan). It decodes each stored block for the samples of the plan that need it within
``horizon`` of the block's first use, copies their tokens (and document-start flags)
into rows of its slab, and lets the block go. What it holds is the
samples decoded but not yet taken, plus the few blocks its threads have in hand:
with ``order="spread"`` (:class:`stoker.plan.SpreadOrder`) about ``spread + 1`` units
of samples, whatever the size of the dataset.

A *job* is one block to decode and the parts of samples it fills (the tokens of a
sample that lie in that block; a sample that crosses a block's end has a part in each
block). Jobs are cut from the plan, vectorised, each time the plan changes; they run
on the reader's decode threads in order of first use, at most ``inflight`` at a time,
and one is admitted only when the slab has free rows for the samples it starts, except
the job the next batch needs, which always is (the slab holds as many rows as a plan
has samples, so that never fails; rows are reused last-freed first, so only about the
most ever held are touched, and only those take memory). A job of many samples (a
small source's block, planned over several epochs) publishes its samples in pieces as
it copies them, so the next batch waits for its own only.
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import TYPE_CHECKING

import numpy as np
import torch

from stoker.formats.tokens import TokenSource
from stoker.loader.arena import decode_threads, decoding_threads
from stoker.loader.batch import Field, Layout
from stoker.loader.jobs import Jobs, cut

if TYPE_CHECKING:
    from stoker.cache.client import AgentClient


class SampleReader:
    """Turns the planned sample ids into token windows through a slab of decoded samples.

    ``horizon``: how far past a block's first use its decode also fills the samples
    that need it (further ones have the block decoded again); the reader asks to be
    planned twice as far ahead. ``ahead``: how many samples ahead of the next one a
    block is read and decoded (default ``horizon // 8``; four times that from a
    network without an agent); what is filled early is held early, so this is memory.
    ``gap``: a sample that ends in a block further than this from the block's other
    uses is a job of its own. Blocks are fetched as many at a time as the storage
    allows (from a network; from local files by the decoding threads themselves), but
    only ``decoding`` (default: two, one when the loader's reader processes would
    outnumber the cores two to one) are decoded and copied at once (each holds a decoded block
    meanwhile, and each thread keeps what its allocations leave, about 3 MiB). A job
    of a whole 1 MiB block costs about 2 ms, nearly all of it the zstd decode (which
    lets go of the interpreter lock; the copy into rows, one call, holds it about
    50 us); a head about 0.45 ms (the record read again, its checksum, a streamed
    decode), none when the block's first tokens were kept.
    """

    _getpid = staticmethod(os.getpid)  # (held here: a module's globals go at shutdown)

    def __init__(
        self,
        source: TokenSource,
        seq_len: int,
        doc_starts: bool,
        horizon: int,
        agent: AgentClient | None = None,
        ahead: int | None = None,
        gap: int | None = None,
        decoding: int | None = None,
    ) -> None:
        m = source.manifest
        if seq_len + 1 > m.block_tokens:
            raise ValueError(
                f"a sample of {seq_len + 1} tokens is longer than a block ({m.block_tokens})"
            )
        self.source = source
        self.L = seq_len
        self._num_samples = (m.num_tokens - 1) // seq_len
        self.width = seq_len + 1
        self.bt = m.block_tokens
        self.reach = max(1, horizon)
        # planned this far ahead, a job's block is never cut short by the plan's end: a
        # job starts ``ahead`` of its first use and fills up to ``reach`` past it
        self.horizon = 2 * self.reach
        self.doc_starts = doc_starts
        self.layout = token_layout(seq_len, doc_starts)
        self.agent = agent
        self.dataset_id = m.dataset_id
        if agent is not None:
            agent.open(source.url, source.storage.storage_options, m.dataset_id)
        self._dtype = m.np_dtype
        self._tok = np.zeros((0, self.width), dtype=self._dtype)
        self._flag = np.zeros((0, self.width if doc_starts else 0), dtype=bool)
        self._free: list[int] = []
        self._lock = threading.Lock()
        self._pid = os.getpid()  # its threads live in this process only
        self._changed = threading.Condition(self._lock)
        # fetches wait for a network or an agent (which decodes for its readers, several
        # blocks at once), not local reads: more threads than decode for those; a record
        # read from a network for one job is kept for the next instead of fetched again
        storage = source.storage
        local = storage.protocol == "file"
        decoding = decoding_threads() if decoding is None else decoding
        self._threads = decoding if local and agent is None else storage.max_inflight
        self._stash_limit = 0 if local else _STASH
        # read ahead four times as far from a network as from local data or an agent
        # (which prefetches for its readers)
        self._ahead = max(1, ahead if ahead is not None else self.reach // 8) * (
            1 if local or agent is not None else 4
        )
        self._gap = max(1, gap if gap is not None else self.reach // 8)
        self._decoding = threading.Semaphore(max(1, decoding))
        self._inflight = 0
        self._pool: ThreadPoolExecutor | None = None
        self._futures: set[Future[None]] = set()
        self._error: BaseException | None = None
        self._closed = False
        # the plan: ids, and per sample its row (-1: none), parts not yet filled, parts
        # given to a job (bit p: part p); ``base`` numbers the plan's first sample across
        # plans, so a job started under an earlier plan finds its samples
        self._seq = np.zeros(0, dtype=np.int64)
        self._row = np.zeros(0, dtype=np.int64)
        self._missing = np.zeros(0, dtype=np.int64)
        self._given = np.zeros(0, dtype=np.uint8)
        self._base = 0
        self._pos = 0
        self._needed = 0  # plan index the batch being taken reaches
        self._jobs = Jobs.empty()
        self._stash: dict[int, bytes] = {}  # block -> its record, kept for its next job
        self._turns: dict[int, deque[int]] = {}  # block -> tickets of its jobs started
        self._ticket = 0
        # each block's first tokens (and flags), kept from any decode of it: a sample
        # that ends in a block needs no more of it (a sample begins every L tokens, so
        # at most L + 1 - gcd(block_tokens, L) of them; one when L divides block_tokens)
        # and finds them here instead of reading and decoding the block again
        self._lead = min(seq_len + 1 - math.gcd(self.bt, seq_len), self.bt)
        per_block = self._lead * (self._dtype.itemsize + 1) + 4
        keep_leads = m.num_blocks * per_block <= _LEADS
        blocks = m.num_blocks if keep_leads else 0
        self._lead_tok = np.zeros((blocks, self._lead), dtype=self._dtype)
        self._lead_flag = np.zeros((blocks, self._lead), dtype=bool)
        self._lead_len = np.zeros(blocks, dtype=np.int32)  # how many are kept
        # the first token of each, where the block index records it and the manifest
        # checks the index (else a forged entry would reach training before any decode
        # of its block checks it, or never: a last block of one token is never decoded)
        # (one token: what a sample needs of a block when seq_len divides it; otherwise
        # it rarely helps and would touch a page of every block's row at once)
        if blocks and self._lead == 1 and m.index.xxh64 is not None:
            first, doc, recorded = source.leads()
            self._lead_tok[recorded, 0] = first[recorded]
            self._lead_flag[recorded, 0] = doc[recorded]
            self._lead_len[recorded] = 1
        self.decoded = 0  # blocks decoded (or mapped from the agent), for tests and metrics
        self.heads = 0  # of them, decoded only as far as samples that end in them need
        self.leads = 0  # jobs filled from a block's first tokens kept from an earlier decode

    @property
    def failed(self) -> bool:
        """Whether a job failed (its error is raised by every later call)."""
        return self._error is not None

    # -- the plan -----------------------------------------------------------------------
    def plan(self, upcoming: np.ndarray) -> None:
        """The samples that come next, in order (the next fill starts with the first)."""
        upcoming = np.asarray(upcoming, dtype=np.int64)
        self._check(upcoming)
        with self._lock:
            self._raise_error()
            # no job of the old cut starts from here on: its plan indices are about to move
            self._jobs = Jobs.empty()
            old = self._seq[self._pos :]
            n = min(len(old), len(upcoming))
            diff = np.nonzero(old[:n] != upcoming[:n])[0]
            keep = int(diff[0]) if len(diff) else n
            if keep < len(old):  # the rest of the old plan is not read: let its rows go
                while self._inflight:  # (rare: a lease cut short) its jobs finish first
                    self._changed.wait()
                self._raise_error()
                gone = self._row[self._pos + keep :]
                self._free.extend(gone[gone >= 0].tolist())
                self._stash.clear()  # kept for jobs of the old plan
            p, k = self._pos, keep
            new = upcoming[keep:]
            self._seq = upcoming
            self._row = np.concatenate([self._row[p : p + k], np.full(len(new), -1)])
            self._missing = np.concatenate([self._missing[p : p + k], self._parts(new)])
            self._given = np.concatenate(
                [self._given[p : p + k], np.zeros(len(new), dtype=np.uint8)]
            )
            self._base += p
            self._pos = 0
            self._needed = 0
            if len(upcoming) > len(self._tok):
                self._grow(len(upcoming))
            self._jobs = cut(self._seq, self.L, self.bt, self._given, self.reach, self._gap)
            blocks = self._upcoming_blocks(_AGENT_PLAN) if self.agent is not None else []
            self._pump()
        if self.agent is not None:
            self.agent.plan(self.dataset_id, blocks)

    def _upcoming_blocks(self, n: int) -> list[int]:
        """The first ``n`` blocks the jobs read, in running order, each once: a job filled
        from its block's kept first tokens reads nothing (under the lock)."""
        jobs, out, seen = self._jobs, list[int](), set[int]()
        for j in jobs.order[jobs.next :].tolist():
            if len(out) == n:
                break
            block = int(jobs.block[j])
            if block in seen:
                continue
            ks = jobs.k[jobs.bounds[j] : jobs.bounds[j + 1]]
            if self._from_lead(block, self._prefix(block, self._seq[ks])):
                continue
            seen.add(block)
            out.append(block)
        return out

    def _check(self, ids: np.ndarray) -> None:
        """Sample ids outside the dataset are refused before any job is cut for them."""
        if len(ids) and (int(ids.min()) < 0 or int(ids.max()) >= self._num_samples):
            bad = ids[(ids < 0) | (ids >= self._num_samples)]
            raise IndexError(
                f"sample id {int(bad[0])} is outside [0, {self._num_samples}) "
                f"(seq_len {self.L} over {self.source.url})"
            )

    def _parts(self, ids: np.ndarray) -> np.ndarray:
        """How many blocks each sample's tokens lie in."""
        s = ids * self.L
        return np.asarray((s + self.L) // self.bt - s // self.bt + 1, dtype=np.int64)

    def _grow(self, rows: int) -> None:
        """A slab of ``rows`` rows (zeros: pages are taken only when first written). Jobs in
        flight write into the slab, so they finish first."""
        while self._inflight:
            self._changed.wait()
        tok = np.zeros((rows, self.width), dtype=self._dtype)
        flag = np.zeros((rows, self._flag.shape[1]), dtype=bool)
        used = self._row[self._row >= 0]  # only rows that hold samples: the rest untouched
        tok[used] = self._tok[used]
        flag[used] = self._flag[used]
        held = len(self._tok)
        self._tok, self._flag = tok, flag
        # rows last freed are taken first: the low rows, already touched, before new ones
        self._free = list(range(rows - 1, held - 1, -1)) + self._free

    # -- running jobs ---------------------------------------------------------------------
    def _pump(self) -> None:
        """Start jobs in order while there is room (under the lock). A job whose first
        sample the batch being taken needs (plan index below ``_needed``) starts whatever
        the room."""
        jobs = self._jobs
        while jobs.next < len(jobs.due) and self._inflight < self._threads:
            first = jobs.due[jobs.next]
            forced = first < self._needed
            if not forced and first >= self._pos + self._ahead:
                return  # not yet (asked again after every batch: this test first, it is cheap)
            j = int(jobs.order[jobs.next])
            lo, hi = int(jobs.bounds[j]), int(jobs.bounds[j + 1])
            ks, ps = jobs.k[lo:hi], jobs.p[lo:hi]
            fresh = ks[self._row[ks] < 0]
            if not forced and len(fresh) > len(self._free):
                return
            if len(fresh):
                self._row[fresh] = [self._free.pop() for _ in range(len(fresh))]
            self._given[ks] |= (1 << ps).astype(np.uint8)
            jobs.next += 1
            self._inflight += 1
            block = int(jobs.block[j])
            self._ticket += 1
            self._turns.setdefault(block, deque()).append(self._ticket)
            fut = self._decoders().submit(
                self._run,
                block,
                ks + self._base,
                self._row[ks].copy(),
                bool(jobs.keep[j]),
                self._ticket,
            )
            self._futures.add(fut)
            fut.add_done_callback(self._futures.discard)

    def _decoders(self) -> ThreadPoolExecutor:
        if self._pool is None:
            self._pool = decode_threads(self.source, self._threads)
        return self._pool

    def _run(
        self, block: int, numbers: np.ndarray, rows: np.ndarray, keep: bool, ticket: int
    ) -> None:
        """A decode thread's job: read ``block``, copy its parts of the samples planned as
        ``numbers`` into ``rows``, let the block go. Jobs of one block run one after the
        other, in the order they started (the threads take jobs in that order), so a job
        finds the record an earlier one kept."""
        with self._lock:
            turns = self._turns[block]
            while turns[0] != ticket:
                self._changed.wait()
        t = time.perf_counter()
        try:
            got, published = self._fill(block, numbers, rows, keep)
        except BaseException as exc:
            with self._lock:
                self._error = self._error or exc
                self._inflight -= 1
                self._done_with(block)
                self._changed.notify_all()
            return
        finally:
            self.source.storage.observer.thread_busy(time.perf_counter() - t)
        with self._lock:
            self.decoded += got != _LEAD
            self.heads += got == _HEAD
            self.leads += got == _LEAD
            k = numbers[published:] - self._base  # (the first ``published`` were, early)
            self._missing[k] -= 1
            self._inflight -= 1
            self._done_with(block)
            try:
                if not self._closed:
                    self._pump()
            except BaseException as exc:  # (starting the next job failed) the reader fails
                self._error = self._error or exc
            finally:
                self._changed.notify_all()

    def _done_with(self, block: int) -> None:
        """The job of ``block`` that ran first is done (under the lock)."""
        turns = self._turns[block]
        turns.popleft()
        if not turns:
            del self._turns[block]

    def _fill(
        self, block: int, numbers: np.ndarray, rows: np.ndarray, keep: bool
    ) -> tuple[int, int]:
        """Read ``block`` (through the agent, or storage), decode it and copy its parts
        while holding one of the ``decoding`` permits, then let it go: what was read
        (``_WHOLE``, ``_HEAD``: only a head of it was decoded, ``_LEAD``: nothing, its
        first tokens were kept), and how many of the first samples were published as
        they were copied (see :meth:`_copy`). With ``keep`` (a later job reads the block
        again: a head of it was enough now, or other samples of it come later) its record
        is kept for that job (a few MiB of them at most)."""
        with self._lock:
            ids = self._seq[numbers - self._base]
        a = ids * self.L - block * self.bt  # each sample's first token, from the block's
        length = self.source.manifest.block_len(block)
        prefix = self._prefix(block, ids)
        if self._from_lead(block, prefix):
            flags = self._lead_flag[block, :prefix] if self.doc_starts else None
            published = self._copy(a, rows, self._lead_tok[block, :prefix], flags, numbers)
            with self._lock:  # a record kept for this job is not needed
                self._stash.pop(block, None)
            return _LEAD, published
        record = None
        if self.agent is not None:
            got = self.agent.get(self.dataset_id, block)
            if got.pinned:
                from stoker.cache.layout import map_block

                try:
                    with self._decoding:
                        toks, starts = map_block(got.path, int(got.tokens), self._dtype)
                        published = self._take(block, a, rows, toks, starts, numbers)
                        del toks, starts
                finally:
                    self.agent.release(self.dataset_id, [block])
                return _WHOLE, published
            record = got.record or None  # inline, or no agent answered: read it here
        if record is None:
            with self._lock:
                record = self._stash.pop(block, None)
        if record is None:
            record = self.source.record(block)
        if keep:
            with self._lock:
                if sum(map(len, self._stash.values())) + len(record) <= self._stash_limit:
                    self._stash[block] = record
        with self._decoding:
            toks, starts = self.source.decode(block, record, prefix)
            del record
            published = self._take(block, a, rows, toks, starts, numbers)
        return (_HEAD if prefix < length else _WHOLE), published

    def _prefix(self, block: int, ids: np.ndarray) -> int:
        """How far into ``block`` the samples ``ids`` reach: a block is decoded only that
        far (a head of it, when its samples end early in it: those begun in the block
        before)."""
        reach = int((ids * self.L).max()) + self.width - block * self.bt
        return min(reach, self.source.manifest.block_len(block))

    def _from_lead(self, block: int, prefix: int) -> bool:
        """Whether the first ``prefix`` tokens of ``block`` are kept (nothing to read)."""
        return bool(len(self._lead_len)) and prefix <= int(self._lead_len[block])

    def _take(
        self,
        block: int,
        a: np.ndarray,
        rows: np.ndarray,
        toks: np.ndarray,
        starts: np.ndarray,
        numbers: np.ndarray,
    ) -> int:
        """Copy a block's (or its head's) parts of the job's samples into their rows, and
        keep its first tokens; ``starts``: its document starts. The samples published
        early (see :meth:`_copy`)."""
        flags = _flags(starts, len(toks)) if self.doc_starts else None
        published = self._copy(a, rows, toks, flags, numbers)
        lead = min(self._lead, len(toks))
        self._keep_lead(block, toks, _flags(starts, lead) if flags is None else flags)
        return published

    def _keep_lead(self, block: int, toks: np.ndarray, flags: np.ndarray) -> None:
        """Keep the first tokens of ``block`` (decoded from its start) and their flags
        (at least as many) for later heads."""
        e = min(self._lead, len(toks))
        if len(self._lead_len) and self._lead_len[block] < e:
            self._lead_tok[block, :e] = toks[:e]
            self._lead_flag[block, :e] = flags[:e]
            self._lead_len[block] = e  # (after its tokens: a reader sees them whole)

    def _copy(
        self,
        a: np.ndarray,
        rows: np.ndarray,
        toks: np.ndarray,
        flags: np.ndarray | None,
        numbers: np.ndarray,
    ) -> int:
        """:meth:`_copy_rows`, a job of many samples (a small source's block, which
        fills the samples of several epochs at once) in pieces in plan order, each
        piece but the last published as soon as it is copied: the consumer waits for
        its first samples only, not for the whole job. How many were published."""
        if len(a) <= _PIECES:
            self._copy_rows(a, rows, toks, flags)
            return 0
        done, size = 0, _FIRST_PIECE
        while True:
            end = min(len(a), done + size)
            self._copy_rows(a[done:end], rows[done:end], toks, flags)
            if end == len(a):
                return done
            with self._lock:
                self._missing[numbers[done:end] - self._base] -= 1
                self._changed.notify_all()
            done, size = end, 2 * size

    def _copy_rows(
        self, a: np.ndarray, rows: np.ndarray, toks: np.ndarray, flags: np.ndarray | None
    ) -> None:
        """A block's tokens and document-start flags of each sample into its row. A row
        is this job's alone, but for a sample in two blocks, whose row the other block's
        job shares: each fills its own columns. ``a``: each sample's first token, from
        the block's; ``toks``: the block, or its head; ``flags``: per token of ``toks``,
        whether a document starts there (``None`` without document starts)."""
        w, L, n = self.width, self.L, len(toks)
        whole = (a >= 0) & (a + w <= n)
        if whole.any():
            r, at = rows[whole], a[whole]
            # samples begin every L tokens: the block's windows are one strided view, and
            # its samples that this job fills are rows of it, copied in one call (under
            # the interpreter lock for about 50 us a block, against 300 us for a loop of
            # row copies that let go of it)
            lo = int(at.min())
            m = (int(at.max()) - lo) // L + 1
            idx = (at - lo) // L
            dest = np.full(m, -1, dtype=np.int64)
            dest[idx] = r
            every = len(idx) == m and bool((dest >= 0).all())  # each window once, in order
            for slab, src in ((self._tok, toks), (self._flag, flags)):
                if src is None:
                    continue
                view = _windows(src[lo:], m, w, L)
                if every:
                    slab[dest] = view
                else:
                    slab[r] = view[idx]
        for i in np.flatnonzero(~whole).tolist():
            row, start = int(rows[i]), int(a[i])
            lo, hi = max(start, 0), min(start + w, n)
            self._tok[row, lo - start : hi - start] = toks[lo:hi]
            if flags is not None:
                self._flag[row, lo - start : hi - start] = flags[lo:hi]

    # -- taking -------------------------------------------------------------------------
    def fill(self, ids: np.ndarray, out: dict[str, np.ndarray]) -> None:
        """Rows of the next ``len(ids)`` planned samples into ``out`` (its ``tokens`` of
        any integer dtype wide enough for the vocabulary: the copy converts)."""
        self.read(ids, out["tokens"], out.get("doc_start_mask"))

    def read(
        self, ids: np.ndarray, out: np.ndarray | None = None, mask: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray | None]:
        """Windows of the next ``len(ids)`` planned samples, as int64 (into ``out`` if given)."""
        ids = np.asarray(ids, dtype=np.int64)
        n = len(ids)
        while True:
            with self._lock:
                p = self._pos
                # (planned ids were checked when they were planned)
                if self._seq[p : p + n].tobytes() == ids.tobytes():
                    self._needed = p + n
                    self._pump()
                    while True:
                        self._raise_error()
                        if not np.count_nonzero(self._missing[p : p + n]):
                            break
                        self._changed.wait()
                    rows = self._row[p : p + n].copy()
                    break
            self.plan(ids)  # not what was planned: these, and nothing known after them
        if out is None:
            out = np.empty((n, self.width), dtype=np.int64)
        out[...] = self._tok[rows]
        if self.doc_starts:
            mask = np.take(self._flag, rows, axis=0, out=mask, mode="clip")  # (rows are valid)
        with self._lock:
            self._row[p : p + n] = -1
            self._free.extend(rows[::-1].tolist())
            self._pos = p + n
            self._pump()
        return out, mask

    def _raise_error(self) -> None:
        if self._error is not None:
            raise self._error

    def close(self) -> None:
        if self._getpid() != self._pid:
            return  # a forked child closing its parent's reader: the threads are the parent's
        with self._lock:
            self._closed = True
            self._jobs = Jobs.empty()
            self._stash.clear()
        cancelled = sum(fut.cancel() for fut in list(self._futures))
        wait([f for f in list(self._futures) if not f.cancelled()])
        with self._lock:  # a closed reader reads nothing more: say so rather than wait
            self._inflight -= cancelled
            self._error = self._error or RuntimeError("this SampleReader is closed")
            self._changed.notify_all()
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False)  # idle now: its threads end
        if self.agent is not None:
            try:
                # what this reader read itself while its agent started goes to the agent
                self.agent.hand_over(self.dataset_id)
                self.agent.flush_releases()  # the last blocks' pins
            except Exception:
                pass  # the agent is gone: its pins went with it


def _flags(starts: np.ndarray, n: int) -> np.ndarray:
    """Per token of a block's first ``n``, whether a document starts there."""
    flags = np.zeros(n, dtype=bool)
    flags[starts[starts < n]] = True
    return flags


def _windows(x: np.ndarray, m: int, w: int, step: int) -> np.ndarray:
    """``m`` windows of ``w`` elements of ``x``, one every ``step`` (a read-only view)."""
    return np.lib.stride_tricks.as_strided(
        x, shape=(m, w), strides=(step * x.strides[0], x.strides[0]), writeable=False
    )


def token_layout(seq_len: int, doc_starts: bool) -> Layout:
    """A batch of token windows: ``tokens`` (int64, ``seq_len + 1``), and
    ``doc_start_mask`` (bool, the same shape) with ``doc_starts``."""
    fields = {"tokens": Field(torch.int64, (seq_len + 1,))}
    if doc_starts:
        fields["doc_start_mask"] = Field(torch.bool, (seq_len + 1,))
    return Layout(fields)


_WHOLE, _HEAD, _LEAD = 0, 1, 2  # what a job read: its block, a head of it, kept first tokens
_LEADS = 8 << 20  # bytes of blocks' first tokens kept at most (else none are kept)
#: Blocks the agent is told this reader reads next, at each plan (it prefetches them, as
#: far as its prefetch budget goes): 64 rather than four per fetch thread (32 over HTTP)
#: took the agent's misses (a get that waits for its load) from about 70 to 5 an epoch
#: of the 100M-token benchmark dataset.
_AGENT_PLAN = 64
_STASH = 4 << 20  # bytes of records kept for a later job at most (about 9 of 1 MiB blocks)
#: A job of more samples than this (twice a 1 MiB block's windows of 2,049 tokens: a
#: small source's block, whose samples of several epochs are planned at once) is copied
#: in pieces, each published as it is copied: ``_FIRST_PIECE`` samples, then twice as
#: many each time. The first read of a plan of 2,654 samples of a 450-sample source
#: (the mixture benchmark's python source) waited 28 ms for one copy of its first
#: job's 1,300 rows (fresh slab rows: their pages taken as they are written), 5 ms in
#: pieces.
_PIECES = 512
_FIRST_PIECE = 128
