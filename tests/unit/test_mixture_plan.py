"""The mixture's pure parts: weight schedules (exact sums over any range of steps) and
the apportionment of each step's samples (counts within one sample of their targets
at every step, never going down), held by properties over random inputs."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stoker.errors import ConfigError
from stoker.mixture.apportion import advance
from stoker.mixture.schedule import WeightSchedule


# -- schedules ---------------------------------------------------------------------
def test_constant_weights_are_normalised_exactly() -> None:
    s = WeightSchedule.constant({"web": 0.7, "code": 0.2, "math": 0.1})
    w = s.at(12345)
    assert sum(w) == 1 and s.names == ("web", "code", "math")
    assert w[0] / w[1] == Fraction(0.7) / Fraction(0.2)
    assert s.total(10, 20) == tuple(10 * x for x in w)


def test_piecewise_and_linear_schedules() -> None:
    pts = [(0, {"a": 1, "b": 0}), (10, {"a": 0, "b": 1})]
    step = WeightSchedule.of(pts)
    assert step.at(9) == (1, 0) and step.at(10) == (0, 1) and step.at(10**12) == (0, 1)
    ramp = WeightSchedule.of(pts, linear=True)
    assert ramp.at(0) == (1, 0) and ramp.at(5) == (Fraction(1, 2), Fraction(1, 2))
    assert ramp.at(10) == (0, 1) and ramp.at(99) == (0, 1)


@st.composite
def schedules(draw: st.DrawFn) -> WeightSchedule:
    k = draw(st.integers(1, 4))
    names = [f"s{i}" for i in range(k)]
    n_points = draw(st.integers(1, 4))
    steps = sorted(draw(st.sets(st.integers(1, 60), min_size=n_points - 1, max_size=n_points - 1)))
    points = []
    for step in [0, *steps]:
        ws = draw(st.lists(st.integers(0, 9), min_size=k, max_size=k).filter(lambda w: sum(w) > 0))
        points.append((step, dict(zip(names, ws, strict=True))))
    return WeightSchedule.of(points, linear=draw(st.booleans()))


@given(schedules(), st.integers(0, 80), st.integers(0, 80))
def test_total_is_the_sum_of_the_steps(s: WeightSchedule, a: int, n: int) -> None:
    want = [Fraction(0)] * len(s.names)
    for step in range(a, a + n):
        for j, w in enumerate(s.at(step)):
            want[j] += w
    assert s.total(a, a + n) == tuple(want)
    assert all(sum(s.at(step)) == 1 and min(s.at(step)) >= 0 for step in range(a, a + n))


@pytest.mark.parametrize(
    ("points", "match"),
    [
        ([], "at least one"),
        ([(1, {"a": 1})], "at step 0"),
        ([(0, {"a": 1}), (0, {"a": 2})], "increase"),
        ([(0, {"a": 1, "b": 1}), (5, {"a": 1})], "missing: b"),
        ([(0, {"a": 1}), (5, {"a": 1, "c": 1})], "unknown: c"),
        ([(0, {"a": -1})], ">= 0"),
        ([(0, {"a": float("nan")})], "finite"),
        ([(0, {"a": 0, "b": 0})], "sum to 0"),
        ([(0, {"a": "1"})], "a number"),
        ([(-1, {"a": 1})], "int >= 0"),
    ],
)
def test_bad_schedules_are_refused_by_name(points: list, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        WeightSchedule.of(points)


# -- apportionment -------------------------------------------------------------------
def run(s: WeightSchedule, batches: list[int]) -> list[tuple[int, ...]]:
    """Cumulative counts after each step of the given sizes, and check the invariants."""
    counts = tuple(0 for _ in s.names)
    done = 0
    targets = [Fraction(0)] * len(s.names)
    out = []
    for step, b in enumerate(batches):
        targets = [t + b * w for t, w in zip(targets, s.at(step), strict=True)]
        done += b
        new = advance(counts, targets)
        assert sum(new) == done
        assert all(n >= c for n, c in zip(new, counts, strict=True))  # never down
        assert all(abs(n - t) < 1 for n, t in zip(new, targets, strict=True)), (new, targets)
        counts = new
        out.append(counts)
    return out


@settings(max_examples=300)
@given(schedules(), st.lists(st.integers(0, 40), min_size=1, max_size=80))
def test_counts_stay_within_one_sample_of_their_targets(
    s: WeightSchedule, batches: list[int]
) -> None:
    run(s, batches)


@settings(max_examples=200)
@given(
    st.lists(st.integers(1, 1000), min_size=2, max_size=6),
    st.integers(1, 64),
    st.integers(1, 200),
)
def test_skewed_weights_and_one_sample_steps(ws: list[int], batch: int, steps: int) -> None:
    # a source with a tiny weight gets a sample now and then, never two steps early
    ws[0] = 1
    s = WeightSchedule.constant({f"s{i}": w for i, w in enumerate(ws)})
    run(s, [batch] * steps)


def test_a_two_source_mix_alternates_as_evenly_as_it_can() -> None:
    s = WeightSchedule.constant({"a": 1, "b": 2})
    counts = run(s, [1] * 9)
    picks = [int(np.argmax(np.subtract(b, a))) for a, b in zip([(0, 0), *counts], counts)]
    assert picks.count(0) == 3 and picks.count(1) == 6
    assert "".join("ab"[p] for p in picks) in ("babbabbab", "bbabbabba", "abbabbabb")


def test_refusals() -> None:
    with pytest.raises(ValueError, match="whole number"):
        advance((0, 0), (Fraction(1, 2), Fraction(1, 3)))
    with pytest.raises(ValueError, match="fewer"):
        advance((3, 3), (Fraction(2), Fraction(2)))


@settings(max_examples=300)
@given(
    st.integers(2, 5).flatmap(
        lambda k: st.lists(
            st.tuples(
                st.integers(0, 6),
                st.lists(st.sampled_from([0, 1, 2, 3, 50, 1000]), min_size=k, max_size=k),
            ),
            min_size=1,
            max_size=40,
        )
    )
)
def test_counts_follow_weights_that_change_every_step(steps: list[tuple[int, list[int]]]) -> None:
    # adversarial: new weights (some zero, some a thousand times others) every step
    k = len(steps[0][1])
    counts = (0,) * k
    targets = [Fraction(0)] * k
    for b, ws in steps:
        ws = ws if sum(ws) else [1, *ws[1:]]
        targets = [t + Fraction(b * w, sum(ws)) for t, w in zip(targets, ws, strict=True)]
        new = advance(counts, targets)
        assert all(n >= c for n, c in zip(new, counts, strict=True))
        assert all(abs(n - t) < 1 for n, t in zip(new, targets, strict=True))
        counts = new
