"""A preprocessing worker: an Arrow Flight server that makes a records dataset's rows
(read, decode, augment) for the trainers that ask, and streams them back.

A request (:class:`~stoker.preprocess.wire.Request`, the ticket of a ``do_get``) names
the dataset by its :class:`~stoker.preprocess.spec.WorkSpec`, the epoch and the sample
ids; the worker makes them with the dataset's own reader, as the trainer would have,
and answers one record batch. It keeps a reader for each trainer stream it serves (the
trainer's plan: its reader reads ahead for the ids to come), the least recently used
let go past :data:`READERS`. The worker holds no lease and no position: which rows
reach training, exactly once, is the trainer's to say (it confirms each batch with its
coordinator, as when it makes the rows itself); a worker that dies loses nothing but
the rows it was making, which the trainer asks for again elsewhere.

It listens on loopback unless told otherwise; off loopback it needs a shared token,
and on loopback it draws one, kept in the runtime directory for this user's trainers
(a local process of another user cannot ask it for anything).
"""

from __future__ import annotations

import hmac
import json
import logging
import os
import secrets
import threading
import time
from collections import OrderedDict
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.flight as flight

from stoker import __version__, errors
from stoker.errors import ConfigError, PreprocessError
from stoker.loader.batch import SAMPLE_ID
from stoker.preprocess.wire import ERROR as _ERROR
from stoker.preprocess.wire import Request, to_batch

log = logging.getLogger("stoker.preprocess")

#: Trainer streams a worker keeps a reader for at most (each holds its blocks ahead).
READERS = 16
#: Datasets (specs) a worker keeps open at most.
DATASETS = 8
#: Seconds a request waits for those before it in its stream's order (see _Stream.make),
#: and how far ahead of the next a request's order may be for it to wait at all (further:
#: a stream this worker let go and opened again, whose earlier requests are gone).
ORDER_SECONDS, ORDER_GAP = 1.0, 64


class _Auth(flight.ServerMiddlewareFactory):  # type: ignore[misc]
    def __init__(self, token: str) -> None:
        self._expected = f"Bearer {token}".encode()

    def start_call(self, info: Any, headers: dict[str, list[str]]) -> None:
        got = (headers.get("authorization") or [""])[0]
        if not hmac.compare_digest(got.encode(), self._expected):
            raise flight.FlightUnauthenticatedError("missing or wrong preprocessing token")


class _Stream:
    """One trainer stream's reader, and the lock its requests take turns on (an evicted
    stream's reader is closed under it, so never while a request uses it)."""

    def __init__(self, reader: Any) -> None:
        self.reader = reader
        self.lock = threading.Lock()
        self.turn = threading.Condition(self.lock)  # a request made: the next one's turn
        self.closed = False
        self.planned: np.ndarray = np.zeros(0, dtype=np.int64)  # ids from the next on
        self.next = 1  # the order of the request made next

    def make(self, req: Request, layout: Any) -> dict[str, np.ndarray] | None:
        """The rows of ``req``; None when this stream was evicted meanwhile (ask again).
        Requests are made in their order (the plan's): one that came before those ahead
        of it waits for them, up to :data:`ORDER_SECONDS` (one lost on the way is not
        waited for again), so that the reader's plan keeps the blocks they all need."""
        ids = np.asarray(req.ids, dtype=np.int64)
        n = len(ids)
        with self.turn:
            if req.order and req.order - self.next <= ORDER_GAP:
                deadline = time.monotonic() + ORDER_SECONDS
                while self.next < req.order and not self.closed:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        break
                    self.turn.wait(left)
            self.next = max(self.next, req.order + 1)
            self.turn.notify_all()
            if self.closed:
                return None
            try:
                # planned again when these are not what comes next (requests of a stream
                # go to several workers) or the plan runs short of what the trainer named
                # ahead (a block held stays held while the new plan uses it)
                fresh = self.planned[:n].tobytes() != ids.tobytes()
                if fresh or len(self.planned) - n < len(req.ahead) // 2:
                    self.planned = np.concatenate([ids, np.asarray(req.ahead, dtype=np.int64)])
                    self.reader.plan(self.planned)
                out = layout.allocate(n)
                if req.epochs is None:
                    self.reader.fill(ids, out)
                else:
                    self.reader.fill(ids, out, epochs=np.asarray(req.epochs, dtype=np.int64))
            except BaseException:
                self.planned = np.zeros(0, dtype=np.int64)  # (planned again by the next)
                raise
            self.planned = self.planned[n:]
            out[SAMPLE_ID][...] = ids  # (the trainer checks the answer is its rows)
            return out  # type: ignore[no-any-return]

    def close(self) -> None:
        with self.turn:
            self.closed = True
            self.turn.notify_all()
            self.reader.close()


