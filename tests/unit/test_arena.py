"""The decoded-block arena and the reader's schedule, against the raw token stream."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as hs

import stoker
from stoker.loader.arena import NEVER, BlockArena, first_uses

from ._datasets import SmallDataset


def _expected(ds: SmallDataset, starts: np.ndarray, length: int) -> tuple[np.ndarray, np.ndarray]:
    stream = ds.stream
    flags = np.zeros(len(stream), dtype=bool)
    flags[ds.doc_offsets] = True
    rows = starts[:, None] + np.arange(length)[None, :]
    return stream[rows], flags[rows]


@pytest.fixture(scope="module")
def arena_ds(write_small_module: Callable[..., SmallDataset]) -> SmallDataset:
    return write_small_module("arena", num_docs=200, max_len=200)


@pytest.mark.parametrize("length", [17, 256, 257, 700])  # inside, equal to, across, over blocks
@pytest.mark.parametrize("slots", [3, 8, 64])
def test_windows_match_the_stream(arena_ds: SmallDataset, length: int, slots: int) -> None:
    ds = arena_ds
    source = stoker.TokenSource(ds.url)
    arena = BlockArena(source, slots)
    rng = np.random.default_rng(length * 100 + slots)
    n = len(ds.stream)
    span = -(-length // source.manifest.block_tokens) + 1
    rows = max(1, min(8, (arena.slots - 1) // span))
    if span > arena.slots:  # one window needs more blocks than the arena holds
        with pytest.raises(RuntimeError, match="raise arena_blocks"):
            arena.windows(np.array([255]), length, np.zeros((1, length), np.int64), None)
        return
    try:
        for _ in range(40):
            starts = rng.integers(0, n - length + 1, size=rows)
            out = np.full((rows, length), -1, dtype=np.int64)
            mask = np.ones((rows, length), dtype=bool)
            arena.windows(starts, length, out, mask)
            tokens, flags = _expected(ds, starts, length)
            np.testing.assert_array_equal(out, tokens)
            np.testing.assert_array_equal(mask, flags)
    finally:
        arena.close()
    assert arena.loads >= 1 and arena.hits >= 1


def test_small_arena_evicts_and_reloads(write_small: Callable[..., SmallDataset]) -> None:
    ds = write_small(num_docs=100, max_len=100)
    source = stoker.TokenSource(ds.url)
    arena = BlockArena(source, 2)
    out = np.zeros((1, 10), dtype=np.int64)
    try:
        for block in [0, 1, 2, 0, 1, 2]:
            arena.windows(np.array([block * 256]), 10, out, None)
            np.testing.assert_array_equal(out[0], ds.stream[block * 256 : block * 256 + 10])
    finally:
        arena.close()
    assert arena.evictions == 4 and arena.loads == 6


def test_prefetch_never_evicts_a_block_needed_sooner(
    write_small: Callable[..., SmallDataset],
) -> None:
    ds = write_small(num_docs=100, max_len=100)
    arena = BlockArena(stoker.TokenSource(ds.url), 2)
    out = np.zeros((1, 4), dtype=np.int64)
    try:
        arena.windows(np.array([0]), 4, out, None)
        arena.windows(np.array([256]), 4, out, None)  # blocks 0 and 1 resident
        # block 0 is needed next, block 1 last: prefetching block 2 may only evict block 1
        arena.schedule(np.array([0, 2, 1]), np.array([0, 5, 9]), ahead=3)
        arena.require(np.array([2]))
        assert set(arena._slot_of) == {0, 2}
        # nothing can go: both resident blocks are needed before block 3
        arena.schedule(np.array([0, 2, 3]), np.array([0, 1, 2]), ahead=3)
        assert 3 not in arena._loading and set(arena._slot_of) == {0, 2}
    finally:
        arena.close()


@settings(max_examples=200, deadline=None)
@given(hs.lists(hs.integers(0, 40), max_size=300))
def test_first_uses_equal_a_sorted_unique(blocks: list[int]) -> None:
    table = np.full(41, NEVER, dtype=np.int64)
    arr = np.asarray(blocks, dtype=np.int64)
    order, first = first_uses(arr, table)
    uniq, idx = np.unique(arr, return_index=True)
    by_use = np.argsort(idx, kind="stable")
    np.testing.assert_array_equal(order, uniq[by_use])
    np.testing.assert_array_equal(first, idx[by_use])
    assert (table == NEVER).all()  # left clean for the next call
