"""The relay's gathering: whole requests in order, one message in flight, what arrives
meanwhile in the next one (a stand-in coordinator client that answers each call with
its own position, so a misrouted answer shows)."""

from __future__ import annotations

import threading
import time
from collections import deque
from typing import Any

import pytest

from stoker._proto import agent_pb2 as apb
from stoker._proto import coordinator_pb2 as pb
from stoker.coordinator.pacing import MAX_PACE, Pacer
from stoker.coordinator.relay import Relay, Relays, _Waiting, take
from stoker.errors import AgentError, CoordinatorUnavailable


def lease(consumer: int) -> pb.Call:
    return pb.Call(lease=pb.LeaseRequest(consumer=consumer, epoch=0))


class Held:
    """Answers a message once let go (``go``); records each message's consumers."""

    address = "127.0.0.1:1"
    timeout = 1.0
    retry_for = 1.0

    def __init__(self, pace: float = 0.0) -> None:
        self.messages: list[list[int]] = []
        self.began = threading.Semaphore(0)
        self.go = threading.Semaphore(0)
        self.fail: BaseException | None = None
        self.pace = pace
        self.times: list[float] = []
        self.senders: list[str] = []

    def send_batch(
        self, calls: list[pb.Call], cancel: Any = None, sender: str = ""
    ) -> tuple[list[pb.Result], float]:
        self.times.append(time.monotonic())
        self.senders.append(sender)
        self.messages.append([c.lease.consumer for c in calls])
        self.began.release()
        assert self.go.acquire(timeout=10)
        if self.fail is not None:
            raise self.fail
        results = [pb.Result(lease=pb.LeaseReply(lease=c.lease.consumer * 10)) for c in calls]
        return results, self.pace

    def close(self) -> None:
        pass


def test_take_keeps_requests_whole_and_in_order_within_the_limit() -> None:
    q = deque(_Waiting([lease(i)] * n) for i, n in enumerate([3, 2, 4, 1]))
    first = take(q, limit=5)
    assert [len(w.calls) for w in first] == [3, 2]
    assert [len(w.calls) for w in take(q, limit=5)] == [4, 1]
    q = deque([_Waiting([lease(0)] * 9), _Waiting([lease(1)])])
    assert [len(w.calls) for w in take(q, limit=5)] == [9]  # a large one goes alone
    assert take(deque(), limit=5) == []


def test_calls_arriving_while_a_message_is_out_go_together_in_the_next() -> None:
    client = Held()
    relay = Relay(client, tick=0.0)  # type: ignore[arg-type]
    got: dict[int, list[int]] = {}

    def ask(consumers: list[int]) -> None:
        results = relay.call([lease(c) for c in consumers])
        got[consumers[0]] = [r.lease.lease for r in results]

    two_messages(relay, client, ask, [1], [[2, 3], [4]], queued=3)
    assert client.messages[0] == [1]
    assert sorted(client.messages[1]) == [2, 3, 4] and len(client.messages) == 2
    assert got == {1: [10], 2: [20, 30], 4: [40]}  # each its own answers, in its order
    assert (relay.messages, relay.calls) == (2, 4)


def test_a_message_that_fails_fails_each_of_its_callers() -> None:
    client = Held()
    client.fail = CoordinatorUnavailable("coordinator at 127.0.0.1:1 did not answer")
    relay = Relay(client, tick=0.0)  # type: ignore[arg-type]
    errors: list[BaseException] = []

    def ask(c: int) -> None:
        try:
            relay.call([lease(c)])
        except BaseException as exc:
            errors.append(exc)

    two_messages(relay, client, ask, 1, [2, 3], queued=2)
    assert len(errors) == 3 and all(isinstance(e, CoordinatorUnavailable) for e in errors)
    assert client.messages == [[1], [2, 3]] and relay.messages == 0


def two_messages(
    relay: Relay, client: Held, ask: Any, first: Any, later: list[Any], queued: int
) -> None:
    """``ask(first)`` goes out alone in message 1; while it is out, ``ask`` of each of
    ``later`` waits (``queued`` calls in all), then goes in message 2; the relay closed."""
    one = threading.Thread(target=ask, args=(first,))
    one.start()
    assert client.began.acquire(timeout=10)  # message 1 is out, carrying the first only
    rest = [threading.Thread(target=ask, args=(x,)) for x in later]
    for t in rest:
        t.start()
    wait_queued(relay, queued)  # they wait in the relay's queue before message 1 is let go
    client.go.release()
    assert client.began.acquire(timeout=10)
    client.go.release()
    for t in [one, *rest]:
        t.join(10)
    relay.close()


def wait_queued(relay: Relay, n: int) -> None:
    """Until ``n`` calls wait in ``relay``'s queue (polled: the queue is the state)."""
    for _ in range(1000):
        with relay._cv:
            if sum(len(w.calls) for w in relay._queue) == n:
                return
        time.sleep(0.01)
    raise AssertionError(f"{n} calls never waited")


def test_the_coordinators_pace_spaces_a_senders_messages() -> None:
    client = Held(pace=0.3)
    relay = Relay(client, tick=0.0, sender="node-a")  # type: ignore[arg-type]
    for _ in range(3):
        client.go.release()
    for c in range(3):
        relay.call([lease(c)])
    relay.close()
    gaps = [b - a for a, b in zip(client.times, client.times[1:], strict=False)]
    assert len(gaps) == 2 and min(gaps) >= 0.3  # a lower bound: load only lengthens it
    assert client.senders == ["node-a"] * 3