class PreprocessWorker(flight.FlightServerBase):  # type: ignore[misc]
    """The Flight server. ``token`` None: off loopback a :class:`ConfigError`, on loopback
    one is drawn (:attr:`token`). ``local``: this machine's settings for the datasets it
    makes (``storage_options``, ``agent``, ``cache_dir``). ``datasets`` and
    ``transforms``: the URL prefixes a request may name a dataset under and the module
    prefixes (``package`` or ``package.module``) its transform may come from (None: any
    the worker can reach or has installed)."""

    def __init__(
        self,
        bind: str = "127.0.0.1:0",
        token: str | None = None,
        local: dict[str, Any] | None = None,
        datasets: list[str] | None = None,
        transforms: list[str] | None = None,
    ) -> None:
        from stoker.coordinator.server import is_loopback

        if not is_loopback(bind) and not token:
            raise ConfigError(
                f"the preprocessing worker binds {bind}, which is not loopback: give it a "
                "shared token (--token-file or STOKER_PREPROCESS_TOKEN)"
            )
        self.generated = not token
        self.token = token or secrets.token_urlsafe(32)
        host, _, port = bind.rpartition(":")
        super().__init__(
            f"grpc://{host or '127.0.0.1'}:{port or 0}",
            middleware={"auth": _Auth(self.token)},
        )
        self.address = f"{host or '127.0.0.1'}:{self.port}"
        self.local = dict(local or {"agent": False})
        self.datasets, self.transforms = datasets, transforms
        self._streams: OrderedDict[tuple[str, str, int], _Stream] = OrderedDict()
        # the order each stream let go had come to (its requests go on from there)
        self._orders: OrderedDict[tuple[str, str, int], int] = OrderedDict()
        # datasets by spec, the least recently used let go past DATASETS; each made once,
        # outside the worker's lock (its manifest read: one slow URL holds up no other)
        self._datasets: OrderedDict[str, Future[Any]] = OrderedDict()
        self._lock = threading.Lock()
        self.rows = 0  # rows made (tests, metrics)
        self.requests = 0  # requests answered with rows
        self.refused = 0  # requests answered with an error
        self.busy = 0.0  # seconds spent making rows

    def _dataset(self, req: Request) -> Any:
        spec = req.spec.to_json()
        with self._lock:
            fut = self._datasets.get(spec)
            mine = fut is None
            if fut is None:
                fut = self._datasets[spec] = Future()
                while len(self._datasets) > DATASETS:
                    self._datasets.popitem(last=False)
            self._datasets.move_to_end(spec)
        if mine:
            try:
                self._allowed(req)
                ds = req.spec.dataset(**self.local)
                req.spec.check(ds)
            except BaseException as exc:
                with self._lock:
                    self._datasets.pop(spec, None)  # (made again by the next request)
                fut.set_exception(exc)
                raise
            fut.set_result(ds)
        return fut.result()

    def _allowed(self, req: Request) -> None:
        """The request names a dataset and a transform this worker was told to serve."""
        url, fn = req.spec.url, req.spec.transform
        if self.datasets is not None and not any(url.startswith(p) for p in self.datasets):
            raise ConfigError(f"this worker serves no dataset at {url} (its --dataset prefixes)")
        if fn is not None and self.transforms is not None:
            module = fn.partition(":")[0]
            if not any(module == m or module.startswith(m + ".") for m in self.transforms):
                raise ConfigError(f"this worker runs no transform of {module} (its --transform)")

    def _stream(self, req: Request, ds: Any) -> _Stream:
        key = (req.stream, req.spec.to_json(), req.epoch)
        evicted = []
        with self._lock:
            got = self._streams.get(key)
            if got is None:
                # (decoding on every core: a worker's cores are for its trainers' rows)
                reader = ds.open_reader(req.epoch, decoding=os.cpu_count() or 1)
                got = self._streams[key] = _Stream(reader)
                got.next = self._orders.pop(key, 1)  # (a stream let go goes on in order)
                while len(self._streams) > READERS:
                    gone_key, gone = self._streams.popitem(last=False)
                    evicted.append(gone)
                    self._orders[gone_key] = gone.next
                    while len(self._orders) > 64 * READERS:
                        self._orders.popitem(last=False)
            self._streams.move_to_end(key)
        for old in evicted:  # (under its own lock: after a request using it is done)
            old.close()
        return got

    def do_get(self, context: Any, ticket: flight.Ticket) -> flight.RecordBatchStream:
        start = time.monotonic()
        try:
            req = Request.from_bytes(ticket.ticket)
            if req.version != __version__:
                raise PreprocessError(
                    f"this worker runs stoker {__version__}, the trainer {req.version}: "
                    "the rows could differ"
                )
            ds = self._dataset(req)
            out = None
            while out is None:  # (a stream evicted under the request: a fresh one)
                out = self._stream(req, ds).make(req, ds.layout)
        except Exception as exc:  # the trainer raises it again, as its own kind
            with self._lock:
                self.refused += 1
            kind, message, fields = errors.encode(exc)
            text = json.dumps({"kind": kind, "message": message, "fields": fields})
            raise flight.FlightServerError(_ERROR + text) from None
        with self._lock:
            self.rows += len(req.ids)
            self.requests += 1
            self.busy += time.monotonic() - start
        return flight.RecordBatchStream(pa.Table.from_batches([to_batch(out)]))

    def figures(self) -> dict[str, float]:
        """What it did so far (its metrics)."""
        with self._lock:
            return {
                "rows": self.rows,
                "requests": self.requests,
                "refused": self.refused,
                "busy_seconds": self.busy,
                "streams": len(self._streams),
            }

    def shutdown(self) -> None:
        super().shutdown()
        with self._lock:
            streams = list(self._streams.values())
            self._streams.clear()
        for s in streams:
            s.close()


