"""The coordinator's table of the preprocessing pool (pure): workers offered and gone,
trainers' demand, and the workers that demand needs."""

from __future__ import annotations

import pytest

from stoker.coordinator.pool import PoolTable


def test_workers_are_listed_in_the_order_they_came_until_silent_or_leaving() -> None:
    t = PoolTable(timeout=10)
    t.offer("a:1", 100, now=0)
    t.offer("b:2", 50, now=1)
    assert t.ask(7, 0, now=2) == ["a:1", "b:2"]
    t.offer("a:1", 120, now=5)  # (offered again: keeps its place)
    assert t.ask(7, 0, now=10.5) == ["a:1", "b:2"]
    assert t.ask(7, 0, now=11.5) == ["a:1"]  # b silent for 10.5 s
    t.offer("a:1", 0, now=12, leaving=True)
    assert t.ask(7, 0, now=12) == []


def test_the_workers_needed_are_the_demand_over_the_mean_worker_rate() -> None:
    t = PoolTable(timeout=10)
    assert t.needed(now=0) == 0.0  # no demand
    t.ask(1, 300, now=0)
    assert t.needed(now=0) == 1.0  # demand, no worker rate known: at least one
    t.offer("a:1", 100, now=0)
    t.offer("b:2", 200, now=0)
    t.ask(2, 150, now=0)  # two trainers: 450 rows/s against 150 a worker
    assert t.needed(now=0) == pytest.approx(3.0)
    assert t.needed_whole(now=0) == 3
    t.ask(2, 160, now=0)  # a trainer's rate is replaced, not added
    assert t.needed(now=0) == pytest.approx(460 / 150)
    assert t.needed_whole(now=0) == 4
    assert t.needed(now=10.5) == 0.0  # all silent: forgotten