def test_a_closed_relay_refuses_with_an_agent_error() -> None:
    relay = Relay(Held(), tick=0.0)  # type: ignore[arg-type]
    relay.close()
    with pytest.raises(AgentError, match="stopping"):
        relay.call([lease(1)])


def test_a_message_given_up_by_the_agent_stopping_is_an_agent_error() -> None:
    client = Held()
    client.fail = CoordinatorUnavailable("given up")  # what the cancelled client raises
    relay = Relay(client, tick=0.0)  # type: ignore[arg-type]
    errors: list[BaseException] = []
    t = threading.Thread(target=lambda: errors.append(_raises(relay, [lease(1)])))
    t.start()
    assert client.began.acquire(timeout=10)
    closing = threading.Thread(target=relay.close)
    closing.start()
    for _ in range(1000):  # the relay is marked closed before the message comes back
        if relay._closed:
            break
        time.sleep(0.01)
    client.go.release()
    t.join(10)
    closing.join(10)
    assert isinstance(errors[0], AgentError), errors  # the process calls directly then


def _raises(relay: Relay, calls: list[pb.Call]) -> BaseException | None:
    try:
        relay.call(calls)
    except BaseException as exc:
        return exc
    return None


def test_pace_is_senders_over_the_budget_and_the_silent_are_forgotten() -> None:
    p = Pacer(budget=100.0, window=10.0)
    assert p.heard("", 0.0) == 0.0  # an unnamed sender is not counted
    for k in range(50):
        pace = p.heard(f"n{k}", 1.0)
    assert pace == pytest.approx(0.5) and p.senders == 50
    assert p.heard("n0", 5.0) == pytest.approx(0.5)  # heard again: counted once
    # past the window only the one heard since is left
    assert p.heard("n0", 12.0) == pytest.approx(0.01) and p.senders == 1
    assert Pacer(budget=0.0).heard("n0", 0.0) == 0.0  # no budget: no pace
    many = Pacer(budget=100.0)
    for k in range(1000):
        pace = many.heard(f"n{k}", 0.0)
    assert pace == MAX_PACE  # past the budget: the wait is bounded, not the rate


def test_relays_key_by_coordinator_token_and_settings_and_refuse_once_closed() -> None:
    relays = Relays()
    with pytest.raises(AgentError, match="timeout > 0"):
        relays.call(apb.Relay(coordinator="127.0.0.1:1", calls=[], timeout=0, retry_for=1))
    with pytest.raises(AgentError, match="names no coordinator"):
        relays.call(apb.Relay(timeout=1, retry_for=1))
    with pytest.raises(AgentError, match="not None"):
        relays.call(apb.Relay(coordinator="127.0.0.1:1", calls=[pb.Call().SerializeToString()],
                              timeout=1, retry_for=0))  # fmt: skip
    a = relays._relay(apb.Relay(coordinator="127.0.0.1:1", token="t", timeout=1, retry_for=0))
    b = relays._relay(apb.Relay(coordinator="127.0.0.1:1", token="t", timeout=2, retry_for=0))
    c = relays._relay(apb.Relay(coordinator="127.0.0.1:1", token="t", timeout=1, retry_for=0))
    assert a is c and a is not b and len(relays) == 2
    assert a.client.token == "t" and not a.client.look_up  # the agent never looks one up
    relays.close()
    with pytest.raises(AgentError, match="stopping"):
        relays._relay(apb.Relay(coordinator="127.0.0.1:1", timeout=1, retry_for=0))


def test_an_idle_relay_is_closed_when_another_is_made(monkeypatch: pytest.MonkeyPatch) -> None:
    relays = Relays()
    a = relays._relay(apb.Relay(coordinator="127.0.0.1:1", timeout=1, retry_for=0))
    monkeypatch.setattr("stoker.coordinator.relay.IDLE_SECONDS", 0.0)
    a.used -= 1.0
    relays._relay(apb.Relay(coordinator="127.0.0.1:2", timeout=1, retry_for=0))
    assert len(relays) == 1 and a._closed
    relays.close()


def test_calls_whose_caller_left_before_their_message_are_dropped() -> None:
    client = Held()
    relay = Relay(client, tick=0.0)  # type: ignore[arg-type]
    first = threading.Thread(target=lambda: relay.call([lease(1)]))
    first.start()
    assert client.began.acquire(timeout=10)  # message 1 out
    left = threading.Event()
    errors: list[BaseException] = []

    def ask() -> None:
        try:
            relay.call([lease(2)], gone=left.is_set)
        except BaseException as exc:
            errors.append(exc)

    later = threading.Thread(target=ask)
    later.start()
    wait_queued(relay, 1)
    left.set()  # its process gave up (closed its connection)
    later.join(10)
    assert isinstance(errors[0], AgentError) and relay.dropped == 1
    client.go.release()  # message 1 back; nothing else waits
    first.join(10)
    relay.close()
    assert client.messages == [[1]]  # consumer 2's lease was never sent


def test_the_agent_sees_a_reader_that_hung_up_while_its_answer_is_due() -> None:
    import socket

    from stoker.cache.server import _hung_up

    a, b = socket.socketpair()
    try:
        assert not _hung_up(a)  # open, nothing sent
        a.settimeout(None)
        assert not _hung_up(a)  # (a blocking socket is not blocked by the look)
        b.close()
        assert _hung_up(a)
    finally:
        a.close()
