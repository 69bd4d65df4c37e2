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
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

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
#: How often a call waiting for its message checks that its caller is still there.
WATCH_SECONDS = 0.5
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
    message at a time, at most one begun per ``tick`` or per the pace the coordinator
    asks (:mod:`stoker.coordinator.pacing`), whichever is longer; ``sender`` names the
    node to the coordinator."""

    def __init__(
        self,
        client: CoordinatorClient,
        counters: Counters | None = None,
        tick: float = TICK,
        sender: str = "",
    ) -> None:
        self.client = client
        self.counters = counters
        self.tick = tick
        self.sender = sender
        self.pace = 0.0  # the coordinator's, from its last answer
        self.used = time.monotonic()  # the last call's arrival
        self._queue: deque[_Waiting] = deque()
        self._cv = threading.Condition()
        self._closed = False
        self._cancel = threading.Event()  # closing: a message being retried is given up
        self.messages = 0
        self.calls = 0
        self.dropped = 0  # calls whose caller left before they were sent
        self._thread = threading.Thread(target=self._run, daemon=True, name="stoker-relay")
        self._thread.start()

    def call(self, calls: list[pb.Call], gone: Callable[[], bool] | None = None) -> list[pb.Result]:
        """The answers of ``calls``, each as the coordinator gave it (an answer or a
        ``CallError``), once the message carrying them came back. Raises what the
        message raised (CoordinatorUnavailable past the client's ``retry_for``), and
        AgentError once the relay stops. ``gone()`` says the caller left (its process
        gave up and calls the coordinator itself): calls not yet sent are then dropped
        (a Lease sent late could take positions for a reader that no longer asks)."""
        w = _Waiting(calls)
        with self._cv:
            if self._closed:
                raise AgentError("the agent is stopping: its relay carries no more calls")
            self.used = time.monotonic()
            self._queue.append(w)
            self._cv.notify_all()
        while not w.done.wait(WATCH_SECONDS):
            if not self._thread.is_alive():
                raise AgentError("the agent's relay thread ended")
            if gone is not None and gone():
                with self._cv:
                    if w in self._queue:  # not taken into a message yet
                        self._queue.remove(w)
                        self.dropped += len(w.calls)
                        if self.counters is not None:
                            self.counters.add("relay_dropped", len(w.calls))
                        raise AgentError("the caller left before its calls were sent")
        if w.error is not None:
            raise w.error
        return w.results

    def _next(self, last: float) -> list[_Waiting] | None:
        with self._cv:
            while not self._queue and not self._closed:
                self._cv.wait()
            if not self._queue:
                return None
            # at most one message begun per tick (or pace): what arrives meanwhile goes with it
            every = max(self.tick, self.pace)
            while (left := last + every - time.monotonic()) > 0 and not self._closed:
                self._cv.wait(left)
            return take(self._queue)

    def _run(self) -> None:
        last = 0.0
        while (batch := self._next(last)) is not None:
            last = time.monotonic()
            calls = [c for w in batch for c in w.calls]
            try:
                results, self.pace = self.client.send_batch(calls, self._cancel, self.sender)
                if len(results) != len(calls):
                    raise AgentError(
                        f"the coordinator at {self.client.address} answered {len(results)} "
                        f"of {len(calls)} calls"
                    )
            except BaseException as exc:  # every waiter learns it
                # given up by the agent stopping, not by the coordinator
                stopped = AgentError("the agent stopped before the coordinator answered")
                for w in batch:
                    w.error = stopped if self._closed else exc
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

    def idle(self, now: float) -> float:
        """Seconds since the last call came, 0 while calls wait."""
        with self._cv:
            return 0.0 if self._queue else now - self.used

    def close(self) -> None:
        """Stop: what waits gets AgentError (its process then calls the coordinator
        itself), a message being retried is given up."""
        with self._cv:
            self._closed = True
            self._cv.notify_all()
        self._cancel.set()
        self._thread.join(timeout=self.client.timeout + 1.0)
        self.client.close()


#: A relay that carried nothing for this long is closed (its job is over).
IDLE_SECONDS = 300.0


class Relays:
    """An agent's relays, one per coordinator, token and client settings, made at their
    first call and closed once idle for :data:`IDLE_SECONDS`. The agent never looks a
    token up itself: a call with none is sent with none."""

    def __init__(
        self, counters: Counters | None = None, tick: float = TICK, sender: str = ""
    ) -> None:
        self.counters = counters
        self.tick = tick
        self.sender = sender
        self._lock = threading.Lock()
        self._relays: dict[tuple[str, str, float, float], Relay] = {}
        self._closed = False

    def call(self, req: apb.Relay, gone: Callable[[], bool] | None = None) -> apb.Relayed:
        """Carry a process's Relay request; its answers in order (``gone``: see
        :meth:`Relay.call`)."""
        if not req.coordinator:
            raise AgentError("a relayed call names no coordinator")
        if not req.timeout > 0 or req.retry_for < 0:
            raise AgentError(
                f"a relayed call needs timeout > 0 and retry_for >= 0, got {req.timeout} and "
                f"{req.retry_for}"
            )
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
        return apb.Relayed(results=[r.SerializeToString() for r in relay.call(calls, gone)])

    def _relay(self, req: apb.Relay) -> Relay:
        from stoker.coordinator.client import CoordinatorClient

        key = (req.coordinator, req.token, req.timeout, req.retry_for)
        now = time.monotonic()
        with self._lock:
            if self._closed:
                raise AgentError("the agent is stopping: its relay carries no more calls")
            idle = [k for k, r in self._relays.items() if k != key and r.idle(now) > IDLE_SECONDS]
            gone = [self._relays.pop(k) for k in idle]
            relay = self._relays.get(key)
            if relay is None:
                client = CoordinatorClient(
                    req.coordinator,
                    req.token or None,
                    timeout=req.timeout,
                    retry_for=req.retry_for,
                    look_up=False,
                )
                relay = self._relays[key] = Relay(client, self.counters, self.tick, self.sender)
        for r in gone:
            r.close()
        return relay

    def __len__(self) -> int:
        with self._lock:
            return len(self._relays)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            relays, self._relays = list(self._relays.values()), {}
        for r in relays:
            r.close()


# -- a process's side ------------------------------------------------------------------
class _Conn:
    """One thread's connection to the agent, in the process that opened it."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.pid = os.getpid()
        self.next_id = 1
        self.closed = False


