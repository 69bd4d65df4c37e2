"""A worker makes a trainer stream's requests in their order (the trainer's plan), so
that its reader's plan keeps the blocks the requests still to come need: one that
comes early waits for those before it, within bounds."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import torch

from stoker.loader.batch import Field, Layout
from stoker.preprocess import worker
from stoker.preprocess.spec import WorkSpec
from stoker.preprocess.wire import Request
from stoker.preprocess.worker import _Stream

LAYOUT = Layout({"x": Field(torch.int64)})


class Reader:
    """Records what it is asked: each fill's ids, and each plan."""

    def __init__(self) -> None:
        self.filled: list[list[int]] = []
        self.plans = 0

    def plan(self, ids: np.ndarray) -> None:
        self.plans += 1

    def fill(self, ids: np.ndarray, out: dict[str, np.ndarray]) -> None:
        self.filled.append(ids.tolist())
        out["x"][...] = ids

    def close(self) -> None:
        pass


def request(ids: list[int], ahead: list[int], order: int) -> Request:
    return Request(WorkSpec("file:///d"), 0, ids, ahead, "s", order=order)


def waiting(stream: _Stream, n: int) -> None:
    """Until ``n`` requests wait for their turn (bounded)."""
    deadline = time.monotonic() + 30
    while len(stream.turn._waiters) < n:  # type: ignore[attr-defined]  # (CPython's)
        assert time.monotonic() < deadline, "the request never waited for its turn"
        time.sleep(0.001)


def test_a_request_that_comes_early_waits_for_those_before_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(worker, "ORDER_SECONDS", 60.0)  # (bounded by the test, not by it)
    reader = Reader()
    stream = _Stream(reader)
    got: dict[int, object] = {}
    late = [threading.Thread(target=lambda o=o, ids=ids: got.update({o: stream.make(
        request(ids, [], o), LAYOUT)})) for o, ids in ((3, [5, 6]), (2, [3, 4]))]  # fmt: skip
    for t in late:
        t.start()
    waiting(stream, 2)  # the second and the third came first, and wait
    assert reader.filled == []
    stream.make(request([1, 2], [3, 4, 5, 6], 1), LAYOUT)
    for t in late:
        t.join(30)
    assert reader.filled == [[1, 2], [3, 4], [5, 6]]
    assert reader.plans == 1  # (each came as planned: the blocks of all stayed planned)


def test_a_request_lost_on_the_way_is_waited_for_once_and_then_not(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(worker, "ORDER_SECONDS", 0.05)
    reader = Reader()
    stream = _Stream(reader)
    stream.make(request([1], [2, 3], 1), LAYOUT)
    stream.make(request([3], [], 3), LAYOUT)  # (2 never comes: made after the wait)
    stream.make(request([2], [], 2), LAYOUT)  # late: made at once
    assert reader.filled == [[1], [3], [2]]
    assert stream.next == 4


def test_a_stream_opened_again_does_not_wait_for_requests_long_gone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(worker, "ORDER_SECONDS", 60.0)
    reader = Reader()
    stream = _Stream(reader)  # (a stream let go and opened again: its count starts over)
    stream.make(request([9], [], 500), LAYOUT)  # far ahead of 1: made at once
    assert reader.filled == [[9]] and stream.next == 501
