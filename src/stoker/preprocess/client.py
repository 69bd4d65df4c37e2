"""The trainer's side of the preprocessing pool: a reader whose rows preprocessing
workers make.

:class:`RemoteReader` is a reader like any other (planned ahead, filled in plan order),
so the loader's pass, its leases and its confirms are the same whoever makes the rows:
a batch reaches training exactly once because the trainer confirms it, not because a
worker did its part. The plan is cut into chunks, each asked of the worker that would
answer it first at its own pace (the seconds a row took it, times the chunks it has in
flight, plus one): a slow worker, or one on a slow link, is asked less. A worker not
measured yet gets one request at a time, the others up to ``inflight``; a request names
the ids after its own (``AHEAD``), so that the worker's reader keeps the blocks its
later rows need. The workers are the ones named, or those the coordinator lists (asked
every few seconds: a worker added mid-epoch is asked from then on).

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
from collections import deque
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
    def __init__(self, address: str, token: str | None, here: bool = False) -> None:
        self.address = address
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
        self._seq = np.zeros(0, dtype=np.int64)  # the plan
        self._asked = 0  # of it, asked for up to here
        self._pos = 0  # of it, filled up to here
        # chunks asked, in plan order: (first plan index, ids, their rows: arrays, or
        # None when no worker could make them)
        self._chunks: deque[tuple[int, np.ndarray, Future[dict[str, np.ndarray] | None]]] = deque()
        self._warned = False
        self._closed = False
        self._coordinator_error = ""  # why the coordinator did not answer last
        self._set_aside: set[str] = set()  # workers warned about

    # -- the plan -----------------------------------------------------------------------
    def plan(self, upcoming: np.ndarray) -> None:
        upcoming = np.asarray(upcoming, dtype=np.int64)
        done = self._seq[self._pos : self._asked]
        keep = len(done) if upcoming[: len(done)].tobytes() == done.tobytes() else 0
        if keep < len(done):
            self._chunks.clear()  # (asked for another plan: their answers are not used)
            keep = 0
        old = self._pos  # (plan index 0 now: the first of the chunks kept may begin before)
        self._chunks = deque((s - old, ids, f) for s, ids, f in self._chunks)
        self._seq, self._pos, self._asked = upcoming, 0, keep
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
                    self._workers.append(_Worker(a, token))
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

    def _ask(self) -> None:
        """Ask for chunks of the plan as far as the workers take requests."""
        self._refresh()
        most = self.chunk * self.inflight * max(1, len(self._workers))
        while self._asked < len(self._seq) and self._asked - self._pos < most:
            s = self._asked
            ids = self._seq[s : s + self.chunk]
            ahead = self._seq[s + len(ids) : s + len(ids) + AHEAD]
            req = Request(self.spec, self.epoch, ids.tolist(), ahead.tolist(), self._stream)
            self._chunks.append((s, ids, self._pool.submit(self._call, req)))
            self._asked = s + len(ids)

    # -- asking a worker ------------------------------------------------------------------
    def _pick(self) -> _Worker | None:
        """The worker to ask next: of those up with room (one request at a time to a worker
        not measured yet, ``inflight`` to the others), the one that would answer first;
        None when none is up. With all of them full, wait for one to answer."""
        with self._freed:
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
                if room:
                    w = min(room, key=_Worker.due)  # (the first of equals: ties go round)
                    w.inflight += 1
                    return w
                self._freed.wait(1.0)
            return None

    def _call(self, req: Request) -> dict[str, np.ndarray] | None:
        """The rows of ``req`` from a worker (another when one cannot be reached), or None
        when none can."""
        while not self._closed:
            w = self._pick()
            if w is None:
                return None
            start = time.monotonic()
            try:
                arrays = self._made_here(req.ids) if w.here else self._get(w, req)
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
            took = seconds / max(1, len(req.ids))
            with self._lock:
                w.rows += len(req.ids)
                w.per_row = took if not w.per_row else 0.7 * w.per_row + 0.3 * took
            registry().pool_made(w.address, len(req.ids), seconds)
            return arrays
        return None

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
        end = self._pos + n
        while self._pos < end:
            if not self._chunks:
                self._ask()
            s, chunk_ids, fut = self._chunks[0]
            if fut.done():
                rows = fut.result()
            else:  # the consumer waits on the pool
                start = time.monotonic()
                rows = fut.result()
                waited = time.monotonic() - start
                self._waited += waited
                registry().pool_waited(waited)
            if rows is None:  # no worker could make them: made here
                start = time.monotonic()
                rows = self._make_here(chunk_ids)
                registry().pool_made(HERE, len(chunk_ids), time.monotonic() - start)
                self._chunks[0] = (s, chunk_ids, _done(rows))
            a = self._pos - s
            b = min(len(chunk_ids), end - s)
            at = self._pos - (end - n)
            for k, v in out.items():
                if k != SAMPLE_ID and k in rows:
                    v[at : at + b - a] = rows[k][a:b]
            self._pos = s + b
            if b == len(chunk_ids):
                self._chunks.popleft()
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
        for _, _, f in self._chunks:
            f.cancel()
        self._chunks.clear()
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
