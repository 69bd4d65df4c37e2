"""A node's coordinator calls in one message per tick, carried by its node agent.

Every loader worker asks the coordinator for leases and reports its read position
(Lease, Heartbeat), and every rank confirms its batches (ConfirmBatch). Sent by each
process, the coordinator's load grows with processes: 1,024 nodes x 8 ranks x 2
workers are 16,384 callers. Given ``relay=`` (the node agent's socket), a
:class:`~stoker.coordinator.client.CoordinatorClient` hands those calls to the agent
instead (:class:`RelayLink`), which sends the calls of all its node's processes in one
``Batch`` message (:class:`Relay`): at most one message in flight per node and
coordinator, and at most one begun per :data:`TICK`. Calls that arrive while a message
is out wait for the next one, so the coordinator's load grows with nodes, and a lone
call waits for no tick.

Every call is safe to repeat (:mod:`stoker.coordinator.leases`), so when the agent
does not answer (gone, restarting, an older agent) a process makes its calls itself
and tries the agent again :data:`RETRY_SECONDS` later; nothing is lost either way.
The coordinator's answers and refusals come back per call, as a direct call's would.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import socket
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from stoker import errors
from stoker._proto import agent_pb2 as apb
from stoker._proto import coordinator_pb2 as pb
from stoker.cache import wire
from stoker.errors import AgentError, CoordinatorUnavailable

if TYPE_CHECKING:
    from stoker.coordinator.client import CoordinatorClient
    from stoker.observe.agent import Counters

log = logging.getLogger("stoker.relay")

#: A node begins at most one message per tick to a coordinator. 5 ms: a lease asked
#: for half way through the one before (the reader's usual case) waits for nothing it
#: would notice, while 1,024 nodes send at most 204,800 messages a second between them,
#: and in practice one per coordinator round trip each.
TICK = 0.005
#: The most calls one message carries (a node's 16 consumers and 8 ranks send far fewer).
MAX_CALLS = 4096
#: After the agent failed to carry a call, a process calls the coordinator itself for
#: this long before it tries the agent again.
RETRY_SECONDS = 5.0
#: The kinds of call a relay carries (the coordinator's Batch takes these).
KINDS = frozenset({"lease", "heartbeat", "confirm", "confirm_batch"})


# -- the agent's side ------------------------------------------------------------------
@dataclass(eq=False)
class _Waiting:
    """One process's calls, waiting for their message's answer."""

    calls: list[pb.Call]
    results: list[pb.Result] = field(default_factory=list)
    error: BaseException | None = None
    done: threading.Event = field(default_factory=threading.Event)


def take(queue: deque[_Waiting], limit: int = MAX_CALLS) -> list[_Waiting]:
    """The waiting requests the next message carries: in order of arrival, whole, up to
    ``limit`` calls (at least the first request, however many it holds)."""
    out: list[_Waiting] = []
    n = 0
    while queue and (not out or n + len(queue[0].calls) <= limit):
        w = queue.popleft()
        out.append(w)
        n += len(w.calls)
    return out


class Relay:
    """The calls of a node's processes to one coordinator (as ``client``), one ``Batch``
    message at a time, at most one begun per ``tick``."""

    def __init__(
        self, client: CoordinatorClient, counters: Counters | None = None, tick: float = TICK
    ) -> None:
        self.client = client
        self.counters = counters
        self.tick = tick
        self._queue: deque[_Waiting] = deque()
        self._cv = threading.Condition()
        self._closed = False
        self._cancel = threading.Event()  # closing: a message being retried is given up
        self.messages = 0
        self.calls = 0
        self._thread = threading.Thread(target=self._run, daemon=True, name="stoker-relay")
        self._thread.start()

    def call(self, calls: list[pb.Call]) -> list[pb.Result]:
        """The answers of ``calls``, each as the coordinator gave it (an answer or a
        ``CallError``), once the message carrying them came back. Raises what the
        message raised (CoordinatorUnavailable past the client's ``retry_for``)."""
        w = _Waiting(calls)
        with self._cv:
            if self._closed:
                raise AgentError("the agent is stopping: its relay carries no more calls")
            self._queue.append(w)
            self._cv.notify_all()
        w.done.wait()
        if w.error is not None:
            raise w.error
        return w.results

    def _next(self, last: float) -> list[_Waiting] | None:
        with self._cv:
            while not self._queue and not self._closed:
                self._cv.wait()
            if not self._queue:
                return None
            # at most one message begun per tick: what arrives meanwhile goes with it
            while (left := last + self.tick - time.monotonic()) > 0 and not self._closed:
                self._cv.wait(left)
            return take(self._queue)

    def _run(self) -> None:
        last = 0.0
        while (batch := self._next(last)) is not None:
            last = time.monotonic()
            calls = [c for w in batch for c in w.calls]
            try:
                results = self.client.batch(calls, self._cancel)
                if len(results) != len(calls):
                    raise AgentError(
                        f"the coordinator at {self.client.address} answered {len(results)} "
                        f"of {len(calls)} calls"
                    )
            except BaseException as exc:  # every waiter learns it
                for w in batch:
                    w.error = exc
                    w.done.set()
                continue
            self.messages += 1
            self.calls += len(calls)
            if self.counters is not None:
                self.counters.add("relay_messages")
                self.counters.add("relay_calls", len(calls))
            i = 0
            for w in batch:
                w.results = results[i : i + len(w.calls)]
                i += len(w.calls)
                w.done.set()

    def close(self) -> None:
        """Stop: what waits is sent once more, a message the coordinator does not answer
        is given up (its waiters get CoordinatorUnavailable and call it themselves)."""
        with self._cv:
            self._closed = True
            self._cv.notify_all()
        self._cancel.set()
        self._thread.join(timeout=self.client.timeout + 1.0)


class Relays:
    """An agent's relays, one per coordinator and token, made at their first call."""

    def __init__(self, counters: Counters | None = None, tick: float = TICK) -> None:
        self.counters = counters
        self.tick = tick
        self._lock = threading.Lock()
        self._relays: dict[tuple[str, str], Relay] = {}

    def call(self, req: apb.Relay) -> apb.Relayed:
        """Carry a process's Relay request; its answers in order."""
        if not req.coordinator:
            raise AgentError("a relayed call names no coordinator")
        calls = []
        for raw in req.calls:
            call = pb.Call()
            try:
                call.ParseFromString(raw)
            except Exception as exc:  # protobuf's DecodeError
                raise wire.ProtocolError(f"malformed relayed call: {exc}") from None
            kind = call.WhichOneof("kind")
            if kind not in KINDS:
                raise AgentError(f"a relay carries {', '.join(sorted(KINDS))} calls, not {kind}")
            calls.append(call)
        relay = self._relay(req)
        return apb.Relayed(results=[r.SerializeToString() for r in relay.call(calls)])

    def _relay(self, req: apb.Relay) -> Relay:
        from stoker.coordinator.client import CoordinatorClient

        key = (req.coordinator, req.token)
        with self._lock:
            relay = self._relays.get(key)
            if relay is None:
                client = CoordinatorClient(
                    req.coordinator,
                    req.token or None,
                    timeout=req.timeout if req.timeout > 0 else 10.0,
                    retry_for=req.retry_for if req.retry_for >= 0 else 120.0,
                )
                relay = self._relays[key] = Relay(client, self.counters, self.tick)
            return relay

    def close(self) -> None:
        with self._lock:
            relays, self._relays = list(self._relays.values()), {}
        for r in relays:
            r.close()
            r.client.close()


# -- a process's side ------------------------------------------------------------------
class RelayLink:
    """A process's connection to its node agent's relay (at the socket ``path``), opened
    at the first call in each process; calls from several threads take turns."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._pid: int | None = None
        self._sock: socket.socket | None = None
        self._next_id = 1
        self._off_until = 0.0  # calls go to the coordinator directly until then
        self._unsupported = False  # the agent does not relay (an older one)
        self.relayed = 0  # calls the agent carried for this process
        self.direct = 0  # calls this process made itself because the agent did not

    def usable(self) -> bool:
        """Whether to try the agent now (not while it failed recently)."""
        return not self._unsupported and time.monotonic() >= self._off_until

    def call(
        self,
        address: str,
        token: str | None,
        calls: list[pb.Call],
        *,
        timeout: float,
        retry_for: float,
        cancel: threading.Event | None = None,
    ) -> list[pb.Result] | None:
        """The coordinator's answers to ``calls`` through the agent; None when the agent
        did not carry them (make them directly). Raises CoordinatorUnavailable when the
        agent could not reach the coordinator for ``retry_for`` seconds, or at once when
        ``cancel`` is set while waiting."""
        req = apb.Request(
            relay=apb.Relay(
                coordinator=address,
                token=token or "",
                calls=[c.SerializeToString() for c in calls],
                timeout=timeout,
                retry_for=retry_for,
            )
        )
        with self._lock:
            if not self.usable():
                self.direct += len(calls)
                return None
            try:
                resp = self._exchange(req, retry_for + timeout + 30.0, cancel)
            except (OSError, wire.ProtocolError) as exc:
                self._drop()
                self._off_until = time.monotonic() + RETRY_SECONDS
                log.info("the agent at %s did not carry coordinator calls (%s)", self.path, exc)
                self.direct += len(calls)
                return None
        if resp.error:
            err = errors.decode(resp.error_kind, resp.error)
            if isinstance(err, CoordinatorUnavailable):
                raise err
            if "unknown request" in resp.error:
                self._unsupported = True  # an agent that does not relay
            # a refusal of the whole message (a token the agent's client lacks, ...): the
            # direct call gets it with its own handling (looking for a newer token)
            self.direct += len(calls)
            return None
        out = []
        for raw in resp.relayed.results:
            r = pb.Result()
            r.ParseFromString(raw)
            out.append(r)
        if len(out) != len(calls):
            self.direct += len(calls)
            return None
        self.relayed += len(calls)
        return out

    def _connect(self) -> socket.socket:
        if self._sock is not None and self._pid == os.getpid():
            return self._sock
        self._sock = None  # a parent's connection (forked) is the parent's
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(5.0)
        try:
            sock.connect(self.path)
            hello = apb.Request(
                id=0, hello=apb.Hello(protocol=wire.PROTOCOL_VERSION, pid=os.getpid())
            )
            wire.send(sock, hello)
            resp = wire.recv(sock, apb.Response, wire.MAX_FRAME, 5.0)
        except BaseException:
            sock.close()
            raise
        if resp.error:
            sock.close()
            raise wire.ProtocolError(f"the agent refused the connection: {resp.error}")
        sock.settimeout(None)
        self._sock, self._pid = sock, os.getpid()
        return sock

    def _exchange(
        self, req: apb.Request, wait: float, cancel: threading.Event | None
    ) -> apb.Response:
        sock = self._connect()
        req.id = self._next_id
        self._next_id += 1
        wire.send(sock, req)
        deadline = time.monotonic() + wait
        while True:  # the answer may take the coordinator's restart: wait, but stay cancellable
            ready, _, _ = select.select([sock], [], [], 0.1)
            if ready:
                break
            if cancel is not None and cancel.is_set():
                self._drop()  # its answer would come on this connection: not used again
                raise CoordinatorUnavailable(f"{self.path}: the relayed call was given up")
            if time.monotonic() > deadline:
                raise wire.ProtocolError(f"no answer from the agent in {wait:.0f} s")
        resp = wire.recv(sock, apb.Response, wire.MAX_FRAME, 30.0)
        if resp.id != req.id:
            raise wire.ProtocolError(f"answer {resp.id} to request {req.id}")
        return resp

    def _drop(self) -> None:
        if self._sock is not None and self._pid == os.getpid():
            with contextlib.suppress(OSError):
                self._sock.close()
        self._sock = None

    def close(self) -> None:
        with self._lock:
            self._drop()
