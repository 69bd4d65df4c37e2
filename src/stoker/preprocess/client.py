"""The trainer's side of the preprocessing pool: a reader whose rows preprocessing
workers make.

:class:`RemoteReader` is a reader like any other (planned ahead, filled in plan order),
so the loader's pass, its leases and its confirms are the same whoever makes the rows:
a batch reaches training exactly once because the trainer confirms it, not because a
worker did its part.

Which worker makes a row is said by its block: each block of the plan's next ``AHEAD``
rows is owned by one worker (the one with the least work owned there, counted in rows
times its pace: the seconds a row took it), and the plan is cut into requests of one
owner's rows, so that each block is read by one worker, not by every worker that makes
some of its rows. A request names the owner's rows after its own (its reader keeps
their blocks) and its place in the order of that owner's requests (the worker makes
them in that order). A slow worker, or one on a slow link, owns less; a request is
asked of another worker when that one is idle and ``STEAL`` times faster, or the owner
is down, and its blocks go with it; blocks no request has asked for yet move to the
worker with the least work when another has ``STEAL`` times more (one that joined).
A worker not measured yet gets one
request at a time, the others up to ``inflight``. The workers are the ones named, or
those the coordinator lists (asked every few seconds: a worker added mid-epoch is asked
from then on).

A worker that cannot be reached is left alone for a while and its chunk asked of
another; one that answers but cannot make the rows (another stoker, another dataset
at the URL, a transform it cannot import, rows of the wrong shape) likewise, after a
warning naming it. With none left the rows are made here, by the dataset's own reader,
after one warning. A worker that made the rows and found them bad (a broken image)
says why, and that error is raised here as its own kind, naming the row and the file.
"""

from __future__ import annotations

import contextlib
import json
import math
import secrets
import threading
import time
import warnings
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.flight as flight

from stoker import env, errors, runtime
from stoker.coordinator.client import CoordinatorClient
from stoker.coordinator.pool import OFFER_SECONDS
from stoker.errors import ConfigError, PreprocessError
from stoker.loader.batch import SAMPLE_ID, Layout
from stoker.loader.consumer import Reader
from stoker.observe.registry import registry
from stoker.preprocess.spec import WorkSpec
from stoker.preprocess.wire import ERROR, Request, from_batch

#: Rows a request asks for.
CHUNK = 32
#: Requests in flight to one worker at most (queued at the worker, which makes a stream's
#: requests one after the other: the next is there when one is done, and the worker
#: keeps making rows while the trainer steps; 128 rows with CHUNK).
INFLIGHT = 4
#: Ids a request names after its own (the worker's reader plans its blocks that far: a
#: block fetched for one chunk serves the later chunks' rows of it too).
AHEAD = 2048
#: A worker's rows are asked of another instead (which takes its blocks on) when that
#: one is idle and makes rows this many times faster (or it is down); and blocks no
#: request has asked for yet move to the worker with the least work when another has
#: this many times more (rows owned times pace). Well above the noise of a busy
#: machine's paces, where a move costs a block read twice.
STEAL = 4.0
#: Seconds a worker that could not be reached is left alone before it is asked again.
RETRY_SECONDS = 10.0
#: Seconds a request may take before its worker counts as unreachable.
TIMEOUT_SECONDS = 120.0
#: Workers a reader's request threads are made for (at most ``INFLIGHT`` each at once).
MOST_WORKERS = 8
#: Seconds the coordinator has to list the workers: the reader's first ask, the later
#: ones (a coordinator away holds no batch up), and the wait before asking again after
#: it did not answer.
FIRST_ASK_SECONDS, ASK_SECONDS, AWAY_SECONDS = 5.0, 0.5, 30.0


@dataclass(frozen=True)
class Pool:
    """Where a trainer finds its preprocessing workers: at fixed ``addresses``, or those a
    ``coordinator`` lists (the workers offer themselves to it: one added mid-epoch is
    asked from its first offer on)."""

    addresses: tuple[str, ...] = ()
    coordinator: str | None = None


