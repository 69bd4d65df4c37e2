"""The coordinator's gRPC service: the lease table behind a lock, journaled before it answers.

Every call that changes the table is written to the journal (one segment per
call) before the reply leaves, so a coordinator killed with SIGKILL and
restarted replays exactly what its consumers were told. Epochs follow one
another: when every rank has its positions and all are consumed, the next
epoch's table begins with the positions left over plus the next data epoch.

Every call needs the job's token (``authorization: Bearer <token>`` metadata),
loopback included, compared in constant time and never logged: one given
(``--token-file``, ``STOKER_COORDINATOR_TOKEN``; required off loopback), else one
the server draws itself. Consumer ids are random 63-bit numbers, so a process that
holds no token cannot act for a consumer by guessing its id either.

One connection cannot make the server hold much: messages are capped
(:mod:`stoker.coordinator.limits`), connections, streams per connection
and calls waiting for a thread are bounded, a connection that does not finish its
HTTP/2 handshake in time is dropped, and keepalive pings find
peers that went away.
"""

from __future__ import annotations

import gc
import hashlib
import json
import logging
import secrets
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, NoReturn

import grpc

from stoker import intervals, plan
from stoker._proto import coordinator_pb2 as pb
from stoker._proto import coordinator_pb2_grpc as pb_grpc
from stoker.coordinator import image, locality
from stoker.coordinator.client import REASON_KEY
from stoker.coordinator.commit import GroupCommit
from stoker.coordinator.journal import Journal
from stoker.coordinator.leases import WAIT, Config, Event, LeaseError, LeaseTable
from stoker.coordinator.metrics import CoordinatorMetrics
from stoker.coordinator.pacing import Pacer
from stoker.coordinator.pool import OFFER_SECONDS, PoolTable
from stoker.errors import ConfigError, StateError

log = logging.getLogger("stoker.coordinator")

#: Journaled events between two images of the tables: a restart reads the last image and
#: replays at most this many events (plus the epochs begun since), a second or two
#: rather than the whole epoch's journal (benchmarks/scale_bench.py).
IMAGE_EVERY = 70_000
#: Events between two ``gc.freeze()`` of a coordinator process (``gc_freeze``).
FREEZE_EVERY = 20_000
#: About the journal bytes of one event (a lease or a confirm of a lease, JSON).
EVENT_BYTES = 150

_CODES = {
    "unknown_consumer": grpc.StatusCode.NOT_FOUND,
    "unknown_lease": grpc.StatusCode.NOT_FOUND,
    "expired_consumer": grpc.StatusCode.FAILED_PRECONDITION,
    "wrong_epoch": grpc.StatusCode.FAILED_PRECONDITION,
    "bad_range": grpc.StatusCode.INVALID_ARGUMENT,
    "bad_rank": grpc.StatusCode.INVALID_ARGUMENT,
    "bad_stream": grpc.StatusCode.FAILED_PRECONDITION,
    "bad_sequence": grpc.StatusCode.FAILED_PRECONDITION,
    "not_ready": grpc.StatusCode.FAILED_PRECONDITION,
    "bad_consumer": grpc.StatusCode.INTERNAL,
}


def _refuse(context: grpc.ServicerContext, exc: LeaseError) -> NoReturn:
    """End the call with the refusal's gRPC status, its reason in the trailing metadata."""
    context.set_trailing_metadata(((REASON_KEY, exc.code),))
    context.abort(_CODES.get(exc.code, grpc.StatusCode.INVALID_ARGUMENT), str(exc))
    raise AssertionError("grpc's abort() returned")  # it raises


