"""A consumer's handle on the coordinator: retries through outages, typed refusals.

Holds only its settings, so it pickles into DataLoader workers; each process
opens its own channel. Calls that fail because the coordinator is unreachable
(UNAVAILABLE, DEADLINE_EXCEEDED, or the server's limit of calls in flight) are
retried with exponential backoff for up to
``retry_for`` seconds, which rides out a coordinator restart; every call is
safe to repeat (see :mod:`stoker.coordinator.leases`). A refusal (expired
consumer, unknown lease, wrong epoch, a wrong token, ...) raises
:class:`~stoker.errors.CoordinatorRefused` with the coordinator's reason (its
``reason`` field, from the call's trailing metadata), or the reason's own class
(:class:`~stoker.errors.ConsumerExpired`). Answers come back as stoker's value
types (:class:`Grant`, :class:`Status`); only :mod:`stoker.coordinator` sees
the protobuf messages.

The token: the one given, else :func:`find_token` (looked up at the first call, and
again once when the coordinator refuses it: a restarted coordinator may have made
a new one).
"""

from __future__ import annotations

import copy
import json
import os
import random
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc

from stoker import env
from stoker._proto import coordinator_pb2 as pb
from stoker._proto import coordinator_pb2_grpc as pb_grpc
from stoker.errors import ConfigError, CoordinatorRefused, refused
from stoker.errors import ConsumerExpired as ConsumerExpired  # imported from here too
from stoker.errors import CoordinatorUnavailable as CoordinatorUnavailable
from stoker.errors import LeaseRejected as LeaseRejected

if TYPE_CHECKING:
    from stoker.coordinator.relay import RelayLink

_RETRY = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
ENV_TOKEN = "STOKER_COORDINATOR_TOKEN"
ENV_TOKEN_FILE = "STOKER_COORDINATOR_TOKEN_FILE"


def find_token(address: str) -> str | None:
    """The token for the coordinator at ``address`` when none is given:
    ``$STOKER_COORDINATOR_TOKEN``, else the file ``$STOKER_COORDINATOR_TOKEN_FILE`` names,
    else the file a coordinator on this machine wrote for ``address``
    (:func:`stoker.runtime.token_path`)."""
    token = env.get(ENV_TOKEN)
    if token:
        return token.strip()
    path = env.get(ENV_TOKEN_FILE)
    if path:
        try:
            return Path(path).read_text().strip() or None
        except OSError as exc:
            raise ConfigError(f"{ENV_TOKEN_FILE}={path}: cannot read the token ({exc})") from None
    from stoker import runtime

    return runtime.read_token(address)


def answers(reply: pb.ConfirmBatchReply) -> list[bool | None]:
    """Per segment of a confirmed batch: True (lease complete), False (confirmed), None
    (refused: drop its rows)."""
    out: dict[int, bool | None] = {
        pb.ConfirmBatchReply.CONFIRMED: False,
        pb.ConfirmBatchReply.LEASE_DONE: True,
        pb.ConfirmBatchReply.REFUSED: None,
    }
    return [out[a] for a in reply.answers]


def _reason(exc: grpc.RpcError) -> str:
    """The coordinator's reason for a refusal (trailing metadata), or ``""``."""
    try:
        trailing = exc.trailing_metadata() or ()
    except Exception:
        return ""
    for key, value in trailing:
        if key == REASON_KEY:
            return str(value)
    return ""


#: The trailing-metadata key of a refusal's reason (the service sets it).
REASON_KEY = "stoker-reason"


@dataclass(frozen=True)
class Grant:
    """A Lease call's answer: ``status`` is ``"granted"`` (lease ``lease`` over positions
    ``[start, end)``, readable up to ``horizon``), ``"wait"`` (every position is in
    someone's lease: ask again) or ``"done"`` (nothing left this epoch)."""

    status: str
    lease: int = 0
    start: int = 0
    end: int = 0
    horizon: int = 0


_GRANT_STATUS = {
    pb.LeaseReply.GRANTED: "granted",
    pb.LeaseReply.WAIT: "wait",
    pb.LeaseReply.DONE: "done",
}


