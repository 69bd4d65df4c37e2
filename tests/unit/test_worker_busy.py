"""A DataLoader worker's busy seconds (stoker.observe.export.busy_seconds), case by case."""

from __future__ import annotations

import pytest

from stoker.observe.export import busy_seconds


@pytest.mark.parametrize(
    ("inside", "outside_cpu", "cpu", "delay", "alive", "others", "want", "case"),
    [
        # a costly transform outside the iterator, a core of its own: its CPU time
        (0.1, 8.0, 8.1, 0.0, 10.0, 0.0, 8.1, "transform, idle machine"),
        # the same transform sharing its core: the run-queue wait is work it wanted to do
        (0.1, 4.0, 4.1, 4.0, 10.0, 0.0, 8.1, "transform, contended core"),
        # the iterator blocked on storage 5 s of its 6: no delay is moved outside
        (6.0, 0.2, 1.2, 0.0, 10.0, 0.0, 6.2, "storage-bound iterator"),
        # the iterator preempted 2 s (in its wall time already): not counted twice
        (6.0, 0.0, 4.0, 2.0, 10.0, 0.0, 6.0, "preempted inside"),
        # idle: waiting for the parent's requests takes no CPU and no run-queue time
        (0.5, 0.1, 0.6, 0.0, 10.0, 0.0, 0.6, "idle worker"),
        # the queue's feeder thread pickling each batch after the hand-over: work too
        (0.5, 0.1, 0.6, 0.0, 10.0, 0.4, 1.0, "feeder thread"),
        # never more than the worker lived
        (3.0, 5.0, 8.0, 5.0, 10.0, 0.0, 10.0, "capped"),
    ],
)
def test_busy_seconds(
    inside: float,
    outside_cpu: float,
    cpu: float,
    delay: float,
    alive: float,
    others: float,
    want: float,
    case: str,
) -> None:
    assert busy_seconds(inside, outside_cpu, cpu, delay, alive, others) == pytest.approx(want), case
