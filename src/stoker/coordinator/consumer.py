"""A consumer's side of the coordinator: its leases (:class:`LeaseStream`), the rank's
confirms (:class:`Confirmer`) and what its node's cache holds (:func:`local_ranges`).

The static plan hands a worker its positions by arithmetic (``plan.worker_indices``);
this source hands them out by leases. A consumer registers, takes leases, reads
only below each lease's horizon (asking for more read-ahead when it gets
there), and reports its read position, which is also how the coordinator
learns its rate. Each batch comes with the ``(lease, upto)`` segments that the
rank's main process must confirm before the batch reaches training.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from stoker.coordinator.client import ConfirmCall, CoordinatorClient
from stoker.coordinator.holdings import local_ranges as local_ranges  # what a consumer reports
from stoker.errors import ConsumerExpired

Segments = list[tuple[int, int, int]]  # (lease, upto, rows)


@dataclass
class _Held:
    end: int
    horizon: int
    read: int
    start: int


class LeaseStream:
    """Positions for consumer (``rank``, ``worker``) of the coordinator's current epoch."""

    def __init__(
        self,
        client: CoordinatorClient,
        rank: int,
        worker: int,
        wait: float = 0.02,
        *,
        stream: str = "",
        min_epoch: int = 0,
        max_epoch: int | None = None,
        node: str = "",
        local: Callable[[int], list[tuple[int, int]]] | None = None,
        ahead: bool = False,
    ) -> None:
        """``node`` names the consumer's cache; ``local(epoch)`` gives the positions of
        ``epoch`` that cache holds, reported once registered (locality). With
        ``max_epoch``, a consumer that could only register in a later epoch (its rank's
        other consumers finished this one meanwhile) hands out nothing: the rank's pass
        is one epoch. With ``ahead``, the consumer asks for its next lease once it has
        read half of the one it reads (a fresh one from the queue, if there is one), so
        that :meth:`upcoming` can tell the reader what follows the lease's end."""
        self.client = client
        self.wait = wait
        self.ahead = ahead
        self._asked: int | None = None  # the lease during which the next one was asked for
        self.max_epoch = max_epoch
        self._who = (rank, worker, node, stream, local)
        self.reregistered = 0
        self._over = False
        self._register(min_epoch)
        self._held: dict[int, _Held] = {}
        self._last: int | None = None  # the lease the last batch ended in
        # every lease granted to us this epoch: a lease read to its end is not confirmed
        # until the rank's main process hands its batch out, so it must not be re-granted
        self._granted: set[int] = set()

    def _register(self, min_epoch: int) -> None:
        rank, worker, node, stream, local = self._who
        # an epoch's last consumers may finish before the others: the coordinator begins
        # the next epoch only when all are done, so wait for it rather than join the old
        while True:
            self.consumer, self.epoch = self.client.register(
                rank, worker, node=node, stream=stream, min_epoch=min_epoch
            )
            if self.consumer:
                self.first_step = self.client.first_step
                break
            time.sleep(self.wait)
        if self.max_epoch is not None and self.epoch > self.max_epoch:
            self._over = True  # the pass's epoch ended before this consumer joined it
            return
        if node and local is not None:
            ranges = local(self.epoch)
            if ranges:
                self.client.report_local(self.consumer, self.epoch, ranges)

    def _call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """A lease or heartbeat call; None when this consumer had expired (it was silent
        past the coordinator's timeout, e.g. a long pause): its leases went back to the
        queue, so it registers again, holding nothing, and carries on."""
        try:
            return fn(self.consumer, self.epoch, *args)
        except ConsumerExpired:
            pass
        epoch = self.epoch
        self._register(epoch)
        self.reregistered += 1
        self._held.clear()
        self._granted.clear()
        self._last = None
        if self.epoch != epoch:  # the epoch ended meanwhile: nothing more for us in it
            self._over = True
        return None

    def _update(self, limits: dict[int, tuple[int, int]] | None) -> None:
        if limits is None:
            return
        for lease, (end, horizon) in limits.items():
            h = self._held.get(lease)
            if h is not None:
                h.end, h.horizon = end, horizon

    def _next_lease(self) -> int | None:
        """A lease with positions left to read, or None when the epoch has none for us."""
        while True:
            if self._over:
                return None
            for lease, h in sorted(self._held.items()):
                if h.read < h.end:
                    return lease
                del self._held[lease]
            r = self._call(self.client.lease, sorted(self._granted))
            if r is None:
                continue  # registered again
            if r.status == "granted":
                self._hold(r)
                continue
            if r.status == "done":
                return None
            time.sleep(self.wait)  # WAIT: every position is in someone's lease; ask again
            self._update(self._call(self.client.heartbeat))

    def _hold(self, r: Any) -> None:
        self._held[int(r.lease)] = _Held(int(r.end), int(r.horizon), int(r.start), int(r.start))
        self._granted.add(int(r.lease))

    def _ask_ahead(self, lease: int, h: _Held) -> None:
        """Past half of ``lease`` with nothing else held: ask for the next one now."""
        if self._asked == lease or 2 * (h.end - h.read) > h.end - h.start:
            return
        if any(k != lease and o.read < o.end for k, o in self._held.items()):
            return
        self._asked = lease
        r = self._call(self.client.lease, sorted(self._granted), True)
        if r is not None and r.status == "granted":
            self._hold(r)

    def upcoming(self, limit: int) -> np.ndarray:
        """Up to ``limit`` positions this consumer reads next, as far as it knows: the rest
        of the lease its last batch ended in, then the other leases it holds, in the
        order it reads them (to plan prefetching; part may be stolen)."""
        h = self._held.get(self._last) if self._last is not None else None
        if h is None:
            return np.zeros(0, dtype=np.int64)
        parts = [np.arange(h.read, min(h.end, h.read + limit), dtype=np.int64)]
        have = len(parts[0])
        for lease, o in sorted(self._held.items()):
            if have >= limit:
                break
            if lease != self._last and o.read < o.end:
                parts.append(np.arange(o.read, min(o.end, o.read + limit - have), dtype=np.int64))
                have += len(parts[-1])
        return parts[0] if len(parts) == 1 else np.concatenate(parts)

    def batches(self, size: int) -> Iterator[tuple[np.ndarray, list[tuple[int, int, int]]]]:
        """``(positions, segments)`` of up to ``size`` positions; the last may be shorter.

        A segment ``(lease, upto, rows)`` says the next ``rows`` rows of the batch are
        positions of ``lease`` up to ``upto``; confirm ``(lease, upto)`` before use.
        """
        parts: list[np.ndarray] = []
        segments: list[tuple[int, int, int]] = []
        have = 0
        while True:
            # the lease the last batch ended in, while it has positions left (most batches)
            lease = self._last
            h = self._held.get(lease) if lease is not None else None
            if lease is None or h is None or h.read >= h.end:
                lease = self._next_lease()
                if lease is None:
                    break
                h = self._held[lease]
            if h.read >= h.horizon:  # at the read horizon: report, and get more read-ahead
                self._update(self._call(self.client.heartbeat, lease, h.read))
                continue
            upto = min(h.horizon, h.end, h.read + size - have)
            self._last = lease
            parts.append(np.arange(h.read, upto, dtype=np.int64))
            segments.append((lease, upto, upto - h.read))
            have += upto - h.read
            h.read = upto
            if self.ahead:
                self._ask_ahead(lease, h)  # may find us expired: registered again, holding none
            if have == size:
                # the next batch would reach the horizon, and the lease goes on past it
                if self._held.get(lease) is h and h.horizon - h.read < size and h.horizon < h.end:
                    self._update(self._call(self.client.heartbeat, lease, upto))
                yield parts[0] if len(parts) == 1 else np.concatenate(parts), segments
                parts, segments, have = [], [], 0
        if have:
            yield np.concatenate(parts), segments