@dataclass(frozen=True)
class Status:
    """The coordinator's view of the job (a Status call)."""

    epoch: int
    world: int
    num_samples: int
    origin: str  # the checkpoint the current table was restored from, if any
    stream: str
    quota: int  # positions per rank this epoch
    consumed: int  # positions of this epoch confirmed
    live_consumers: int
    steals: int
    requeued: int


@dataclass(slots=True)
class ConfirmCall:
    """One ConfirmBatch of a rank: its ``seq``-th batch of ``epoch`` (and, with
    ``count``, the ones after it, each of ``batch_size`` rows), whose rows are the
    ``(lease, upto, rows)`` segments, read by ``consumer``."""

    consumer: int
    epoch: int
    seq: int
    segments: list[tuple[int, int, int]]
    batch_size: int
    count: int = 1


class CoordinatorClient:
    def __init__(
        self,
        address: str,
        token: str | None = None,
        *,
        timeout: float = 10.0,
        retry_for: float = 120.0,
        relay: str | None = None,
        look_up: bool = True,
    ) -> None:
        """``relay``: the socket of this node's agent, which carries the Lease, Heartbeat
        and ConfirmBatch calls with the node's others (:mod:`stoker.coordinator.relay`).
        ``look_up``: without a token, look for one (:func:`find_token`); else send none."""
        self.address = address
        self.token = token
        self.timeout = timeout
        self.retry_for = retry_for
        self.relay = relay
        self.look_up = look_up
        self._link: RelayLink | None = None
        self._pid: int | None = None
        self._channel: grpc.Channel | None = None
        self._stub: Any = None
        self._token: str | None = token
        self.retries = 0
        self.origin = ""  # the checkpoint the coordinator's table came from (after register)
        self.first_step = 0  # batches of the epoch before the table began (after register)

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state.update(_pid=None, _channel=None, _stub=None, _token=self.token, _link=None)
        return state

    def relayed(self, relay: str | None) -> CoordinatorClient:
        """This client with its Lease, Heartbeat and ConfirmBatch calls carried by the
        agent at socket ``relay`` (None: made directly)."""
        other = copy.copy(self)  # (its own channel and link: __getstate__)
        other.relay = relay
        return other

    def _relayed(
        self, calls: list[pb.Call], cancel: threading.Event | None = None
    ) -> list[pb.Result] | None:
        """``calls`` through the node agent (None: make them directly)."""
        if self.relay is None:
            return None
        if self._link is None or self._link.path != self.relay:
            from stoker.coordinator.relay import RelayLink

            self._link = RelayLink(self.relay)
        if not self._link.usable():
            return None
        if self._token is None:
            self._token = find_token(self.address)
        return self._link.call(
            self.address,
            self._token,
            calls,
            timeout=self.timeout,
            retry_for=self.retry_for,
            cancel=cancel,
        )

    def _one(self, name: str, kind: str, request: Any) -> Any:
        """One Lease, Heartbeat or Confirm call: through the node agent when relayed."""
        results = self._relayed([pb.Call(**{kind: request})])
        if results is None:
            return self._call(name, request)
        r = results[0]
        if r.WhichOneof("kind") == "error":
            raise refused(r.error.code, r.error.message, r.error.reason)
        return getattr(r, kind)

    def __repr__(self) -> str:  # never print the token
        return f"CoordinatorClient({self.address!r})"

    def _stub_now(self) -> Any:
        if self._pid != os.getpid() or self._stub is None:
            self._pid = os.getpid()
            self._channel = grpc.insecure_channel(self.address)
            self._stub = pb_grpc.CoordinatorStub(self._channel)
        return self._stub

    def _call(self, name: str, request: Any, cancel: threading.Event | None = None) -> Any:
        """One call, retried while the coordinator is away (up to ``retry_for``, or until
        ``cancel`` is set: then :class:`CoordinatorUnavailable` at once)."""
        if self._token is None and self.look_up:
            self._token = find_token(self.address)
        deadline = time.monotonic() + self.retry_for
        delay = 0.05
        looked_again = False
        while True:
            metadata = [("authorization", f"Bearer {self._token}")] if self._token else None
            try:
                return getattr(self._stub_now(), name)(
                    request, timeout=self.timeout, metadata=metadata
                )
            except grpc.RpcError as exc:
                code = exc.code()
                if (
                    code == grpc.StatusCode.UNAUTHENTICATED
                    and not self.token
                    and self.look_up
                    and not looked_again
                ):
                    looked_again = True
                    fresh = find_token(self.address)
                    if fresh != self._token:
                        self._token = fresh
                        continue
                # the server's bound on calls in flight (not a message over its size limit)
                busy = code == grpc.StatusCode.RESOURCE_EXHAUSTED and "Concurrent RPC limit" in (
                    exc.details() or ""
                )
                if code not in _RETRY and not busy:
                    raise refused(code.name, exc.details() or "", _reason(exc)) from None
                if time.monotonic() + delay > deadline:
                    raise CoordinatorUnavailable(
                        f"coordinator at {self.address} did not answer for {self.retry_for:.0f} s "
                        f"({exc.details()})"
                    ) from None
                self.retries += 1
                # backoff while the coordinator is away, spread so that a thousand nodes
                # do not come back at the same moment
                pause = delay * (0.5 + random.random())
                if cancel is None:
                    time.sleep(pause)
                elif cancel.wait(pause):
                    raise CoordinatorUnavailable(
                        f"coordinator at {self.address}: the call was given up ({exc.details()})"
                    ) from None
                delay = min(delay * 2, 2.0)

    # -- calls -------------------------------------------------------------------------
    def register(
        self, rank: int, worker: int, node: str = "", stream: str = "", min_epoch: int = 0
    ) -> tuple[int, int]:
        """A consumer id and the coordinator's epoch (see :attr:`origin`); the id is 0
        (not registered) while the coordinator's epoch is below ``min_epoch``."""
        r = self._call(
            "Register",
            pb.RegisterRequest(
                rank=rank, worker=worker, node=node, stream=stream, min_epoch=min_epoch
            ),
        )
        self.origin = str(r.origin)
        self.first_step = int(r.first_step)
        return int(r.consumer), int(r.epoch)

    def lease(self, consumer: int, epoch: int, held: list[int], ahead: bool = False) -> Grant:
        """A lease for ``consumer`` (which holds the leases ``held``); ``ahead``: asked
        early, while it still reads one (a fresh lease from the queue or ``"wait"``)."""
        r = self._one(
            "Lease",
            "lease",
            pb.LeaseRequest(consumer=consumer, epoch=epoch, held=held, ahead=ahead),
        )
        return Grant(
            _GRANT_STATUS[r.status], int(r.lease), int(r.start), int(r.end), int(r.horizon)
        )

    def heartbeat(
        self, consumer: int, epoch: int, lease: int = 0, read: int = 0
    ) -> dict[int, tuple[int, int]]:
        r = self._one(
            "Heartbeat",
            "heartbeat",
            pb.HeartbeatRequest(consumer=consumer, epoch=epoch, lease=lease, read=read),
        )
        return {int(x.lease): (int(x.end), int(x.horizon)) for x in r.leases}

    def confirm(self, consumer: int, epoch: int, lease: int, upto: int) -> bool:
        r = self._one(
            "Confirm",
            "confirm",
            pb.ConfirmRequest(consumer=consumer, epoch=epoch, lease=lease, upto=upto),
        )
        return bool(r.lease_done)

    def confirm_batch(
        self, consumer: int, epoch: int, seq: int, segments: list[tuple[int, int, int]], size: int
    ) -> list[bool | None]:
        """Confirm a batch's ``(lease, upto, rows)`` segments; per segment True (lease
        complete), False (confirmed) or None (refused: drop its rows)."""
        r = self._one(
            "ConfirmBatch",
            "confirm_batch",
            pb.ConfirmBatchRequest(
                consumer=consumer,
                epoch=epoch,
                seq=seq,
                segments=[pb.Segment(lease=a, upto=u, rows=n) for a, u, n in segments],
                batch_size=size,
            ),
        )
        return answers(r)

    def confirm_batches(
        self, calls: list[ConfirmCall], cancel: threading.Event | None = None
    ) -> list[list[bool | None] | CoordinatorRefused]:
        """Many ConfirmBatch calls in one message (:meth:`batch`); per call its answers
        (as :meth:`confirm_batch`) or the refusal."""
        request = [
            pb.Call(
                confirm_batch=pb.ConfirmBatchRequest(
                    consumer=c.consumer,
                    epoch=c.epoch,
                    seq=c.seq,
                    segments=[pb.Segment(lease=a, upto=u, rows=n) for a, u, n in c.segments],
                    batch_size=c.batch_size,
                    count=c.count,
                )
            )
            for c in calls
        ]
        out: list[list[bool | None] | CoordinatorRefused] = []
        for r in self.batch(request, cancel):
            if r.WhichOneof("kind") == "error":
                out.append(refused(r.error.code, r.error.message, r.error.reason))
            else:
                out.append(answers(r.confirm_batch))
        return out

    def batch(self, calls: list[pb.Call], cancel: threading.Event | None = None) -> list[pb.Result]:
        """Many consumers' calls in one message; a result per call, in order (each an
        answer or a ``CallError``). Retried as a whole: every call is idempotent. Relayed,
        they go with the node's other calls."""
        results = self._relayed(calls, cancel)
        if results is not None:
            return results
        return self.send_batch(calls, cancel)[0]

    def send_batch(
        self, calls: list[pb.Call], cancel: threading.Event | None = None, sender: str = ""
    ) -> tuple[list[pb.Result], float]:
        """One Batch message from this process (never relayed), as ``sender`` (a node's
        relay names its node); its results and the pace the coordinator asks of the
        sender (:mod:`stoker.coordinator.pacing`)."""
        r = self._call("Batch", pb.BatchRequest(calls=calls, sender=sender), cancel)
        return list(r.results), float(r.pace)

    def checkpoint(self, epoch: int, batches: int) -> tuple[str, dict[str, Any]]:
        """``(name, snapshot)`` of the moment every rank had handed out ``batches``
        batches of ``epoch``; the coordinator also stores it under its state URL."""
        r = self._call("Checkpoint", pb.CheckpointRequest(epoch=epoch, batches=batches))
        return str(r.name), dict(json.loads(r.snapshot_json))

    def report_local(self, consumer: int, epoch: int, ranges: list[tuple[int, int]]) -> None:
        """The positions of ``epoch`` whose data the consumer's node caches."""
        self._call(
            "Local",
            pb.LocalRequest(
                consumer=consumer,
                epoch=epoch,
                ranges=[pb.Range(start=a, end=b) for a, b in ranges],
            ),
        )

    def status(self) -> Status:
        r = self._call("Status", pb.StatusRequest())
        return Status(
            epoch=int(r.epoch),
            world=int(r.world),
            num_samples=int(r.num_samples),
            origin=str(r.origin),
            stream=str(r.stream),
            quota=int(r.quota),
            consumed=int(r.consumed),
            live_consumers=int(r.live_consumers),
            steals=int(r.steals),
            requeued=int(r.requeued),
        )

    def dataset(self) -> tuple[str, bytes, bytes]:
        """``(url, manifest_json, index)``: the metadata service
        (``TokenDataset(..., metadata=client)``)."""
        r = self._call("Dataset", pb.DatasetRequest())
        return str(r.url), bytes(r.manifest_json), bytes(r.index)

    def offer(self, address: str, rows_per_second: float, leaving: bool = False) -> None:
        """A preprocessing worker at ``address`` is up (or leaving)."""
        self._call(
            "Offer",
            pb.OfferRequest(address=address, rows_per_second=rows_per_second, leaving=leaving),
        )

    def pool(self, reader: int, rows_per_second: float) -> list[str]:
        """The preprocessing workers up; reader ``reader`` consumes ``rows_per_second``."""
        r = self._call("Pool", pb.PoolRequest(reader=reader, rows_per_second=rows_per_second))
        return [str(a) for a in r.addresses]

    def close(self) -> None:
        if self._channel is not None and self._pid == os.getpid():
            self._channel.close()
        self._channel = self._stub = None
        if self._link is not None:
            self._link.close()
