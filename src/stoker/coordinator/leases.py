"""The lease table: which consumer reads which positions of an epoch, and what is consumed.

Pure: no I/O, no clock (callers pass ``now``), no randomness. Every change is
one of a few operations, each recorded as an :class:`Event`; replaying the
events on a fresh table gives the same table (the coordinator's journal), and
the grants among them reproduce a dynamic run's exact assignment.

Vocabulary (positions are stream positions of the epoch, see ``plan.py``):

* the **epoch set**: the positions the epoch delivers; each of the ``world``
  ranks gets exactly ``quota = |set| // world`` of them, the rest carry over;
* a **lease** ``[start, end)``: contiguous positions reserved for one consumer
  (a DataLoader worker of a rank). The consumer may read positions below its
  **horizon** (read-ahead, sized by its measured rate), reports how far it
  has **read**, and positions below **confirmed** have reached training;
* **commit protocol**: a rank confirms positions *before* handing them to
  training; a confirm for a lease that is no longer held fails, and the batch
  is dropped. So a position reaches training at most once, and a consumer that
  goes silent has ``[confirmed, end)`` put back in the queue: exactly once;
* **work stealing**: when the queue is empty, the lease with the most time
  left is cut in two and the idle consumer gets the far part, beyond the
  victim's horizon, so nothing stolen was read (the rule:
  :mod:`stoker.coordinator.stealing`);
* **locality**: a node's fresh leases come first from the positions its cache
  holds or the shuffle windows it was granted before
  (:mod:`stoker.coordinator.locality`).

Position ranges are sorted, disjoint lists of tuples
(:mod:`stoker.coordinator.ranges`).
"""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Any

from stoker.coordinator import delivery, locality, stealing
from stoker.coordinator.model import WAIT as WAIT
from stoker.coordinator.model import Config as Config
from stoker.coordinator.model import Consumer as Consumer
from stoker.coordinator.model import Event as Event
from stoker.coordinator.model import Grant as Grant
from stoker.coordinator.model import Lease as Lease
from stoker.coordinator.model import LeaseError as LeaseError
from stoker.coordinator.ranges import insert, merged, subtract

#: Batches one ConfirmBatch call may confirm at once (``count``): a rank's confirm
#: window is far below this.
MAX_RUN = 4096

#: A rank's confirm answers kept for retries (a reply lost on the way): those of calls
#: that begin within this many batches of the rank's next one. A rank's client has at
#: most its confirm window (256 batches by default) unanswered, so only its last
#: message can be retried; older answers are let go (else they would grow with the
#: epoch: a call per message per rank).
RETAIN = 2 * MAX_RUN