class Offers(threading.Thread):
    """Offers ``worker`` to the coordinator at ``coordinator`` as ``address`` every
    :data:`~stoker.coordinator.pool.OFFER_SECONDS`, with the rows a second it made since
    the last offer; :meth:`stop` says it is leaving. A coordinator that does not answer
    is offered to again at the next turn (a restarted one has the pool back then)."""

    def __init__(self, worker: PreprocessWorker, coordinator: str, address: str) -> None:
        super().__init__(daemon=True, name="stoker-offers")
        from stoker.coordinator.client import CoordinatorClient
        from stoker.coordinator.pool import OFFER_SECONDS

        self.worker, self.address, self.every = worker, address, OFFER_SECONDS
        self.client = CoordinatorClient(coordinator, timeout=2.0, retry_for=OFFER_SECONDS)
        self._stop_event = threading.Event()
        self.offered = 0  # offers the coordinator took

    def run(self) -> None:
        import time

        rows, at = self.worker.rows, time.monotonic()
        while True:
            now = time.monotonic()
            rate = (self.worker.rows - rows) / max(now - at, 1e-9)
            rows, at = self.worker.rows, now
            try:
                self.client.offer(self.address, rate)
                self.offered += 1
            except errors.StokerError as exc:
                log.warning("the coordinator took no offer: %s", exc)
            if self._stop_event.wait(self.every):
                return

    def stop(self) -> None:
        self._stop_event.set()
        self.join(timeout=10)
        try:
            self.client.offer(self.address, 0.0, leaving=True)
        except errors.StokerError:
            pass  # (it forgets the worker after the timeout anyway)
        self.client.close()