def parse_pool(pool: str | Sequence[str]) -> Pool:
    """``"grpc://h:p,h:p"`` (or a list of such): those workers; ``"coordinator://h:p"``:
    the workers that coordinator lists."""
    items = [pool] if isinstance(pool, str) else list(pool)
    if len(items) == 1 and str(items[0]).startswith("coordinator://"):
        where = str(items[0])[len("coordinator://") :]
        return Pool(coordinator=_address(where, items[0]))
    out = []
    for item in items:
        for part in str(item).split(","):
            part = part.strip()
            if part.startswith("grpc://"):
                part = part[len("grpc://") :]
            out.append(_address(part, item))
    return Pool(addresses=tuple(out))


def _address(part: str, item: object) -> str:
    host, sep, port = part.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ConfigError(
            "preprocess is grpc://HOST:PORT[,HOST:PORT...] or coordinator://HOST:PORT, "
            f"got {item!r}"
        )
    return part


#: The name this process goes by among the workers (``made_by``) when it makes rows too.
HERE = "local"


class _Worker:
    def __init__(self, address: str, token: str | None, here: bool = False, n: int = 0) -> None:
        self.address = address
        self.n = n  # its number in this reader (the blocks it owns are said by it)
        self.sent = 0  # requests cut for it (each request's order at the worker)
        self.waiting: set[int] = set()  # the orders of its requests waiting to be asked
        self.here = here  # this process, making rows with the dataset's own reader
        self.token = token
        self.client: flight.FlightClient | None = None
        self.inflight = 0
        self.down_until = 0.0
        self.rows = 0  # rows it made for this reader
        self.per_row = 0.0  # seconds a row took it, a moving average (0: not asked yet)

    def due(self) -> float:
        """When a request asked of it now would be answered, in its own pace (a worker
        not yet measured gets one request at a time: its first answer sets its pace)."""
        if not self.per_row:
            return 0.0 if not self.inflight else math.inf
        return (self.inflight + 1) * self.per_row


class _Chunk:
    """A request's rows: their ids and blocks (``own``), and the plan they were cut from
    (``seq``, the block of each: ``blocks``) with where the rows after them begin."""

    __slots__ = (
        "after", "blocks", "future", "ids", "left", "order", "own", "owner", "seq", "stream"
    )  # fmt: skip

    def __init__(
        self, ids: np.ndarray, own: np.ndarray, seq: np.ndarray, blocks: np.ndarray, after: int
    ) -> None:
        self.ids, self.own, self.seq, self.blocks, self.after = ids, own, seq, blocks, after
        self.future: Future[dict[str, np.ndarray] | None] | None = None
        self.left = len(ids)  # rows not filled yet
        self.owner, self.order = -1, 0  # the worker it was cut for, its place in their order
        self.stream = ""  # the reader's stream it was cut in


class _SetAside(Exception):
    """A worker that answered but cannot make rows (its own setup: another stoker, a
    transform it cannot import, storage it cannot read): left alone a while."""