class LeaseTable:
    """Leases of one epoch of a job with ``world`` ranks."""

    def __init__(
        self,
        epoch: int,
        epoch_set: list[tuple[int, int]],
        world: int,
        config: Config | None = None,
        *,
        stream: str = "",
        origin: str = "",
        first_ids: tuple[int, int] = (1, 1),
    ) -> None:
        if world < 1:
            raise ValueError(f"world must be >= 1, got {world}")
        self.epoch = epoch
        self.epoch_set = [(int(a), int(b)) for a, b in epoch_set if b > a]
        self.world = world
        self.config = config or Config()
        total = sum(b - a for a, b in self.epoch_set)
        self.quota = total // world
        self.queue: list[tuple[int, int]] = list(self.epoch_set)  # sorted, disjoint
        self.local: dict[str, list[tuple[int, int]]] = {}  # node -> positions its cache holds
        self.claimed: dict[str, list[tuple[int, int]]] = {}  # node -> windows granted to it
        self.assigned = [0] * world  # per rank: positions in its leases + consumed by it
        self.consumed: list[tuple[int, int]] = []  # sorted, merged
        self.consumers: dict[int, Consumer] = {}
        self.leases: dict[int, Lease] = {}
        self.completed: dict[int, tuple[int, int]] = {}  # lease -> (consumer, end)
        # what each rank handed to training, batch by batch (see delivery.py)
        self.log: list[list[delivery.Ranges]] = [[] for _ in range(world)]
        self.log_rows = [0] * world
        self.batch_size = 0  # fixed by the first confirmed batch
        # per rank: seq -> answer, oldest first (seqs only go up)
        self._answers: list[dict[int, list[bool | None]]] = [{} for _ in range(world)]
        self.base: list[tuple[int, int]] = []  # consumed before this table began (restore)
        self.stream = stream  # the consumers' position -> sample mapping, as JSON
        self._continued = False  # a consumer's stream that continues it was taken
        self._windows = locality.windows(stream)  # (samples per data epoch, per window, shift)
        self.lease_size = locality.lease_size(stream, self.config.lease_size)
        # an ahead request may take the epoch's tail when no one else could (a journal
        # written before this rule records none: replayed without it)
        self.tail_ahead = True
        self.origin = origin  # the checkpoint this table was restored from
        self.first_step = 0  # batches every rank had handed out before this table began
        self._next_consumer, self._next_lease = first_ids
        # the table's identity in its journal (ids only go up): a checkpoint names it, so
        # that a replay knows which table a restore went back to
        self.first_ids = (int(first_ids[0]), int(first_ids[1]))
        # the journal: how the table began, then every change
        self.events: list[Event] = [Event("begin", 0.0, self._begin_args())]
        self.steals = 0
        self.requeued = 0
        self.granted = 0
        self.by_rank = [0] * world  # positions each rank confirmed in this table

    # -- events ----------------------------------------------------------------------
    def apply(self, event: Event) -> Any:
        """Apply a recorded event (journal replay). Raises LeaseError like the live call."""
        fn: Any = {
            "register": self.register,
            "request": self.request,
            "heartbeat": self.heartbeat,
            "confirm": self.confirm,
            "batch": self.confirm_batch,
            "local": self.report_local,
            "expire": self.expire,
            "revive": self.revive,
        }[event.kind]
        args = event.args
        if event.kind == "register" and "stream" in args and "lease_size" not in args:
            # written before leases were sized by the stream: they had the configured size
            args = {**args, "lease_size": self.config.lease_size}
        return fn(now=event.now, **args)

    def _record(self, kind: str, now: float, **args: Any) -> None:
        self.events.append(Event(kind, now, args))

    def _begin_args(self) -> dict[str, Any]:
        return {
            "epoch": self.epoch,
            "epoch_set": [list(x) for x in self.epoch_set],
            "world": self.world,
            "consumed": [list(x) for x in self.consumed],
            "stream": self.stream,
            "origin": self.origin,
            "first_ids": [self._next_consumer, self._next_lease],
            "config": asdict(self.config),
            "first_step": self.first_step,
            "lease_size": self.lease_size,
            "tail_ahead": self.tail_ahead,
        }

    # -- consumers -------------------------------------------------------------------
    def register(
        self,
        rank: int,
        worker: int,
        now: float,
        stream: str = "",
        node: str = "",
        consumer: int | None = None,
        lease_size: int | None = None,
    ) -> int:
        """A new consumer of ``rank``; returns its id (never reused).

        ``stream`` describes how the consumer maps positions to samples (dataset and
        shuffle, as JSON); every consumer of a job must agree, and the first fixes it.
        ``consumer`` is the id to give it (the service draws random ones, so an id cannot
        be guessed; the event records it); without one the next of a counter.
        """
        if not 0 <= rank < self.world:
            raise LeaseError("bad_rank", f"rank {rank} is outside the job's world of {self.world}")
        differs = bool(stream and self.stream and stream != self.stream)
        continues = differs and not self._continued and _continues(stream, self.stream, self.epoch)
        if differs and not continues:
            raise LeaseError(
                "bad_stream",
                f"rank {rank} maps positions to samples as {stream}, the job as {self.stream} "
                "(every rank must open the same dataset with the same shuffle settings)",
            )
        if consumer is None:
            cid = self._next_consumer
            self._next_consumer += 1
        elif consumer <= 0 or consumer in self.consumers:
            raise LeaseError("bad_consumer", f"consumer id {consumer} is taken or not positive")
        else:
            cid = consumer
        self.consumers[cid] = Consumer(cid, rank, worker, now, since=now, node=node)
        args: dict[str, Any] = {"rank": rank, "worker": worker}
        if consumer is not None:
            args["consumer"] = cid
        if continues:  # (a restore that changed what later epochs map to: journaled)
            self.stream = args["stream"] = stream
            self._windows = locality.windows(stream)
            self._continued = True  # (once a table: its stream is then the job's again)
        if stream and not self.stream:
            self.stream = args["stream"] = stream
            self._windows = locality.windows(stream)
            # (journaled: a replay grants what the live table granted, whatever the rule)
            if lease_size is None:
                lease_size = locality.lease_size(stream, self.config.lease_size)
            self.lease_size = args["lease_size"] = int(lease_size)
        if node:
            args["node"] = node
        self._record("register", now, **args)
        return cid

    def report_local(self, consumer: int, ranges: list[list[int]], now: float) -> None:
        """The positions whose data the consumer's node caches (replaces the node's last
        report); with ``Config.locality`` fresh leases for that node come from them first."""
        c = self._live(consumer)
        c.last_seen = now
        if c.node:
            self.local[c.node] = merged(ranges)
        self._record("local", now, consumer=consumer, ranges=[list(r) for r in ranges])

    def _live(self, consumer: int) -> Consumer:
        c = self.consumers.get(consumer)
        if c is None:
            raise LeaseError("unknown_consumer", f"consumer {consumer} was never registered")
        if not c.alive:
            raise LeaseError(
                "expired_consumer",
                f"consumer {consumer} expired (silent past {self.config.timeout:.0f} s); "
                "its leases went back to the queue: register again",
            )
        return c

    def _lease(self, consumer: Consumer, lease: int) -> Lease:
        ls = self.leases.get(lease)
        if ls is None or ls.consumer != consumer.id:
            raise LeaseError(
                "unknown_lease", f"lease {lease} is not held by consumer {consumer.id}"
            )
        return ls

    # -- granting ----------------------------------------------------------------------
    def request(
        self, consumer: int, now: float, held: list[int] | None = None, ahead: bool = False
    ) -> Grant | None:
        """A lease for ``consumer``; :data:`WAIT` when none is free yet; None when nothing
        more will come to it this epoch (its rank has all its positions, and no other
        consumer of the rank has a part worth splitting).

        ``ahead``: the consumer still has positions to read and asks early, to plan its
        reads: only a fresh lease from the queue, else :data:`WAIT` (no steal, no None:
        it asks again, plainly, once it has read what it holds).

        ``held`` lists the leases the consumer knows it holds (None: do not check): a
        lease granted to it whose answer was lost (a coordinator killed before
        replying) is granted again first, so a retried request never strands positions.
        """
        c = self._live(consumer)
        c.last_seen = now
        known = set(held) if held is not None else set(c.leases)
        grant: Grant | None = None
        for lid in c.leases:
            if lid not in known:
                ls = self.leases[lid]
                ls.read = ls.confirmed  # it never got the grant, so it read nothing of it
                grant = Grant(ls.id, ls.confirmed, ls.end, ls.horizon)
                break
        if grant is None:
            room = self.quota - self.assigned[c.rank]
            if ahead:
                # only while the queue holds a lease for every live consumer (the epoch's
                # tail stays in the queue, or with readers that can be stolen from), or
                # when no other live consumer could take from the queue (its rank has
                # its quota): the tail goes to this one anyway, so it may plan it
                live = [x for x in self.consumers.values() if x.alive]
                queued = sum(b - a for a, b in self.queue)
                plenty = room > 0 and (
                    queued >= len(live) * self.config.lease_size
                    or (self.tail_ahead and self._sole_taker(c, live))
                )
                grant = (self._from_queue(c, room) if plenty else None) or WAIT
            elif room > 0:
                grant = self._from_queue(c, room) or self._steal(c, room) or WAIT
            else:
                grant = self._steal(c, 0)  # within the rank: its count does not change
        extra = {"ahead": True} if ahead else {}
        self._record(
            "request",
            now,
            consumer=consumer,
            held=None if held is None else sorted(known),
            **extra,
        )
        return grant

    def _sole_taker(self, c: Consumer, live: list[Consumer]) -> bool:
        """No live consumer but ``c`` belongs to a rank with room for more positions."""
        return all(x is c or self.assigned[x.rank] >= self.quota for x in live)

    def _readahead(self, c: Consumer) -> int:
        return max(self.config.min_readahead, int(c.rate * self.config.readahead_seconds))

    def _new_lease(self, c: Consumer, start: int, end: int) -> Lease:
        ls = Lease(self._next_lease, c.id, c.rank, start, end, 0, start, start)
        ls.horizon = min(end, start + self._readahead(c))
        self._next_lease += 1
        self.leases[ls.id] = ls
        self.granted += 1
        c.leases.append(ls.id)
        self.assigned[c.rank] += end - start
        return ls

    def _pick(self, c: Consumer) -> tuple[int, int, int]:
        """Where ``c``'s next fresh lease starts: ``(queue index, start, limit)``; the
        front of the queue without ``Config.locality``, else :func:`locality.pick`."""
        if not self.config.locality:
            a, b = self.queue[0]
            return 0, a, b
        return locality.pick(self.queue, c.node, self.local, self.claimed)

    def _claim(self, c: Consumer, start: int, end: int) -> None:
        """The shuffle windows ``[start, end)`` touches now belong to ``c``'s node: its
        reader fetches their blocks, so later leases in them go to the node first."""
        if self.config.locality and c.node and self._windows:
            locality.claim(self.claimed.setdefault(c.node, []), self._windows, start, end)

    def _size(self, c: Consumer, room: int) -> int:
        """A fresh lease's size: the table's, but a lease longer than the configured one
        (a spread job's) gets at most the rank's room shared by its live consumers, so
        that they share the quota instead of stealing from the first."""
        if self.lease_size <= self.config.lease_size:
            return self.lease_size
        mates = sum(1 for x in self.consumers.values() if x.alive and x.rank == c.rank)
        return min(self.lease_size, max(self.config.lease_size, room // max(1, mates)))

    def _from_queue(self, c: Consumer, room: int) -> Grant | None:
        if not self.queue:
            return None
        i, start, limit = self._pick(c)
        qa, qb = self.queue[i]
        end = min(limit, start + self._size(c, room), start + room)
        rest = [r for r in ((qa, start), (end, qb)) if r[1] > r[0]]
        self.queue[i : i + 1] = rest
        self._claim(c, start, end)
        ls = self._new_lease(c, start, end)
        return Grant(ls.id, ls.start, ls.end, ls.horizon)

    def _steal(self, thief: Consumer, room: int) -> Grant | None:
        """Cut the lease :func:`stealing.choose` picks; the thief takes its far part."""
        cut = stealing.choose(
            self.leases.values(), self.consumers, thief, room, self.config.min_steal
        )
        if cut is None:
            return None
        best, moved = cut
        mid = best.end - moved
        best.end = mid
        self.assigned[best.rank] -= moved
        ls = self._new_lease(thief, mid, mid + moved)
        self.steals += 1
        return Grant(ls.id, ls.start, ls.end, ls.horizon, stolen_from=best.consumer)

    # -- progress ----------------------------------------------------------------------
    def heartbeat(
        self, consumer: int, now: float, lease: int = 0, read: int = -1
    ) -> dict[int, tuple[int, int]]:
        """A consumer is alive and (optionally) has read up to ``read`` in ``lease``.

        Returns ``{lease: (end, horizon)}`` for every lease it holds: the end may
        have moved closer (stolen), the horizon further (read-ahead).
        """
        c = self._live(consumer)
        if lease:
            ls = self._lease(c, lease)
            if not ls.read <= read <= ls.horizon:
                raise LeaseError(
                    "bad_range",
                    f"lease {lease}: read position {read} outside [{ls.read}, {ls.horizon}] "
                    "(positions go forward and stay below the horizon)",
                )
            ls.read = read
        c.last_seen = now
        out = {}
        for lid in c.leases:
            ls = self.leases[lid]
            ls.horizon = max(ls.horizon, min(ls.end, ls.read + self._readahead(c)))
            out[lid] = (ls.end, ls.horizon)
        self._record("heartbeat", now, consumer=consumer, lease=lease, read=read)
        return out

    @staticmethod
    def _consumed(c: Consumer, n: int, now: float) -> None:
        """``c``'s rank consumed ``n`` more of its positions: update its rate.

        The rate is measured on consumption, not on reads: a consumer reads ahead
        (prefetch) in bursts, so its reads would make a slow consumer look fast.
        """
        c.read_total += n
        if now > c.since:
            c.rate = c.read_total / (now - c.since)

    def confirm(self, consumer: int, lease: int, upto: int, now: float) -> bool:
        """Positions ``[confirmed, upto)`` of ``lease`` reach training (call before they do).

        Returns True when the lease is complete. Raises LeaseError when the lease
        is not held (expired, or never granted): the caller must drop the batch.
        """
        c = self._live(consumer)
        done = self._confirm(c, lease, upto, now)
        self._record("confirm", now, consumer=consumer, lease=lease, upto=upto)
        return done

    def _confirm(self, c: Consumer, lease: int, upto: int, now: float) -> bool:
        if self.completed.get(lease) == (c.id, upto):
            return True  # a retry of the confirm that completed it
        ls = self._lease(c, lease)
        if not ls.confirmed <= upto <= ls.end or upto > max(ls.read, ls.horizon):
            raise LeaseError(
                "bad_range",
                f"lease {lease}: confirm up to {upto} outside [{ls.confirmed}, "
                f"{min(ls.end, max(ls.read, ls.horizon))}]",
            )
        if upto > ls.confirmed:
            insert(self.consumed, (ls.confirmed, upto))
            self._consumed(c, upto - ls.confirmed, now)
            self.by_rank[c.rank] += upto - ls.confirmed
            ls.confirmed = upto
            ls.read = max(ls.read, upto)
        c.last_seen = now
        done = ls.confirmed == ls.end
        if done:
            del self.leases[lease]
            c.leases.remove(lease)
            self.completed[lease] = (c.id, upto)
        return done

    def confirm_batch(
        self,
        consumer: int,
        seq: int,
        segments: list[list[int]],
        size: int,
        now: float,
        count: int = 1,
    ) -> list[bool | None]:
        """Confirm the rows of one batch of the consumer's rank before it is handed out.

        ``segments`` are ``[lease, upto, rows]``: the batch's next ``rows`` rows are
        positions ``[upto - rows, upto)`` of ``lease``. ``seq`` numbers the rank's
        batches in the epoch from 0, so a retried call (its answer was lost) gets the
        first answer again. Per segment the answer is True (the lease is complete),
        False (confirmed) or None (refused: drop those rows). The accepted rows go to
        the rank's log, which decides what training sees (:mod:`delivery`). An
        expired consumer's batch is refused whole (and still takes its number).

        With ``count`` > 1 the call confirms the rank's batches ``seq`` to
        ``seq + count - 1`` at once, each of ``size`` rows: the segments hold their
        rows in order (``count * size`` in all), and each batch's accepted rows go to
        the log as if it had been confirmed alone.
        """
        c = self.consumers.get(consumer)
        if c is None:
            raise LeaseError("unknown_consumer", f"consumer {consumer} was never registered")
        answers = self._answers[c.rank]
        if seq in answers:
            return answers[seq]
        if seq != len(self.log[c.rank]):
            raise LeaseError(
                "bad_sequence",
                f"rank {c.rank} confirms batch {seq}, the next one is {len(self.log[c.rank])}",
            )
        if size < 1 or (self.batch_size and size != self.batch_size):
            raise LeaseError(
                "bad_range", f"batch size {size}, the job's is {self.batch_size or 'unset'}"
            )
        if not 1 <= count <= MAX_RUN or (
            count > 1 and sum(n for _, _, n in segments) != count * size
        ):
            raise LeaseError(
                "bad_range",
                f"{count} batches of {size} rows (at most {MAX_RUN} a call), and the segments "
                f"hold {sum(n for _, _, n in segments)} rows",
            )
        self.batch_size = size
        answer: list[bool | None] = []
        kept: delivery.Ranges = []
        for lease, upto, n in segments:
            ls = self.leases.get(lease) if c.alive else None  # expired: its leases are gone
            # the rows must continue the lease exactly where its confirmed part ends
            if ls is None or ls.consumer != c.id or n < 1 or upto - n != ls.confirmed:
                answer.append(None)
                continue
            try:
                answer.append(self._confirm(c, lease, upto, now))
                kept.append((upto - n, upto))
            except LeaseError:
                answer.append(None)
        c.last_seen = now
        batches = [kept] if count == 1 else _per_batch(segments, answer, size, count)
        self.log[c.rank].extend(batches)
        # (the accepted rows: what the batches hold, without walking them)
        self.log_rows[c.rank] += sum(n for (_, _, n), a in zip(segments, answer) if a is not None)
        answers[seq] = answer
        while len(answers) > 1 and (oldest := next(iter(answers))) < len(self.log[c.rank]) - RETAIN:
            del answers[oldest]
        extra = {"count": count} if count > 1 else {}
        self._record(
            "batch",
            now,
            consumer=consumer,
            seq=seq,
            segments=[list(x) for x in segments],
            size=size,
            **extra,
        )
        return answer

    def expire(self, now: float) -> list[int]:
        """Consumers silent past the timeout: requeue ``[confirmed, end)`` of their leases."""
        gone = [
            c.id
            for c in self.consumers.values()
            if c.alive and now - c.last_seen > self.config.timeout
        ]
        for cid in gone:
            c = self.consumers[cid]
            c.alive = False
            for lid in c.leases:
                ls = self.leases.pop(lid)
                if ls.end > ls.confirmed:
                    insert(self.queue, (ls.confirmed, ls.end))
                    self.assigned[ls.rank] -= ls.end - ls.confirmed
                    self.requeued += ls.end - ls.confirmed
            c.leases.clear()
        self._record("expire", now)
        return gone

    def revive(self, now: float) -> None:
        """Count every live consumer as seen now (a restarted coordinator gives them a
        full timeout to reach it before their leases go back to the queue)."""
        for c in self.consumers.values():
            if c.alive:
                c.last_seen = now
        self._record("revive", now)

    # -- views ---------------------------------------------------------------------------
    @property
    def consumed_count(self) -> int:
        return sum(b - a for a, b in self.consumed)

    @property
    def done(self) -> bool:
        """Every rank has all its positions, and all of them are consumed."""
        return not self.leases and all(a == self.quota for a in self.assigned)

    def leftover(self) -> list[tuple[int, int]]:
        """Positions no rank takes this epoch (fewer than ``world``), once it is done."""
        return list(self.queue)

    def snapshot(self) -> dict[str, Any]:
        """Topology-free progress: the epoch, its set, and the consumed positions."""
        return {
            "epoch": self.epoch,
            "epoch_set": [list(p) for p in self.epoch_set],
            "consumed": [list(p) for p in self.consumed],
            "stream": self.stream,
        }

    def rank_final(self, rank: int) -> bool:
        """The rank has confirmed all its positions (its held rows are all known)."""
        return self.log_rows[rank] == self.quota

    def snapshot_at(self, batches: int) -> dict[str, Any]:
        """The snapshot of the moment every rank had handed ``batches`` batches of this
        table to training (synchronous training: a step that every rank has taken).

        Any one rank can ask, whenever it likes after that step: ranks that went
        further count only their first ``batches``. Raises ``not_ready`` when a rank's
        log does not reach that far yet.
        """
        if batches < self.first_step:
            raise LeaseError(
                "bad_range",
                f"a checkpoint after {batches} batches of epoch {self.epoch}, but this run "
                f"resumed after {self.first_step}",
            )
        consumed = list(self.base)
        local = batches - self.first_step
        for rank in range(self.world):
            got = delivery.first(self.log[rank], self.batch_size or 1, local, self.rank_final(rank))
            if got is None:
                have = len(delivery.handed_out(self.log[rank], self.batch_size, False))
                raise LeaseError(
                    "not_ready",
                    f"rank {rank} has confirmed {self.first_step + have} batches of epoch "
                    f"{self.epoch}, not {batches}: checkpoint after the step every rank has taken",
                )
            for r in got:
                insert(consumed, r)
        return {
            "epoch": self.epoch,
            "epoch_set": [list(p) for p in self.epoch_set],
            "consumed": [list(p) for p in consumed],
            "stream": self.stream,
            "batches": batches,
            "table": list(self.first_ids),  # which table of the journal it was taken from
        }

    def handed_out(self, rank: int) -> list[delivery.Ranges]:
        """Rank ``rank``'s batches of this table, in the order training got them."""
        return delivery.handed_out(self.log[rank], self.batch_size, self.rank_final(rank))

    @staticmethod
    def restore(
        snapshot: dict[str, Any],
        world: int,
        config: Config | None = None,
        *,
        origin: str = "",
        first_ids: tuple[int, int] = (1, 1),
    ) -> LeaseTable:
        """A table for what ``snapshot`` has left, on ``world`` ranks (any number).

        Every rank gets ``remaining // world`` more positions; the rest carry over.
        ``first_ids`` continues the numbering of consumers and leases (a coordinator
        restored in place must not hand out an id a consumer of the old table holds).
        """
        epoch_set = [(int(a), int(b)) for a, b in snapshot["epoch_set"]]
        consumed = [(int(a), int(b)) for a, b in snapshot["consumed"]]
        remaining = subtract(epoch_set, consumed)
        table = LeaseTable(
            int(snapshot["epoch"]),
            remaining,
            world,
            config,
            stream=str(snapshot.get("stream", "")),
            origin=origin,
            first_ids=first_ids,
        )
        table.epoch_set = epoch_set
        table.consumed = list(consumed)
        table.base = list(consumed)
        table.first_step = int(snapshot.get("batches", 0))
        table.events[0] = Event("begin", 0.0, table._begin_args())
        return table

    @staticmethod
    def replay(events: list[Event], config: Config | None = None) -> LeaseTable:
        """The table a journal describes: its ``begin`` event, then every change (with
        the settings it records, unless ``config`` overrides them)."""
        if not events or events[0].kind != "begin":
            raise ValueError("a journal starts with a 'begin' event")
        b = events[0].args
        if config is None and "config" in b:
            config = Config(**b["config"])  # the settings the table ran with
        table = LeaseTable.restore(
            {
                "epoch": b["epoch"],
                "epoch_set": b["epoch_set"],
                "consumed": b["consumed"],
                "stream": b.get("stream", ""),
                "batches": b.get("first_step", 0),
            },
            int(b["world"]),
            config,
            origin=str(b.get("origin", "")),
            first_ids=tuple(b.get("first_ids", (1, 1))),
        )
        # the size the live table granted (a journal written before leases were sized by
        # the stream records none: they had the configured size)
        table.lease_size = int(b.get("lease_size", table.config.lease_size))
        table.tail_ahead = bool(b.get("tail_ahead", False))
        table.events[0] = Event("begin", 0.0, table._begin_args())
        for ev in events[1:]:
            table.apply(ev)
        return table

    @property
    def next_ids(self) -> tuple[int, int]:
        return self._next_consumer, self._next_lease

    def state(self) -> dict[str, Any]:
        """Everything, for comparing a replayed table with the live one."""
        return {
            "epoch": self.epoch,
            "queue": list(self.queue),
            "assigned": list(self.assigned),
            "consumed": list(self.consumed),
            "consumers": {k: asdict(v) for k, v in self.consumers.items()},
            "leases": {k: asdict(v) for k, v in self.leases.items()},
            "completed": dict(self.completed),
            "next": (self._next_consumer, self._next_lease),
            "steals": self.steals,
            "requeued": self.requeued,
            "log": [list(x) for x in self.log],
            "local": {k: list(v) for k, v in self.local.items()},
            "claimed": {k: list(v) for k, v in self.claimed.items()},
            "stream": self.stream,
        }


def _per_batch(
    segments: list[list[int]], answer: list[bool | None], size: int, count: int
) -> list[delivery.Ranges]:
    """The accepted rows of each of ``count`` batches of ``size`` rows whose rows are
    ``segments`` in order (``answer`` per segment: None for refused)."""
    out: list[delivery.Ranges] = [[] for _ in range(count)]
    row = 0
    for (_, upto, n), a in zip(segments, answer, strict=True):
        lo = upto - n
        while lo < upto:
            j = row // size
            take = min(upto - lo, (j + 1) * size - row)
            if a is not None:
                out[j].append((lo, lo + take))
            lo += take
            row += take
    return out


def _continues(new: str, old: str, epoch: int) -> bool:
    """Whether the stream description ``new`` continues ``old`` in a table of ``epoch``: it
    names ``old`` as its origin, from a later epoch on (a restored mixture whose weights
    changed maps the epochs begun under ``old`` as ``old`` did), and lays positions out
    as ``old`` does (the same sources, batch size, world and steps an epoch)."""
    try:
        desc, before = json.loads(new), json.loads(old)
        origin = desc.get("origin")
        if not isinstance(origin, dict) or origin.get("stream") != before:
            return False
        later = origin.get("epoch")
        if isinstance(later, bool) or not isinstance(later, int) or later <= epoch:
            return False
        same = ("mixture", "batch_size", "world", "steps_per_epoch")
        return all(desc.get(k) == before.get(k) for k in same)
    except (ValueError, AttributeError, TypeError, RecursionError):
        return False
