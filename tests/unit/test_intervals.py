"""stoker.intervals against a model: a Python set of ints."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stoker import intervals

PAIR = st.tuples(st.integers(min_value=0, max_value=300), st.integers(min_value=0, max_value=300))
PAIRS = st.lists(PAIR, max_size=12)
SETTINGS = settings(deadline=None, max_examples=80)


def model(pairs: list[tuple[int, int]]) -> set[int]:
    out: set[int] = set()
    for a, b in pairs:
        out.update(range(a, b))
    return out


def members(iv: np.ndarray) -> set[int]:
    return model([(int(a), int(b)) for a, b in iv])


def assert_normal(iv: np.ndarray) -> None:
    """Sorted, disjoint, non-adjacent, non-empty rows of an int64 (k, 2) array."""
    assert iv.dtype == np.int64
    assert iv.ndim == 2 and iv.shape[1] == 2
    assert (iv[:, 1] > iv[:, 0]).all()
    assert (iv[1:, 0] > iv[:-1, 1]).all()


@SETTINGS
@given(pairs=PAIRS)
def test_make_normalises_and_keeps_the_members(pairs: list[tuple[int, int]]) -> None:
    iv = intervals.make(pairs)
    assert_normal(iv)
    assert members(iv) == model(pairs)
    assert intervals.size(iv) == len(model(pairs))
    # the same from an array, and idempotent
    assert np.array_equal(intervals.make(np.asarray(pairs, dtype=np.int64).reshape(-1, 2)), iv)
    assert np.array_equal(intervals.make(iv), iv)
    assert np.array_equal(intervals.make(intervals.to_list(iv)), iv)


def test_make_merges_adjacent_and_drops_empty() -> None:
    assert intervals.to_list(intervals.make([(5, 7), (0, 5), (9, 9), (8, 10), (3, 2)])) == [
        [0, 7],
        [8, 10],
    ]
    empty = intervals.make([])
    assert empty.shape == (0, 2)
    assert intervals.size(empty) == 0


@SETTINGS
@given(a=PAIRS, b=PAIRS)
def test_union(a: list[tuple[int, int]], b: list[tuple[int, int]]) -> None:
    iv = intervals.union(intervals.make(a), intervals.make(b))
    assert_normal(iv)
    assert members(iv) == model(a) | model(b)


@SETTINGS
@given(a=PAIRS, b=PAIRS)
def test_subtract(a: list[tuple[int, int]], b: list[tuple[int, int]]) -> None:
    # b may be given unnormalised: subtract normalises it
    iv = intervals.subtract(intervals.make(a), np.asarray(b, dtype=np.int64).reshape(-1, 2))
    assert_normal(iv)
    assert members(iv) == model(a) - model(b)


@SETTINGS
@given(
    pairs=PAIRS,
    lo=st.integers(min_value=0, max_value=320),
    hi=st.integers(min_value=0, max_value=320),
)
def test_slice_ordered(pairs: list[tuple[int, int]], lo: int, hi: int) -> None:
    iv = intervals.make(pairs)
    out = intervals.slice_ordered(iv, lo, hi)
    assert_normal(out)
    assert members(out) == set(sorted(model(pairs))[lo:hi])


@SETTINGS
@given(pairs=PAIRS, data=st.data())
def test_members_at(pairs: list[tuple[int, int]], data: st.DataObject) -> None:
    iv = intervals.make(pairs)
    ordered = sorted(model(pairs))
    n = len(ordered)
    if n:
        idx = data.draw(st.lists(st.integers(min_value=0, max_value=n - 1), max_size=30))
        got = intervals.members_at(iv, np.asarray(idx, dtype=np.int64))
        assert got.tolist() == [ordered[i] for i in idx]
    bad = data.draw(st.sampled_from([-1, n, n + 7]))
    with pytest.raises(IndexError):
        intervals.members_at(iv, np.asarray([bad], dtype=np.int64))


def test_members_at_of_everything_lists_the_set_in_order() -> None:
    iv = intervals.make([(10, 13), (20, 21), (30, 35)])
    assert intervals.members_at(iv, np.arange(intervals.size(iv))).tolist() == [
        10,
        11,
        12,
        20,
        30,
        31,
        32,
        33,
        34,
    ]


def test_large_members_stay_exact() -> None:
    big = 10**15
    iv = intervals.make([(big, big + 5), (3 * big, 3 * big + 2)])
    assert intervals.size(iv) == 7
    assert intervals.members_at(iv, np.array([4, 5, 6])).tolist() == [big + 4, 3 * big, 3 * big + 1]
    assert intervals.to_list(intervals.slice_ordered(iv, 4, 6)) == [
        [big + 4, big + 5],
        [3 * big, 3 * big + 1],
    ]