class Coordinator(pb_grpc.CoordinatorServicer):
    """Leases of a job's epochs over ``num_samples`` samples and ``world`` ranks."""

    def __init__(
        self,
        num_samples: int,
        world: int,
        state_url: str,
        job: str = "job",
        *,
        config: Config | None = None,
        drop_remainder: bool = False,
        manifest_json: bytes = b"",
        index: bytes = b"",
        dataset_url: str = "",
        storage_options: dict[str, Any] | None = None,
        clock: Any = time.time,  # wall clock: the journal's times outlive the process
        restore: str | None = None,
        gc_freeze: bool = False,
    ) -> None:
        """``gc_freeze``: this process is the coordinator's own; move the tables out of
        the cyclic collector's way after loading them and every :data:`FREEZE_EVERY`
        events (at a thousand nodes its full collections took 40% of the CPU and
        stalled calls for most of a second)."""
        self.num_samples = num_samples
        self.gc_freeze = gc_freeze
        self._since_freeze = 0
        self.world = world
        self.config = config or Config()
        self.drop_remainder = drop_remainder
        self.manifest_json, self.index, self.dataset_url = manifest_json, index, dataset_url
        self.clock = clock
        self.journal = Journal(state_url, job, storage_options)
        self.commit = GroupCommit(self.journal)
        self._lock = threading.Lock()  # the tables
        self._taken = 0  # the current table's events handed to the commit
        self.origin = ""  # the checkpoint the run descends from (set once loaded)
        self._since_image = 0  # events journaled since the last image
        self.image_every = IMAGE_EVERY
        self._image_events = 0  # events the last image's size stands for
        self._imaging = ThreadPoolExecutor(1, thread_name_prefix="stoker-image")
        self._storing: Future[None] | None = None  # the image being stored
        self._previous_doc: dict[str, Any] | None = None  # the previous table's image
        self._checkpoints: dict[tuple[int, str, int], tuple[str, str]] = {}
        self.metrics = CoordinatorMetrics()
        self.pacer = Pacer()  # how often each node's relay may send (under self._lock)
        # the preprocessing pool's workers and demand (not journaled: told again every few
        # seconds, so a restarted coordinator has them back at once)
        self.pool = PoolTable(timeout=max(self.config.timeout, 3 * OFFER_SECONDS))
        self._pool_lock = threading.Lock()
        self._handlers: dict[str, Any] = {
            "lease": self._lease,
            "heartbeat": self._heartbeat,
            "confirm": self._confirm,
            "confirm_batch": self._confirm_batch,
        }
        # the last image of the tables, then the journal's events after it (or all of them);
        # without the cyclic collector meanwhile (it would walk the growing tables again
        # and again: a replay three times slower), and the tables frozen out of its way
        t0 = time.perf_counter()
        collecting = gc.isenabled()
        gc.disable()
        try:
            self._load(restore, world, num_samples, drop_remainder, state_url, job)
        finally:
            if collecting:
                gc.enable()
        if self.gc_freeze:
            gc.freeze()
        log.info("ready in %.2f s", time.perf_counter() - t0)
        with self._lock:
            self._advance()
            mine = self._flush()
        self._sync(mine)

    def _load(
        self,
        restore: str | None,
        world: int,
        num_samples: int,
        drop_remainder: bool,
        state_url: str,
        job: str,
    ) -> None:
        """The tables from the journal (its last image and what follows), a checkpoint, or
        fresh."""
        t0 = time.perf_counter()
        # the epoch before the current one answers its consumers' last calls (DONE, retries)
        self.previous: LeaseTable | None = None
        found: tuple[int, dict[str, Any]] | None = None
        got = None
        for found in self.journal.images() if restore is None else ():
            try:  # (an image of another stoker version, or one that does not replay: older)
                got = self._from_image(*found)
                break
            except (KeyError, ValueError, TypeError, LeaseError, StateError) as exc:
                log.warning("image before segment %d passed over: %s", found[0], exc)
        if got is None:
            found = None
            got = self._from_image(1, None)
        chain, origins, events, imaged_previous = got
        last = chain[-1] if chain else None
        # the checkpoint the journal's run descends from (later epochs' tables too)
        journal_origin = next((o for o in reversed(origins) if o), "")
        if restore is not None:
            # a new generation from a checkpoint, on this coordinator's world, whatever the
            # journal holds (progress after the checkpoint is what a relaunch discards);
            # ids go on from the journal's, so a consumer of the old run is refused, loudly
            snapshot = self.journal.read_checkpoint(restore)
            first_ids = last.next_ids if last is not None else (1, 1)
            self.table = LeaseTable.restore(
                snapshot, world, self.config, origin=restore, first_ids=first_ids
            )
            log.info(
                "restored epoch %d from checkpoint %s onto %d ranks",
                self.table.epoch,
                restore,
                world,
            )
        elif last is not None:
            if last.world != world:
                raise ConfigError(
                    f"the journal of job {job!r} under {state_url} is for {last.world} ranks, "
                    f"not {world}: restore from a checkpoint to change the world"
                )
            if len(chain) > 1:
                self.previous = chain[-2]
            else:
                self.previous = imaged_previous
            self.table = last
            self._taken = len(self.table.events)
            self.table.revive(self._now())
            log.info(
                "resumed epoch %d from the journal (%s%d events) in %.2f s",
                self.table.epoch,
                f"an image before segment {found[0]}, then " if found else "",
                len(events),
                time.perf_counter() - t0,
            )
        else:
            first = plan.first_epoch_set(0, num_samples, world, drop_remainder)
            self.table = LeaseTable(0, _pairs(first), world, self.config)
        self.origin = self.table.origin or journal_origin

    # -- journal (group commit) ---------------------------------------------------------
    def _from_image(
        self, segment: int, doc: dict[str, Any] | None
    ) -> tuple[list[LeaseTable], list[str], list[Event], LeaseTable | None]:
        """The tables from the image ``doc`` (None: none) and the journal from ``segment``
        on, oldest first (only the last two replayed); the origins their begins name; the
        events read; the table before the image's, from it. Settings: this coordinator's,
        as for a replay."""
        events = [Event.from_json(e) for e in self.journal.read(segment)]
        tables = _split_epochs(events)
        chain: list[LeaseTable] = []
        origins = [t[0].args.get("origin", "") for t in tables]
        previous = None
        if doc is not None:
            if doc.get("previous") is not None:
                previous = image.load(doc["previous"])
                previous.config = self.config
            imaged = image.load(doc["table"])
            imaged.config = self.config
            for ev in events[: len(events) - sum(len(t) for t in tables)]:  # before a begin
                imaged.apply(ev)
            chain.append(imaged)
            origins.insert(0, str(doc.get("origin", "")))
        chain += [LeaseTable.replay(t, self.config) for t in tables[-2:]]
        return chain, origins, events, previous

    def _flush(self) -> int:
        """Hand the table's new events to the group commit (call with the lock held);
        returns how many events have been buffered in all, to wait for with :meth:`_sync`.
        Every :attr:`image_every` events an image of the tables is taken."""
        new = self.table.events[self._taken :]
        self._taken = len(self.table.events)
        if not new:
            return self.commit.buffered
        upto = self.commit.add(new)
        self._since_freeze += len(new)
        if self.gc_freeze and self._since_freeze >= FREEZE_EVERY:
            self._since_freeze = 0
            gc.collect(1)  # the young garbage first: frozen, a cycle would stay for good
            gc.freeze()  # what the table holds now is long-lived: out of the collector's way
        self._since_image += len(new)
        if self._since_image >= max(self.image_every, self._image_events):
            self._take_image()
        return upto

    def _take_image(self) -> None:
        """Write an image of the tables as of now, the journal's next segment after it,
        so that a restart reads only what follows (call with the lock held: the journal
        is written up to now first, a few ms; the image is stored on a thread)."""
        if self._storing is not None and not self._storing.done():
            return  # the last one is still being stored: the next flush tries again
        t = time.perf_counter()
        self._since_image = 0
        segment = self.commit.rotate()
        if self._previous_doc is None and self.previous is not None:
            # the epoch before, as it ended (once an epoch; a replay has it so too)
            self._previous_doc = image.dump(self.previous)
        doc = {
            "segment": segment,
            "before": self.journal.before(segment),
            "table": image.dump(self.table),
            "previous": self._previous_doc,
            "origin": self.origin,
        }
        del self.table.events[1 : self._taken]  # journaled and imaged: not kept twice
        self._taken = len(self.table.events)
        # (the image holds copies: it is serialised and stored on a thread)
        self._storing = self._imaging.submit(
            self._store_image, segment, doc, time.perf_counter() - t
        )

    def _store_image(self, segment: int, doc: dict[str, Any], took: float) -> None:
        try:
            data = json.dumps(doc, separators=(",", ":")).encode()
            # the next image once the journal has grown by about this one's size: a
            # restart then reads at most about twice an image's bytes, and images at most
            # double what is written
            self._image_events = len(data) // EVENT_BYTES
            self.journal.write_image(segment, data)
            log.info(
                "image of the tables before journal segment %d: %d bytes, %.2f s under the lock",
                segment,
                len(data),
                took,
            )
        except Exception as exc:  # the journal is whole: a restart replays more, that is all
            log.warning("could not store the image before segment %d: %s", segment, exc)

    def _sync(self, upto: int) -> None:
        """Return once the first ``upto`` buffered events are in the journal."""
        self.commit.sync(upto)

    def _now(self) -> float:
        return float(self.clock())

    def _table(self, epoch: int) -> LeaseTable:
        """The table of ``epoch``: the current one, or the one just finished (its consumers'
        last calls get DONE, and retried confirms their answer; nothing there is journaled
        because nothing there changes what was delivered)."""
        if epoch == self.table.epoch:
            return self.table
        if self.previous is not None and epoch == self.previous.epoch:
            return self.previous
        raise LeaseError(
            "wrong_epoch", f"request for epoch {epoch}, the coordinator is in {self.table.epoch}"
        )

    def _advance(self) -> None:
        """Begin the next epoch once this one is done (call with the lock held)."""
        t = self.table
        if not t.done:
            return
        fresh = [((t.epoch + 1) * self.num_samples, (t.epoch + 2) * self.num_samples)]
        nxt = fresh if self.drop_remainder else _pairs(intervals.make(t.leftover() + fresh))
        self._flush()
        self.previous = t
        self._previous_doc = None
        self.metrics.close_table(t)
        self.table = LeaseTable(
            t.epoch + 1, nxt, self.world, self.config, stream=t.stream, first_ids=t.next_ids
        )
        self._taken = 0
        self._flush()
        log.info("epoch %d done; epoch %d begins", t.epoch, t.epoch + 1)

    def _call(self, context: grpc.ServicerContext, fn: Any, durable: bool, method: str = "") -> Any:
        """Run ``fn`` on the table; a ``durable`` call answers only once it is journaled.

        Every call a consumer acts on is durable: a registration (it uses the id), a
        grant (it reads the lease), a heartbeat (it reads to the horizon, stops at a cut
        end) and a confirm (it hands the batch to training). A restarted coordinator
        then knows everything its consumers were told: an answer lost in a crash was
        never acted on, and a retried Lease gets the lost grant first. (Were a grant or
        a steal lost, the consumer's view and the table's would part: rows refused, or
        positions no one reads.) Group commit makes the cost one journal write per
        batch of calls waiting together.
        """
        t = time.perf_counter()
        try:
            with self._lock:
                try:
                    out = fn()
                except LeaseError as exc:
                    self._flush()
                    _refuse(context, exc)
                mine = self._flush()
                self._advance()
            if durable:
                self._sync(mine)
            return out
        finally:
            self.metrics.observe(method, time.perf_counter() - t)

    def expire(self) -> list[int]:
        with self._lock:
            gone = self.table.expire(self._now())
            mine = self._flush()
        self._sync(mine)
        return gone

    def start_writer(self) -> None:
        self.commit.start()

    def close(self) -> None:
        with self._lock:
            self._flush()
        self.commit.close()
        self._imaging.shutdown(wait=True)  # an image being stored is finished

    # -- RPCs ---------------------------------------------------------------------------
    def Register(
        self, request: pb.RegisterRequest, context: grpc.ServicerContext
    ) -> pb.RegisterReply:
        def go() -> pb.RegisterReply:
            t = self.table
            if t.epoch < request.min_epoch:
                return pb.RegisterReply(consumer=0, epoch=t.epoch, origin=self.origin)
            per_epoch = locality.positions_per_epoch(request.stream)
            if per_epoch is not None and per_epoch != self.num_samples:
                raise LeaseError(
                    "bad_stream",
                    f"rank {request.rank}'s data has {per_epoch} positions an epoch, this "
                    f"coordinator {self.num_samples} (--num-samples): start it with "
                    f"--num-samples {per_epoch}",
                )
            cid = t.register(
                request.rank,
                request.worker,
                self._now(),
                request.stream,
                request.node,
                consumer=self._consumer_id(),
            )
            return pb.RegisterReply(
                consumer=cid, epoch=t.epoch, origin=self.origin, first_step=t.first_step
            )

        return self._call(context, go, durable=True)

    def _consumer_id(self) -> int:
        """A fresh random id (63 bits, not 0, in neither table): not guessable."""
        prev = self.previous.consumers if self.previous is not None else {}
        while True:
            cid = secrets.randbits(63)
            if cid and cid not in self.table.consumers and cid not in prev:
                return cid

    # -- the calls, on the table (with the lock held) ------------------------------------
    def _lease(self, request: pb.LeaseRequest) -> pb.LeaseReply:
        g = self._table(request.epoch).request(
            request.consumer, self._now(), list(request.held), request.ahead
        )
        if g is None:
            return pb.LeaseReply(status=pb.LeaseReply.DONE)
        if g is WAIT:
            return pb.LeaseReply(status=pb.LeaseReply.WAIT)
        return pb.LeaseReply(
            status=pb.LeaseReply.GRANTED, lease=g.lease, start=g.start, end=g.end, horizon=g.horizon
        )

    def _heartbeat(self, request: pb.HeartbeatRequest) -> pb.HeartbeatReply:
        limits = self._table(request.epoch).heartbeat(
            request.consumer, self._now(), request.lease, request.read if request.lease else -1
        )
        return pb.HeartbeatReply(
            leases=[pb.LeaseLimits(lease=k, end=e, horizon=h) for k, (e, h) in limits.items()]
        )

    def _confirm(self, request: pb.ConfirmRequest) -> pb.ConfirmReply:
        table = self._table(request.epoch)
        done = table.confirm(request.consumer, request.lease, request.upto, self._now())
        return pb.ConfirmReply(lease_done=done)

    def _confirm_batch(self, request: pb.ConfirmBatchRequest) -> pb.ConfirmBatchReply:
        answers = self._table(request.epoch).confirm_batch(
            request.consumer,
            request.seq,
            [[x.lease, x.upto, x.rows] for x in request.segments],
            request.batch_size,
            self._now(),
            max(1, request.count),
        )
        codes = {True: pb.ConfirmBatchReply.LEASE_DONE, False: pb.ConfirmBatchReply.CONFIRMED}
        return pb.ConfirmBatchReply(
            answers=[pb.ConfirmBatchReply.REFUSED if a is None else codes[a] for a in answers]
        )

    # -- RPCs (continued) -----------------------------------------------------------------
    def Lease(self, request: pb.LeaseRequest, context: grpc.ServicerContext) -> pb.LeaseReply:
        return self._call(context, lambda: self._lease(request), True, "Lease")

    def Heartbeat(
        self, request: pb.HeartbeatRequest, context: grpc.ServicerContext
    ) -> pb.HeartbeatReply:
        return self._call(context, lambda: self._heartbeat(request), True, "Heartbeat")

    def Confirm(self, request: pb.ConfirmRequest, context: grpc.ServicerContext) -> pb.ConfirmReply:
        return self._call(context, lambda: self._confirm(request), True, "Confirm")

    def ConfirmBatch(
        self, request: pb.ConfirmBatchRequest, context: grpc.ServicerContext
    ) -> pb.ConfirmBatchReply:
        return self._call(context, lambda: self._confirm_batch(request), True, "ConfirmBatch")

    def Batch(self, request: pb.BatchRequest, context: grpc.ServicerContext) -> pb.BatchReply:
        """Each call as if alone (its own answer or error), under one lock and, when any of
        them must be durable, one journal write."""
        results = []
        durable = False
        t = time.perf_counter()
        with self._lock:
            for call in request.calls:
                kind = call.WhichOneof("kind")
                handler = self._handlers.get(kind or "")
                if handler is None:
                    results.append(
                        pb.Result(error=pb.CallError(code="INVALID_ARGUMENT", message="empty call"))
                    )
                    continue
                try:
                    out = handler(getattr(call, kind))
                    results.append(pb.Result(**{kind: out}))
                    durable |= kind in ("lease", "heartbeat", "confirm", "confirm_batch")
                except LeaseError as exc:
                    code = _CODES.get(exc.code, grpc.StatusCode.INVALID_ARGUMENT).name
                    error = pb.CallError(code=code, message=str(exc), reason=exc.code)
                    results.append(pb.Result(error=error))
            # once a message: an epoch done by one of its calls ends here (later calls of
            # the message went to its table all the same: they name its epoch)
            self._flush()
            self._advance()
            mine = self._flush()
            pace = self.pacer.heard(request.sender, time.monotonic())
        if durable:
            self._sync(mine)
        self.metrics.observe("Batch", time.perf_counter() - t)
        return pb.BatchReply(results=results, pace=pace)

    def Checkpoint(
        self, request: pb.CheckpointRequest, context: grpc.ServicerContext
    ) -> pb.CheckpointReply:
        """The snapshot after ``batches`` batches of every rank, stored under the state URL
        as ``checkpoints/<job>/<name>.json`` (any rank may ask, any number of times)."""
        with self._lock:
            try:
                table = self._table(request.epoch)
                key = (table.epoch, table.origin, request.batches)
                if key in self._checkpoints:
                    name, text = self._checkpoints[key]
                    return pb.CheckpointReply(snapshot_json=text, name=name)
                snapshot = table.snapshot_at(request.batches)
            except LeaseError as exc:
                _refuse(context, exc)
        text = json.dumps(snapshot, separators=(",", ":"), sort_keys=True)
        name = f"epoch{snapshot['epoch']}-{hashlib.sha256(text.encode()).hexdigest()[:16]}"
        self.journal.write_checkpoint(name, snapshot)
        with self._lock:
            self._checkpoints[key] = (name, text)
        return pb.CheckpointReply(snapshot_json=text, name=name)

    def Local(self, request: pb.LocalRequest, context: grpc.ServicerContext) -> pb.LocalReply:
        def go() -> pb.LocalReply:
            self._table(request.epoch).report_local(
                request.consumer, [[r.start, r.end] for r in request.ranges], self._now()
            )
            return pb.LocalReply()

        return self._call(context, go, durable=False)

    def Status(self, request: pb.StatusRequest, context: grpc.ServicerContext) -> pb.StatusReply:
        with self._lock:
            t = self.table
            return pb.StatusReply(
                epoch=t.epoch,
                world=t.world,
                num_samples=self.num_samples,
                origin=self.origin,
                stream=t.stream,
                quota=t.quota,
                consumed=t.consumed_count - sum(b - a for a, b in t.base),
                live_consumers=sum(c.alive for c in t.consumers.values()),
                steals=t.steals,
                requeued=t.requeued,
            )

    def Offer(self, request: pb.OfferRequest, context: grpc.ServicerContext) -> pb.OfferReply:
        if not request.address:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "an offer names no address")
        with self._pool_lock:
            self.pool.offer(request.address, request.rows_per_second, self._now(), request.leaving)
        return pb.OfferReply()

    def Pool(self, request: pb.PoolRequest, context: grpc.ServicerContext) -> pb.PoolReply:
        with self._pool_lock:
            got = self.pool.ask(request.reader, request.rows_per_second, self._now())
        return pb.PoolReply(addresses=got)

    def Dataset(self, request: pb.DatasetRequest, context: grpc.ServicerContext) -> pb.DatasetReply:
        return pb.DatasetReply(
            manifest_json=self.manifest_json, index=self.index, url=self.dataset_url
        )


def _pairs(iv: Any) -> list[tuple[int, int]]:
    return [(int(a), int(b)) for a, b in iv]


def _split_epochs(events: list[Event]) -> list[list[Event]]:
    """The journal's events cut at each ``begin`` (one list per epoch)."""
    out: list[list[Event]] = []
    for ev in events:
        if ev.kind == "begin":
            out.append([ev])
        elif out:
            out[-1].append(ev)
    return out


def __getattr__(name: str) -> Any:  # their home before 0.2
    if name in ("Server", "is_loopback", "coordinator_timeout"):
        from stoker.coordinator import server

        return getattr(server, name)
    if name == "CoordinatorCollector":
        from stoker.coordinator.metrics import CoordinatorCollector

        return CoordinatorCollector
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