class Serving:
    """A worker and what runs beside it: its offers to a coordinator and its metrics
    endpoint (:func:`serve_worker`); :meth:`stop` ends them all."""

    def __init__(self, worker: PreprocessWorker, address: str) -> None:
        self.worker, self.address = worker, address
        self.offers: Offers | None = None
        self.metrics_port: int | None = None
        self.token_file: Path | None = None  # where a drawn token is kept for this user

    def stop(self) -> None:
        if self.offers is not None:
            self.offers.stop()
        self.worker.shutdown()
        if self.token_file is not None:
            self.token_file.unlink(missing_ok=True)


def serve_worker(
    bind: str = "127.0.0.1:0",
    token: str | None = None,
    *,
    local: dict[str, Any] | None = None,
    datasets: list[str] | None = None,
    transforms: list[str] | None = None,
    coordinator: str | None = None,
    advertise: str | None = None,
    metrics_port: int = -1,
) -> Serving:
    """Start a :class:`PreprocessWorker` on ``bind``; with ``coordinator``, offer it there
    as ``advertise`` (default: the bound address); with ``metrics_port`` >= 0 (0: any
    free port), serve its metrics on loopback. A token drawn on loopback (``token`` None)
    is kept in this user's runtime directory, where this user's trainers find it. A
    worker the coordinator's trainers could not reach at the offered address is a
    :class:`ConfigError` before anything starts."""
    from stoker import runtime
    from stoker.coordinator.server import is_loopback

    if coordinator and not advertise and _everywhere(bind):
        raise ConfigError(
            f"bound to {bind}: say which address trainers reach this worker at "
            "(--advertise HOST:PORT)"
        )
    if coordinator and is_loopback(advertise or bind) and not is_loopback(coordinator):
        raise ConfigError(
            f"the coordinator {coordinator} is on another machine, whose trainers cannot "
            f"reach this worker at {advertise or bind}: bind (or --advertise) an address "
            "they reach"
        )
    worker = PreprocessWorker(bind, token, local, datasets, transforms)
    served = Serving(worker, advertise or worker.address)
    if worker.generated:
        try:
            served.token_file = runtime.write_token(worker.address, worker.token, "preprocess")
        except (OSError, ConfigError) as exc:
            served.stop()
            raise ConfigError(
                f"cannot write the worker's token ({exc}); give one with --token-file or "
                "STOKER_PREPROCESS_TOKEN"
            ) from None
    if coordinator:
        served.offers = Offers(worker, coordinator, served.address)
        served.offers.start()
    if metrics_port >= 0:
        from stoker.observe.serving import serve

        served.metrics_port = serve(
            metrics_port, extra=[WorkerCollector(worker)], role="preprocess"
        )
    return served


def _everywhere(bind: str) -> bool:
    """Whether ``bind`` is every address (what a trainer cannot reach the worker at)."""
    return bind.rsplit(":", 1)[0].strip("[]") in ("0.0.0.0", "::", "")


class WorkerCollector:
    """The Prometheus view of a preprocessing worker (``stoker_preprocess_worker_*``)."""

    def __init__(self, worker: PreprocessWorker) -> None:
        self.worker = worker

    def collect(self) -> Any:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        f = self.worker.figures()
        for name, what in (("rows", "Rows made for trainers"),
                           ("requests", "Requests answered with rows"),
                           ("refused", "Requests answered with an error"),
                           ("busy_seconds", "Seconds spent making rows")):  # fmt: skip
            yield CounterMetricFamily(f"stoker_preprocess_worker_{name}", what, value=f[name])
        yield GaugeMetricFamily(
            "stoker_preprocess_worker_streams",
            "Trainer streams the worker keeps a reader for",
            value=f["streams"],
        )