#: Seconds past its client's ``timeout`` a process waits for the agent's answer before it
#: calls the coordinator itself: well within the coordinator's consumer timeout (30 s),
#: so a stopped agent does not let its node's consumers expire.
LINK_GRACE = 10.0


class RelayLink:
    """A process's connections to its node agent's relay (at the socket ``path``): one
    per thread (the Confirmer's thread and the readers' do not wait for each other),
    opened at its first call in each process."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._local = threading.local()
        self._all: list[_Conn] = []  # every thread's, to close
        self._all_lock = threading.Lock()
        self._off_until = 0.0  # calls go to the coordinator directly until then
        self._unsupported = False  # the agent does not relay (an older one)
        self._said: set[str] = set()  # what was logged once
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
        did not carry them (make them directly: whatever the agent's trouble, the
        process may fare better). Raises CoordinatorUnavailable at once when ``cancel``
        is set while it waits."""
        if not self.usable():
            self.direct += len(calls)
            return None
        req = apb.Request(
            relay=apb.Relay(
                coordinator=address,
                token=token or "",
                calls=[c.SerializeToString() for c in calls],
                timeout=timeout,
                retry_for=retry_for,
            )
        )
        try:
            resp = self._exchange(req, timeout + LINK_GRACE, cancel)
        except CoordinatorUnavailable:
            raise  # given up (cancel): the caller stops
        except (OSError, wire.ProtocolError) as exc:
            self._drop()
            self._off_until = time.monotonic() + RETRY_SECONDS
            self._say("link", f"the agent at {self.path} did not carry coordinator calls ({exc})")
            self.direct += len(calls)
            return None
        if resp.error:
            if resp.error_kind == "AgentError" and resp.error.startswith("unknown request"):
                self._unsupported = True  # an agent that does not relay
            else:  # the coordinator away or refusing the message: the process tries itself
                self._off_until = time.monotonic() + RETRY_SECONDS
            self._say(resp.error_kind, f"the agent at {self.path} did not carry: {resp.error}")
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

    def _say(self, what: str, text: str) -> None:
        if what not in self._said:
            self._said.add(what)
            log.info("%s; calling the coordinator directly for now", text)

    def _conn(self) -> _Conn:
        conn: _Conn | None = getattr(self._local, "conn", None)
        if conn is not None and conn.pid == os.getpid() and not conn.closed:
            return conn
        if conn is not None and not conn.closed:  # a parent's (forked): this copy goes
            with contextlib.suppress(OSError):
                conn.sock.close()
            self._local.conn = None
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
        conn = self._local.conn = _Conn(sock)
        with self._all_lock:
            self._all = [c for c in self._all if c.pid == conn.pid] + [conn]
        return conn

    def _exchange(
        self, req: apb.Request, wait: float, cancel: threading.Event | None
    ) -> apb.Response:
        conn = self._conn()
        req.id = conn.next_id
        conn.next_id += 1
        wire.send(conn.sock, req)
        deadline = time.monotonic() + wait
        poll = select.poll()  # (select() cannot watch a descriptor above 1023)
        poll.register(conn.sock, select.POLLIN)
        while not poll.poll(100):  # the answer may take a while: wait, but stay cancellable
            if cancel is not None and cancel.is_set():
                self._drop()  # its answer would come on this connection: not used again
                raise CoordinatorUnavailable(f"{self.path}: the relayed call was given up")
            if time.monotonic() > deadline:
                raise wire.ProtocolError(f"no answer from the agent in {wait:.0f} s")
        resp = wire.recv(conn.sock, apb.Response, wire.MAX_FRAME, 30.0)
        if resp.id != req.id:
            raise wire.ProtocolError(f"answer {resp.id} to request {req.id}")
        return resp

    def _drop(self) -> None:
        conn: _Conn | None = getattr(self._local, "conn", None)
        self._local.conn = None
        if conn is not None and conn.pid == os.getpid():
            conn.closed = True
            with contextlib.suppress(OSError):
                conn.sock.close()

    def close(self) -> None:
        """Close every thread's connection of this process (a later call opens anew)."""
        self._local.conn = None
        with self._all_lock:
            mine = [c for c in self._all if c.pid == os.getpid()]
            self._all = []
        for c in mine:
            c.closed = True
            with contextlib.suppress(OSError):
                c.sock.close()