class RemoteReader:
    """Rows of ``spec``'s dataset at ``epoch``, made by the workers of ``pool``; ``local``
    opens the dataset's own reader, for the rows no worker can make."""

    def __init__(
        self,
        spec: WorkSpec,
        epoch: int,
        pool: Pool,
        layout: Layout,
        local: Callable[[], Reader],
        token: str | None = None,
        chunk: int | None = None,
        inflight: int | None = None,
        here: bool = False,
        *,
        block_of: Callable[[np.ndarray], np.ndarray],
    ) -> None:
        self.spec, self.epoch, self.layout = spec, epoch, layout
        self.layout_np = {k: v.dtype for k, v in layout.allocate(0).items()}
        self.chunk = max(1, CHUNK if chunk is None else chunk)
        self.inflight = max(1, INFLIGHT if inflight is None else inflight)
        self._token = token or env.get("STOKER_PREPROCESS_TOKEN") or None
        self._lock = threading.Lock()
        self._freed = threading.Condition(self._lock)  # a request answered: room for one
        # with ``here``, this process is one more worker of the pool (its own cores make
        # rows too, at the pace they do), not only the last resort
        self._workers: list[_Worker] = [_Worker(HERE, None, here=True)] if here else []
        self._ever: list[_Worker] = list(self._workers)  # every worker, by its number
        self._join(pool.addresses)
        self._coordinator = (
            None
            if pool.coordinator is None
            # one try a turn, briefly: a coordinator away must not hold the batches up (the
            # reader goes on with the workers it knows, and asks again next turn)
            else CoordinatorClient(pool.coordinator, timeout=FIRST_ASK_SECONDS, retry_for=0.0)
        )
        self._asked_at = -math.inf  # when the coordinator was last asked
        self._next_ask = -math.inf  # when it is asked next (later after it did not answer)
        self._filled = 0  # rows filled since then (what this reader consumes)
        self._waited = 0.0  # seconds of that spent waiting on the pool
        self._reader_id = secrets.randbits(62)
        # planned as far ahead as a worker is told (a request names the ids after its own,
        # up to AHEAD, so that the worker's reader keeps a block for all the rows it has
        # planned, not only the next chunk's)
        self.horizon = AHEAD
        self._local_open = local
        self._local: Reader | None = None
        self._local_lock = threading.Lock()  # (the pool's thread and the consumer's)
        self._stream = secrets.token_hex(8)
        self._turn = 0
        self._pool = ThreadPoolExecutor(
            self.inflight * max(len(self._workers), MOST_WORKERS),
            thread_name_prefix="stoker-preprocess",
        )
        self._block_of = block_of
        self._seq = np.zeros(0, dtype=np.int64)  # the plan
        self._blocks = np.zeros(0, dtype=np.int64)  # the block of each of its rows
        self._pos = 0  # of it, filled up to here
        self._scan = 0  # of it, given to workers up to here (in requests, or pending)
        # the request of each row of the plan (a serial number; -1: none yet) and the
        # row's place in it; the requests not taken in full yet, by serial number
        self._slot = np.zeros(0, dtype=np.int64)
        self._slot_i = np.zeros(0, dtype=np.int64)
        self._live: dict[int, _Chunk] = {}
        self._serial = 0
        # rows given to a worker (by its number; -1: none up) not asked for yet: asked
        # in requests of ``chunk`` rows, or fewer when needed soon
        self._pending: dict[int, list[int]] = {}
        # the worker that owns each block (its number; -1: none): its rows are asked of
        # it, and a worker is told ahead of its own blocks' rows only, so each block is
        # read by one worker, not by all that make some of its rows
        self._owner = np.zeros(0, dtype=np.int64)
        self._warned = False
        self._closed = False
        self._coordinator_error = ""  # why the coordinator did not answer last
        self._set_aside: set[str] = set()  # workers warned about

    # -- the plan -----------------------------------------------------------------------
    def plan(self, upcoming: np.ndarray) -> None:
        upcoming = np.asarray(upcoming, dtype=np.int64)
        done = self._seq[self._pos : self._scan]
        keep = len(done) if upcoming[: len(done)].tobytes() == done.tobytes() else 0
        old = self._pos
        if keep < len(done):  # (asked for another plan: their answers are not used)
            for c in self._live.values():
                if c.future is not None:
                    c.future.cancel()
            self._live.clear()
            self._pending.clear()
            keep = 0
            # a stream of its own: the requests cancelled leave no gap in the order a
            # worker waits for
            self._stream = secrets.token_hex(8)
            with self._lock:
                for w in self._ever:
                    w.sent = 0
        slot = np.full(len(upcoming), -1, dtype=np.int64)
        slot_i = np.zeros(len(upcoming), dtype=np.int64)
        slot[:keep] = self._slot[old : old + keep]
        slot_i[:keep] = self._slot_i[old : old + keep]
        self._pending = {o: [p - old for p in ps] for o, ps in self._pending.items() if ps}
        self._seq, self._slot, self._slot_i = upcoming, slot, slot_i
        self._blocks = self._block_of(upcoming)
        self._pos, self._scan = 0, keep
        self._ask()

    def _join(self, addresses: Sequence[str], only: bool = False) -> None:
        """Workers not known yet join (those known keep their pace and counts); with
        ``only``, those not listed leave (their requests in flight finish)."""
        listed = set(addresses)
        gone: list[_Worker] = []
        with self._lock:
            if only:
                gone = [w for w in self._workers if not w.here and w.address not in listed]
                self._workers = [w for w in self._workers if w not in gone]
            known = {w.address for w in self._workers}
            for a in addresses:
                if a not in known:
                    token = self._token or runtime.read_token(a, "preprocess")
                    self._workers.append(_Worker(a, token, n=len(self._ever)))
                    self._ever.append(self._workers[-1])
                    known.add(a)
        for w in gone:  # a worker no longer listed: its connection goes (unless in use)
            if w.client is not None and not w.inflight:
                with contextlib.suppress(Exception):
                    w.client.close()

    def _refresh(self) -> None:
        """Ask the coordinator for the workers up, every few seconds, saying what this
        reader would consume were it never kept waiting on the pool (its demand); a
        coordinator that does not answer changes nothing, and is asked again later."""
        now = time.monotonic()
        if self._coordinator is None or now < self._next_ask:
            return
        rate = 0.0
        if self._asked_at > -math.inf:
            rate = self._filled / max(now - self._asked_at - self._waited, 1e-3)
        try:
            got = self._coordinator.pool(self._reader_id, rate)
        except errors.StokerError as exc:
            self._next_ask = now + AWAY_SECONDS
            self._coordinator_error = str(exc)
            return
        finally:
            self._coordinator.timeout = ASK_SECONDS
        self._asked_at, self._next_ask, self._filled, self._waited = (
            now, now + OFFER_SECONDS, 0, 0.0)  # fmt: skip
        self._coordinator_error = ""
        self._join(got, only=True)

    # -- who makes which rows: by block ------------------------------------------------
    def _owners(self, blocks: np.ndarray) -> np.ndarray:
        """The owner (a worker's number, -1: none yet) of each of ``blocks``."""
        out = np.full(len(blocks), -1, dtype=np.int64)
        known = blocks < len(self._owner)
        out[known] = self._owner[blocks[known]]
        return out

    def _own(self) -> None:
        """Give each block of the plan's next :data:`AHEAD` rows that has no owner up an
        owner: the worker with the least work owned there, at its pace (a worker not
        measured yet at the others' middle pace); and when one has :data:`STEAL` times
        less work than another (one that joined, one that sped up), move to it blocks of
        that one's that no request has asked for yet, the last to come first."""
        end = min(len(self._seq), self._pos + AHEAD)
        with self._lock:
            now = time.monotonic()
            up = [w for w in self._workers if w.down_until <= now]
            measured = sorted(w.per_row for w in up if w.per_row)
        if not up:
            return
        mid = measured[len(measured) // 2] if measured else 1.0
        pace = {w.n: w.per_row or mid for w in up}
        blocks = self._blocks[self._pos : end]
        owners = self._owners(blocks)
        orphan = ~np.isin(owners, list(pace))
        load = dict.fromkeys(pace, 0.0)
        for n, c in zip(*np.unique(owners[~orphan], return_counts=True), strict=True):
            load[int(n)] += float(c)
        moved: dict[int, int] = {}
        if orphan.any():
            new, first, back, count = np.unique(
                blocks[orphan], return_index=True, return_inverse=True, return_counts=True
            )
            chosen = np.empty(len(new), dtype=np.int64)
            for i in np.argsort(first, kind="stable"):  # (in the order they come)
                n = min(pace, key=lambda m: (load[m] + count[i]) * pace[m])
                chosen[i] = n
                load[n] += float(count[i])
            owners[orphan] = chosen[back]
            moved.update(zip(new.tolist(), chosen.tolist(), strict=True))
        if len(pace) > 1:
            moved.update(self._balance(blocks, owners, load, pace))
        if not moved:
            return
        which = np.fromiter(moved, dtype=np.int64, count=len(moved))
        with self._lock:  # (a request's thread reads it, and moves a stolen one's blocks)
            top = int(which.max()) + 1
            if top > len(self._owner):
                grown = np.full(max(top, 2 * len(self._owner)), -1, dtype=np.int64)
                grown[: len(self._owner)] = self._owner
                self._owner = grown
            self._owner[which] = np.fromiter(moved.values(), dtype=np.int64, count=len(moved))

    def _balance(
        self,
        blocks: np.ndarray,
        owners: np.ndarray,
        load: dict[int, float],
        pace: dict[int, float],
    ) -> dict[int, int]:
        """Blocks to move (block: new owner) from the worker with the most work (rows
        owned times its pace) to the one with the least, if :data:`STEAL` times less: blocks
        with no row asked for yet, the last to come first, while the second still has
        no more than the first."""
        cost = {n: load[n] * pace[n] for n in pace}
        lo, hi = min(cost, key=cost.__getitem__), max(cost, key=cost.__getitem__)
        if cost[lo] * STEAL >= cost[hi]:
            return {}
        asked = max(0, self._scan - self._pos)  # (the rows given out: their blocks stay)
        held = set(np.unique(blocks[:asked]).tolist())
        tail = blocks[asked:][owners[asked:] == hi]
        cand, first, count = np.unique(tail, return_index=True, return_counts=True)
        out = {}
        for i in np.argsort(first, kind="stable")[::-1]:
            b, c = int(cand[i]), float(count[i])
            if b in held:
                continue
            if (load[lo] + c) * pace[lo] > (load[hi] - c) * pace[hi]:
                break
            out[b] = lo
            load[lo] += c
            load[hi] -= c
        return out

    def _ask(self, need: int = 0) -> None:
        """Cut the plan's next rows into requests, each of the rows of one worker's blocks,
        as far as the workers take requests (and at least up to plan index ``need``)."""
        self._refresh()
        self._own()
        most = self.chunk * self.inflight * max(1, len(self._workers))
        while self._scan < len(self._seq) and (self._scan - self._pos < most or self._scan < need):
            a = self._scan
            b = min(len(self._seq), a + self.chunk)
            owners = self._owners(self._blocks[a:b])
            for p, o in zip(range(a, b), owners.tolist(), strict=True):
                self._pending.setdefault(o, []).append(p)
            self._scan = b
            for o, ps in list(self._pending.items()):
                if len(ps) >= self.chunk:
                    self._send(o, self.chunk)
        for o, ps in list(self._pending.items()):
            # the rest of the plan, or rows needed soon: asked now, though fewer
            soon = max(self._pos + self.chunk, need)
            if ps and (self._scan == len(self._seq) or ps[0] < soon):
                self._send(o, len(ps))

    def _send(self, owner: int, n: int) -> None:
        """Ask for the first ``n`` rows pending for ``owner`` (its blocks')."""
        ps = self._pending[owner]
        at, self._pending[owner] = np.asarray(ps[:n], dtype=np.int64), ps[n:]
        serial = self._serial = self._serial + 1
        self._slot[at] = serial
        self._slot_i[at] = np.arange(len(at))
        chunk = _Chunk(self._seq[at], self._blocks[at], self._seq, self._blocks, int(at[-1]) + 1)
        chunk.stream = self._stream
        if 0 <= owner < len(self._ever):
            with self._lock:
                w = self._ever[owner]
                w.sent += 1
                chunk.owner, chunk.order = owner, w.sent
        chunk.future = self._pool.submit(self._call, chunk, owner)
        self._live[serial] = chunk

    # -- asking a worker ------------------------------------------------------------------
    def _pick(self, owner: int, turn: int = 0) -> _Worker | None:
        """The worker to ask for the rows of ``owner``'s blocks: that one while it is up,
        unless another, idle, makes rows :data:`STEAL` times faster (then its blocks go to
        that one); with it down or gone, the one that would answer first. None when none
        is up. With no one to ask, wait for a request to be answered. ``turn``: the
        request's order among the owner's, which take its free places in that order."""
        me = self._ever[owner] if turn and 0 <= owner < len(self._ever) else None
        with self._freed:
            if me is not None:
                me.waiting.add(turn)
            try:
                return self._choose(owner, turn, me)
            finally:
                if me is not None:
                    me.waiting.discard(turn)
                    self._freed.notify_all()  # (the next in its order may go now)

    def _choose(self, owner: int, turn: int, me: _Worker | None) -> _Worker | None:
        """:meth:`_pick`'s choice, under its lock."""
        while not self._closed:
            now = time.monotonic()
            k = len(self._workers)
            if not k:
                return None
            self._turn = (self._turn + 1) % k  # (ties go round: from the next one on)
            order = [self._workers[(self._turn + i) % k] for i in range(k)]
            up = [w for w in order if w.down_until <= now]
            if not up:
                return None
            room = [w for w in up if w.inflight < (self.inflight if w.per_row else 1)]
            mine = next((w for w in up if w.n == owner), None)
            if mine is not None:
                faster = [
                    w for w in room
                    if w is not mine and not w.inflight and w.per_row
                    and mine.per_row > STEAL * w.per_row
                ]  # fmt: skip
                if faster:
                    w = min(faster, key=_Worker.due)
                elif mine in room and (mine is not me or turn == min(me.waiting)):
                    w = mine
                else:
                    self._freed.wait(1.0)
                    continue
            elif room:
                w = min(room, key=_Worker.due)  # (the first of equals: ties go round)
            else:
                self._freed.wait(1.0)
                continue
            w.inflight += 1
            return w
        return None

    def _call(self, chunk: _Chunk, owner: int) -> dict[str, np.ndarray] | None:
        """The rows of ``chunk`` from a worker (another when one cannot be reached), or
        None when none can."""
        while not self._closed:
            with self._lock:  # (its blocks' owner now: moved since it was cut, maybe)
                now = int(self._owners(chunk.own[:1])[0]) if len(chunk.own) else -1
            owner = now if now >= 0 else owner
            w = self._pick(owner, chunk.order if owner == chunk.owner else 0)
            if w is None:
                return None
            if w.n != owner:  # its blocks go to the worker that makes their rows now
                with self._lock:
                    blocks = np.unique(chunk.own)
                    self._owner[blocks[blocks < len(self._owner)]] = w.n
                owner = w.n
            start = time.monotonic()
            try:
                if w.here:
                    arrays = self._made_here(chunk.ids)
                else:
                    arrays = self._get(w, self._request(chunk, w))
            except _SetAside as exc:
                self._aside(w, str(exc))
                continue
            except (flight.FlightUnavailableError, flight.FlightTimedOutError, OSError):
                self._aside(w, "")  # (gone, or not there yet: expected, said by no warning)
                continue
            except (flight.FlightError, pa.ArrowException) as exc:
                if isinstance(exc, flight.FlightUnauthenticatedError):
                    raise PreprocessError(
                        f"preprocessing worker {w.address} refused this trainer's token (give "
                        "the worker's token: preprocess_token=, or STOKER_PREPROCESS_TOKEN)"
                    ) from None
                self._aside(w, f"{type(exc).__name__}: {exc}")
                continue
            finally:
                with self._freed:
                    w.inflight -= 1
                    self._freed.notify_all()
            seconds = time.monotonic() - start
            took = seconds / max(1, len(chunk.ids))
            with self._lock:
                w.rows += len(chunk.ids)
                w.per_row = took if not w.per_row else 0.7 * w.per_row + 0.3 * took
            registry().pool_made(w.address, len(chunk.ids), seconds)
            return arrays
        return None

    def _request(self, chunk: _Chunk, w: _Worker) -> Request:
        """The request for ``chunk`` to ``w``, naming as ahead the rows of ``w``'s blocks
        in the :data:`AHEAD` after it (its reader keeps those blocks for them)."""
        seq = chunk.seq[chunk.after : chunk.after + AHEAD]
        with self._lock:
            mine = self._owners(chunk.blocks[chunk.after : chunk.after + AHEAD]) == w.n
        order = chunk.order if w.n == chunk.owner else 0  # (another's: out of its order)
        return Request(
            self.spec, self.epoch, chunk.ids.tolist(), seq[mine].tolist(), chunk.stream,
            order=order,
        )  # fmt: skip

    def _aside(self, w: _Worker, why: str) -> None:
        """Leave ``w`` alone for :data:`RETRY_SECONDS`, saying ``why`` (if anything) the
        first time."""
        with self._lock:
            w.down_until = time.monotonic() + RETRY_SECONDS
            first = bool(why) and w.address not in self._set_aside
            if why:
                self._set_aside.add(w.address)
        if first:
            warnings.warn(
                f"preprocessing worker {w.address} is left alone for {RETRY_SECONDS:.0f} s "
                f"at a time: {why}",
                RuntimeWarning,
                stacklevel=2,
            )

    def _get(self, w: _Worker, req: Request) -> dict[str, np.ndarray]:
        with self._lock:
            if w.client is None:
                w.client = flight.connect(f"grpc://{w.address}")
            fc = w.client
        headers = [] if w.token is None else [(b"authorization", f"Bearer {w.token}".encode())]
        options = flight.FlightCallOptions(headers=headers, timeout=TIMEOUT_SECONDS)
        try:
            table = fc.do_get(flight.Ticket(req.to_bytes()), options).read_all()
        except flight.FlightServerError as exc:
            err = _their_error(w.address, str(exc))
            if isinstance(err, errors.DatasetError):
                raise err from None  # the rows' own fault: raised here as it would be
            raise _SetAside(str(err)) from None
        batches = table.to_batches()
        rows = from_batch(batches[0]) if len(batches) == 1 else {}
        got = rows.get(SAMPLE_ID)
        if got is None or got.tolist() != req.ids:
            raise _SetAside(f"it answered other rows than those asked ({table.num_rows} rows)")
        for name, f in self.layout.items():
            have = rows.get(name)
            want = self.layout_np[name]
            if have is None or have.shape[1:] != f.shape or have.dtype != want:
                said = "none" if have is None else f"{have.dtype} {have.shape[1:]}"
                raise _SetAside(
                    f"its rows' field {name!r} is {said}, not {want} {f.shape}: another "
                    "dataset or stoker"
                )
        return rows

    # -- taking -------------------------------------------------------------------------
    #: (a mixture's reader would tell each row's epoch: refused below, not ignored)
    per_row_epochs = True

    def fill(
        self, ids: np.ndarray, out: dict[str, np.ndarray], epochs: np.ndarray | None = None
    ) -> None:
        if self._closed:
            raise RuntimeError("this RemoteReader is closed")
        if epochs is not None:
            raise ConfigError(
                "a records dataset fed by a preprocessing pool does not mix yet: give the "
                "mixture's records sources no preprocess"
            )
        ids = np.asarray(ids, dtype=np.int64)
        n = len(ids)
        if self._seq[self._pos : self._pos + n].tobytes() != ids.tobytes():
            self.plan(ids)  # not what was planned: these, and nothing known after them
        a, end = self._pos, self._pos + n
        self._ask(end)  # (every row of these asked for now)
        slots = self._slot[a:end]
        order = np.unique(slots, return_index=True)
        for serial in order[0][np.argsort(order[1], kind="stable")].tolist():
            chunk = self._live[serial]
            assert chunk.future is not None
            if chunk.future.done():
                rows = chunk.future.result()
            else:  # the consumer waits on the pool
                start = time.monotonic()
                rows = chunk.future.result()
                waited = time.monotonic() - start
                self._waited += waited
                registry().pool_waited(waited)
            if rows is None:  # no worker could make them: made here
                start = time.monotonic()
                rows = self._make_here(chunk.ids)
                registry().pool_made(HERE, len(chunk.ids), time.monotonic() - start)
                chunk.future = _done(rows)
            at = np.nonzero(slots == serial)[0]
            src = self._slot_i[a + at]
            for k, v in out.items():
                if k != SAMPLE_ID and k in rows:
                    v[at] = rows[k][src]
            chunk.left -= len(at)
            if not chunk.left:
                del self._live[serial]
        self._pos = end
        self._filled += n
        self._ask()

    def _make_here(self, ids: np.ndarray) -> dict[str, np.ndarray]:
        if not self._warned:
            self._warned = True
            where = ", ".join(w.address for w in self._workers) or "none listed"
            if self._coordinator is not None:
                said = self._coordinator_error or where
                where = f"coordinator {self._coordinator.address}: {said}"
            warnings.warn(
                f"no preprocessing worker answers ({where}): this process makes the rows "
                "itself until one does",
                RuntimeWarning,
                stacklevel=3,
            )
        return self._made_here(ids)

    def _made_here(self, ids: np.ndarray | list[int]) -> dict[str, np.ndarray]:
        """Rows of ``ids`` made by this process's own reader of the dataset."""
        ids = np.asarray(ids, dtype=np.int64)
        rows = self.layout.allocate(len(ids))
        with self._local_lock:
            if self._local is None:
                self._local = self._local_open()
            self._local.fill(ids, rows)
        rows[SAMPLE_ID][...] = ids
        return rows

    @property
    def made_by(self) -> dict[str, int]:
        """Rows each worker made for this reader, by address."""
        with self._lock:
            return {w.address: w.rows for w in self._workers}

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for c in self._live.values():
            if c.future is not None:
                c.future.cancel()
        self._live.clear()
        with self._lock:  # (closed first: a request in flight ends now, not at its deadline)
            clients = [w.client for w in self._workers if w.client is not None]
        for c in clients:
            with contextlib.suppress(Exception):
                c.close()
        self._pool.shutdown(wait=True, cancel_futures=True)
        if self._coordinator is not None:
            self._coordinator.close()
        if self._local is not None:
            self._local.close()


def _done(rows: dict[str, np.ndarray]) -> Future[dict[str, np.ndarray] | None]:
    f: Future[dict[str, np.ndarray] | None] = Future()
    f.set_result(rows)
    return f


def _their_error(address: str, text: str) -> errors.StokerError:
    """The error a worker sent, as its own kind (a row's bad image: ImageError)."""
    at = text.find(ERROR)
    if at >= 0:
        try:
            raw: dict[str, Any] = json.JSONDecoder().raw_decode(text[at + len(ERROR) :])[0]
            got = errors.decode(
                str(raw["kind"]), str(raw["message"]), f"worker {address}", raw.get("fields")
            )
            if got is not None:
                return got
            return PreprocessError(f"preprocessing worker {address}: {raw['message']}")
        except (ValueError, KeyError, TypeError):
            pass
    return PreprocessError(f"preprocessing worker {address}: {text}")