#: Batches a rank reads ahead while their confirms are in flight: one coordinator round
#: trip and journal write (a few ms) then covers many batches. 64 rather than 16 took
#: an epoch from 25 to 41 M tok/s with num_workers=0 (benchmarks/dynamic_bench.py's
#: dataset, no training step), 128 rather than 64 from 0.72x to 0.77-0.90x the static
#: plan's rate, and 256 (with :data:`GATHER_SECONDS` of 20 ms rather than 5) from 0.71x
#: to 0.82x (7 interleaved rounds, 2026-12-02); at most :data:`CONFIRM_BYTES` of batches
#: wait. A rank whose training step is slower than reading (the usual case) never fills
#: the window: each batch is confirmed before the next is asked for.
CONFIRM_WINDOW = 256
CONFIRM_BYTES = 64 << 20


def confirm_window(prefetch: int, batch_bytes: int) -> int:
    """Batches read ahead of their confirms: :data:`CONFIRM_WINDOW`, fewer for large
    batches (within :data:`CONFIRM_BYTES`, but at least 4 and ``prefetch``)."""
    return max(prefetch, 4, min(CONFIRM_WINDOW, CONFIRM_BYTES // max(1, batch_bytes)))


#: A confirm message waits up to this long for more batches to carry while the rank
#: is not waiting for an answer (fewer, larger messages: the coordinator's cost is per
#: message more than per batch; 20 ms rather than 5 halved the coordinator's CPU per
#: epoch of the benchmark above).
GATHER_SECONDS = 0.02


class Confirmer:
    """Confirms a rank's batches in order on a thread of its own, as many per message as
    are waiting (``Batch`` of ``ConfirmBatch`` calls), so the coordinator's round trip
    and journal write overlap the reading of the next batches and the training step.

    Answers come back in the order of :meth:`submit`: :attr:`answers` holds those
    not yet taken, :meth:`take` gives the next (waiting for it if need be). While
    nobody waits for an answer, the thread gathers a message for up to
    :data:`GATHER_SECONDS` or ``gather`` batches.
    """

    def __init__(self, client: CoordinatorClient, size: int, gather: int = 48) -> None:
        self.client, self.size, self.gather = client, size, gather
        self.seq = 0
        self._queue: deque[ConfirmCall] = deque()
        #: answers not yet taken, in order (what :meth:`take` gives without waiting)
        self.answers: deque[list[bool | None] | BaseException] = deque()
        self._cv = threading.Condition()
        self._idle = False  # the thread waits for work
        self._urgent = False  # the rank waits for an answer
        self._closed = False
        self._given_up = threading.Event()  # closed early: stop retrying a gone coordinator
        self._thread = threading.Thread(target=self._run, daemon=True, name="stoker-confirm")
        self._thread.start()

    def submit(self, epoch: int, consumer: int, segments: Segments) -> None:
        """Confirm the rank's next batch."""
        self._queue.append(ConfirmCall(consumer, epoch, self.seq, segments, self.size))
        self.seq += 1
        # wake the thread only when it has something to do: the first call after none,
        # or a full message (each wake-up costs this thread the GIL)
        if self._idle and (len(self._queue) == 1 or len(self._queue) >= self.gather):
            with self._cv:
                self._cv.notify_all()

    def take(self) -> list[bool | None]:
        """The next batch's answer per segment (True: lease complete, False: confirmed,
        None: refused); raises what its confirm raised."""
        if not self.answers:
            with self._cv:
                self._urgent = True
                self._cv.notify_all()
                while not self.answers:
                    if not self._thread.is_alive():
                        raise RuntimeError("the confirm thread ended")
                    self._cv.wait(0.1)
                self._urgent = False
        answer = self.answers.popleft()
        if isinstance(answer, BaseException):
            raise answer
        return answer

    def _work(self) -> list[ConfirmCall] | None:
        """The next message's calls (None once closed and drained)."""
        with self._cv:
            self._idle = True
            while not self._queue and not self._closed:
                self._cv.wait(0.05)
            deadline = time.monotonic() + GATHER_SECONDS
            while (
                len(self._queue) < self.gather
                and not self._urgent
                and not self._closed
                and time.monotonic() < deadline
            ):
                self._cv.wait(max(0.0, deadline - time.monotonic()))
            self._idle = False
        if not self._queue:
            return None
        work = []
        while self._queue:
            work.append(self._queue.popleft())
        return work

    def _run(self) -> None:
        while True:
            work = self._work()
            if work is None:
                return
            calls, parts = merge_runs(work)
            try:
                merged: list[list[bool | None] | BaseException] = list(
                    self.client.confirm_batches(calls, self._given_up)
                )
            except BaseException as exc:  # the coordinator is gone: every waiter learns it
                merged = [exc] * len(calls)
            results = split_answers(merged, parts)
            with self._cv:
                self.answers.extend(results)
                self._cv.notify_all()

    def close(self) -> None:
        """Stop the thread once what was submitted is sent. A message still being retried
        (the coordinator is away; its epoch was broken off and is being dropped) is given
        up rather than waited for up to the client's ``retry_for``."""
        with self._cv:
            self._closed = True
            self._cv.notify_all()
        self._given_up.set()
        self._thread.join()


#: Where a batch's segments went in :func:`merge_runs`: (call index, merged segment index,
#: whether the batch's piece ends that merged segment) per segment of the batch.
Parts = list[list[tuple[int, int, bool]]]


def merge_runs(calls: list[ConfirmCall]) -> tuple[list[ConfirmCall], Parts]:
    """``calls`` with each run of consecutive full batches of one consumer as one call
    (``count`` batches; pieces of one lease that continue each other as one segment),
    and where each batch's segments went, for :func:`split_answers`.

    The coordinator's cost is per call and per segment more than per row: a consumer
    reading one lease sends one call per message instead of one per batch.
    """
    out: list[ConfirmCall] = []
    parts: Parts = []
    run: ConfirmCall | None = None
    for c in calls:
        full = sum(n for _, _, n in c.segments) == c.batch_size
        joins = (
            run is not None
            and full
            and (run.consumer, run.epoch, run.batch_size) == (c.consumer, c.epoch, c.batch_size)
            and run.seq + run.count == c.seq
        )
        if not joins:
            run = ConfirmCall(c.consumer, c.epoch, c.seq, [], c.batch_size, 0)
            out.append(run)
        assert run is not None
        where = []
        for lease, upto, n in c.segments:
            last = run.segments[-1] if run.segments else None
            if last is not None and last[0] == lease and last[1] == upto - n:
                run.segments[-1] = (lease, upto, last[2] + n)
            else:
                run.segments.append((lease, upto, n))
            where.append((len(out) - 1, len(run.segments) - 1))
        run.count += 1
        parts.append([(i, k, False) for i, k in where])
        if not full:
            run = None  # a short batch ends its run
    # a piece ends its merged segment when no later piece joined it
    final: dict[tuple[int, int], tuple[int, int]] = {}
    for b, batch in enumerate(parts):
        for j, (i, k, _) in enumerate(batch):
            final[(i, k)] = (b, j)
    for b, j in final.values():
        i, k, _ = parts[b][j]
        parts[b][j] = (i, k, True)
    return out, parts


def split_answers(
    merged: list[list[bool | None] | BaseException], parts: Parts
) -> list[list[bool | None] | BaseException]:
    """Each batch's answers from its merged call's (:func:`merge_runs`): a refused
    segment refuses every piece of it; "lease complete" belongs to its last piece."""
    out: list[list[bool | None] | BaseException] = []
    for batch in parts:
        answers: list[bool | None] = []
        failed: BaseException | None = None
        for i, k, ends in batch:
            got = merged[i]
            if isinstance(got, BaseException):
                failed = got
                break
            a = got[k]
            answers.append(a if a is None or ends else False)
        out.append(failed if failed is not None else answers)
    return out
