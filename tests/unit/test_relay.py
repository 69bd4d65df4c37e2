"""The relay's gathering: whole requests in order, one message in flight, what arrives
meanwhile in the next one (a stand-in coordinator client that answers each call with
its own position, so a misrouted answer shows)."""

from __future__ import annotations

import threading
from collections import deque
from typing import Any

import pytest

from stoker._proto import coordinator_pb2 as pb
from stoker.coordinator.relay import Relay, _Waiting, take
from stoker.errors import CoordinatorUnavailable


def lease(consumer: int) -> pb.Call:
    return pb.Call(lease=pb.LeaseRequest(consumer=consumer, epoch=0))


class Held:
    """Answers a message once let go (``go``); records each message's consumers."""

    address = "127.0.0.1:1"
    timeout = 1.0
    retry_for = 1.0

    def __init__(self) -> None:
        self.messages: list[list[int]] = []
        self.began = threading.Semaphore(0)
        self.go = threading.Semaphore(0)
        self.fail: BaseException | None = None

    def batch(self, calls: list[pb.Call], cancel: Any = None) -> list[pb.Result]:
        self.messages.append([c.lease.consumer for c in calls])
        self.began.release()
        assert self.go.acquire(timeout=10)
        if self.fail is not None:
            raise self.fail
        return [pb.Result(lease=pb.LeaseReply(lease=c.lease.consumer * 10)) for c in calls]


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

    first = threading.Thread(target=ask, args=([1],))
    first.start()
    assert client.began.acquire(timeout=10)  # message 1 is out, carrying consumer 1 only
    later = [threading.Thread(target=ask, args=(c,)) for c in ([2, 3], [4])]
    for t in later:
        t.start()
    # both wait in the relay's queue (its condition) before message 1 is let go
    for _ in range(500):
        with relay._cv:
            if sum(len(w.calls) for w in relay._queue) == 3:
                break
        threading.Event().wait(0.01)
    client.go.release()
    assert client.began.acquire(timeout=10)
    client.go.release()
    for t in [first, *later]:
        t.join(10)
    relay.close()
    assert client.messages[0] == [1]
    assert sorted(client.messages[1]) == [2, 3, 4] and len(client.messages) == 2
    assert got == {1: [10], 2: [20, 30], 4: [40]}  # each its own answers, in its order
    assert (relay.messages, relay.calls) == (2, 4)


def test_a_message_that_fails_fails_each_of_its_callers() -> None:
    client = Held()
    client.fail = CoordinatorUnavailable("coordinator at 127.0.0.1:1 did not answer")
    relay = Relay(client, tick=0.0)  # type: ignore[arg-type]
    client.go.release()
    with pytest.raises(CoordinatorUnavailable, match="did not answer"):
        relay.call([lease(1)])
    relay.close()
    assert relay.messages == 0
