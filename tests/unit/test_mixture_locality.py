"""stoker.mixture.locality: the positions of a mixture's epoch a node holds (pure)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stoker.mixture.locality import WINDOW_STEPS, local_ranges
from stoker.mixture.stream import encode

B = 4
W = WINDOW_STEPS  # steps of the least window


class Plan:
    """A mixture of two sources by turns of two positions; a sample's id in its source
    is its stream position. Counts the steps it is asked for."""

    def __init__(self, spe: int, world: int) -> None:
        self.spe, self.world = spe, world
        self.asked: list[tuple[int, int]] = []

    def position(self, step: int, steps: int) -> np.ndarray:
        """Every rank's stream positions of global steps ``[step, step + steps)``."""
        e, first = divmod(step, self.spe)
        per_rank = self.spe * B
        r = np.arange(self.world)[:, None, None]
        s = np.arange(first, first + steps)[None, :, None]
        j = np.arange(B)[None, None, :]
        return e * per_rank * self.world + r * per_rank + s * B + j

    def __call__(self, step: int, steps: int) -> np.ndarray:
        self.asked.append((step, steps))
        p = self.position(step, steps)
        return encode((p // 2) % 2, p)


def below(limit: int) -> Callable[[np.ndarray], np.ndarray]:
    """A source that holds its samples below ``limit``."""
    return lambda ids: np.asarray(ids) < limit


def test_windows_held_whole_or_by_the_threshold() -> None:
    spe, world = 4 * W, 2
    # source 0 held below 3 windows, source 1 below 2: windows 0-1 whole, 2 half, 3 none
    holds = [below(3 * W * B), below(2 * W * B)]
    assert local_ranges(Plan(spe, world), 0, spe, world, B, holds) == [(0, 3 * W * B)]
    got = local_ranges(Plan(spe, world), 0, spe, world, B, holds, threshold=0.75)
    assert got == [(0, 2 * W * B)]
    # every window held: one range over the shares of both ranks
    every = [below(10**9)] * 2
    assert local_ranges(Plan(spe, world), 0, spe, world, B, every) == [(0, spe * B * world)]
    assert local_ranges(Plan(spe, world), 0, spe, world, B, [below(0)] * 2) == []


def test_positions_are_those_of_the_epoch_asked() -> None:
    spe, world = 2 * W, 3
    per_rank = spe * B
    N = per_rank * world
    plan = Plan(spe, world)
    assert local_ranges(plan, 2, spe, world, B, [below(10**9)] * 2) == [(2 * N, 3 * N)]
    assert plan.asked == [(2 * spe, spe)]  # every rank's steps of epoch 2, in one call

    def second_share(ids: np.ndarray) -> np.ndarray:
        i = np.asarray(ids)
        return (i >= 2 * N + per_rank) & (i < 2 * N + 2 * per_rank)

    got = local_ranges(Plan(spe, world), 2, spe, world, B, [second_share] * 2)
    assert got == [(2 * N + per_rank, 2 * N + 2 * per_rank)]


def test_a_window_is_whole_steps_and_cut_at_the_shares_end() -> None:
    spe = W + 3  # a share of one whole window and a short one
    per_rank = spe * B
    held = [lambda ids: np.asarray(ids) % per_rank >= W * B] * 2  # the short windows only
    got = local_ranges(Plan(spe, 2), 0, spe, 2, B, held, window=W * B - 1)
    assert got == [(W * B, per_rank), (per_rank + W * B, 2 * per_rank)]


def test_a_report_keeps_to_its_reach_at_the_front_of_every_share() -> None:
    spe, world = 10 * W, 4
    per_rank = spe * B
    plan = Plan(spe, world)
    got = local_ranges(plan, 1, spe, world, B, [below(10**9)] * 2, reach=3 * W * B * world)
    assert plan.asked == [(spe, 3 * W)]  # three windows of each share
    base = per_rank * world
    assert got == [(base + r * per_rank, base + r * per_rank + 3 * W * B) for r in range(world)]
    # a reach shorter than a window: windows shrink to it
    plan = Plan(spe, world)
    got = local_ranges(plan, 0, spe, world, B, [below(10**9)] * 2, reach=5 * B * world)
    assert plan.asked == [(0, 5)]
    assert got == [(r * per_rank, r * per_rank + 5 * B) for r in range(world)]


@settings(deadline=None, max_examples=40)
@given(
    spe=st.integers(1, 300),
    world=st.integers(1, 6),
    reach=st.integers(1, 5000),
    cut=st.integers(0, 3000),
)
def test_a_window_held_whole_is_local_and_one_not_held_is_not(
    spe: int, world: int, reach: int, cut: int
) -> None:
    plan = Plan(spe, world)
    got = local_ranges(plan, 0, spe, world, B, [below(cut)] * 2, reach=reach)
    ((first, steps),) = plan.asked
    assert first == 0 and world * steps * B <= max(reach, world * B)  # one step at least
    flat = [x for r in got for x in r]
    assert flat == sorted(flat) and all(0 <= a < b <= spe * B * world for a, b in got)

    def inside(x: int) -> bool:
        return any(a <= x < b for a, b in got)

    # a window wholly below the cut is held whole; one wholly above it not at all; only
    # the steps looked at are reported
    per_rank = spe * B
    for r in range(world):
        a, b = r * per_rank, r * per_rank + steps * B
        assert not inside(b) or b == (r + 1) * per_rank
        if b <= cut:
            assert inside(a) and inside(b - 1)
        if a >= cut:
            assert not inside(a)


def test_nothing_to_report_for_an_empty_plan_or_another_worlds() -> None:
    assert local_ranges(Plan(1, 1), 0, 0, 2, B, [below(10)]) == []
    # the plan answers for another world (an epoch planned before an elastic restore)
    assert local_ranges(Plan(8, 3), 0, 8, 2, B, [below(10**9)] * 2) == []


@pytest.mark.parametrize("threshold", [0.25, 0.5, 1.0])
def test_threshold_is_a_share_of_the_windows_samples(threshold: float) -> None:
    # source 0 held, source 1 not: every window holds half its samples
    got = local_ranges(Plan(W, 1), 0, W, 1, B, [below(10**9), below(0)], threshold=threshold)
    assert got == ([(0, W * B)] if threshold <= 0.5 else [])
