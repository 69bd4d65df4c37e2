"""stoker.plan: epoch orders, shuffle windows, rank and worker splits, carry-over."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stoker import intervals
from stoker.errors import ConfigError
from stoker.plan import (
    EpochOrder,
    EpochSplit,
    ShuffleConfig,
    Stream,
    first_epoch_set,
    worker_count,
    worker_indices,
)

SETTINGS = settings(deadline=None, max_examples=60)

SAMPLES = st.integers(min_value=1, max_value=3000)
SHARD = st.integers(min_value=1, max_value=64)
WINDOW = st.integers(min_value=1, max_value=12)
SEED = st.integers(min_value=0, max_value=2**32)
EPOCH = st.integers(min_value=0, max_value=1000)


@st.composite
def geometry(draw: st.DrawFn, min_samples: int = 1, max_windows: int = 40) -> tuple[int, int, int]:
    """(num_samples, shard_size, window_shards) with at most ``max_windows`` windows.

    Each window costs EpochOrder.samples a Python loop, so the count is kept small.
    """
    window = draw(WINDOW)
    shard = draw(SHARD)
    shard = max(shard, -(-min_samples // (max_windows * window)))
    S = draw(
        st.integers(
            min_value=min_samples,
            max_value=max(min_samples, min(2000, max_windows * shard * window)),
        )
    )
    return S, shard, window


def order(
    S: int, shard: int, window: int, seed: int, epoch: int, shuffle: bool = True
) -> EpochOrder:
    return EpochOrder(S, ShuffleConfig(seed, shuffle, shard, window, order="window"), epoch)


# -- config -----------------------------------------------------------------------------


def test_resolve_picks_about_a_mebitoken_per_shard() -> None:
    window = ShuffleConfig(order="window")
    assert window.resolve(1024).shard_size == 1024
    assert window.resolve(4096).shard_size == 256
    assert window.resolve(1 << 21).shard_size == 1  # never below one sample
    assert ShuffleConfig(shard_size=7).resolve(1024).shard_size == 7


@pytest.mark.parametrize("cfg", [ShuffleConfig(shard_size=0), ShuffleConfig(window_shards=0)])
def test_resolve_rejects_empty_shards_and_windows(cfg: ShuffleConfig) -> None:
    with pytest.raises(ConfigError):
        cfg.resolve(16)


# -- one data epoch ---------------------------------------------------------------------


@SETTINGS
@given(geo=geometry(), seed=SEED, epoch=EPOCH)
def test_epoch_order_is_a_permutation_of_the_samples(
    geo: tuple[int, int, int], seed: int, epoch: int
) -> None:
    S, shard, window = geo
    o = order(S, shard, window, seed, epoch)
    ids = o.samples(np.arange(S))
    assert np.array_equal(np.sort(ids), np.arange(S))
    # slot by slot and in any order of slots, the same answer
    rng = np.random.default_rng(seed)
    slots = rng.permutation(S)
    assert np.array_equal(o.samples(slots), ids[slots])


@SETTINGS
@given(S=SAMPLES, shard=SHARD, window=WINDOW, seed=SEED, epoch=EPOCH)
def test_without_shuffle_the_order_is_the_identity(
    S: int, shard: int, window: int, seed: int, epoch: int
) -> None:
    o = order(S, shard, window, seed, epoch, shuffle=False)
    assert np.array_equal(o.samples(np.arange(S)), np.arange(S))


@SETTINGS
@given(geo=geometry(), seed=SEED, epoch=EPOCH)
def test_windows_bound_the_shuffle(geo: tuple[int, int, int], seed: int, epoch: int) -> None:
    S, shard, window = geo
    o = order(S, shard, window, seed, epoch)
    num_shards = -(-S // shard)
    num_windows = -(-num_shards // window)
    starts = o.window_start(np.arange(num_windows + 1))
    assert starts[0] == 0 and starts[-1] == S
    assert (np.diff(starts) > 0).all()
    slots = np.arange(S)
    w_of = o.window_of(slots)
    assert np.array_equal(w_of, np.searchsorted(starts, slots, side="right") - 1)
    ids = o.samples(slots)
    shard_of = ids // shard
    seen_shards: set[int] = set()
    for w in range(num_windows):
        in_w = slice(int(starts[w]), int(starts[w + 1]))
        shards = set(shard_of[in_w].tolist())
        # a window holds at most window_shards shards...
        assert len(shards) <= window
        # ...exactly those at its permuted shard positions...
        positions = np.arange(w * window, min((w + 1) * window, num_shards))
        assert shards == set(o.shards(positions).tolist())
        # ...and whole: every sample of each of its shards, nothing else
        expected = {s for sh in shards for s in range(sh * shard, min((sh + 1) * shard, S))}
        assert set(ids[in_w].tolist()) == expected
        assert not shards & seen_shards
        seen_shards |= shards
    assert seen_shards == set(range(num_shards))


@SETTINGS
@given(geo=geometry(min_samples=100, max_windows=8), seed=SEED, epoch=EPOCH)
def test_epochs_and_seeds_change_the_order(
    geo: tuple[int, int, int], seed: int, epoch: int
) -> None:
    S, shard, window = geo
    slots = np.arange(S)
    base = order(S, shard, window, seed, epoch).samples(slots)
    assert not np.array_equal(base, order(S, shard, window, seed, epoch + 1).samples(slots))
    assert not np.array_equal(base, order(S, shard, window, seed + 1, epoch).samples(slots))
    assert np.array_equal(base, order(S, shard, window, seed, epoch).samples(slots))


def test_stream_lays_data_epochs_end_to_end() -> None:
    S, cfg = 500, ShuffleConfig(3, True, 16, 4, order="window")
    stream = Stream(S, cfg)
    p = np.arange(4 * S)
    ids = stream.samples(p)
    for e in range(4):
        assert np.array_equal(ids[e * S : (e + 1) * S], EpochOrder(S, cfg, e).samples(np.arange(S)))
    # positions asked out of order and across epochs give the same ids
    rng = np.random.default_rng(0)
    q = rng.permutation(4 * S)
    assert np.array_equal(stream.samples(q), ids[q])


def test_plans_cost_no_memory_in_the_number_of_samples() -> None:
    S = 10**12
    cfg = ShuffleConfig(seed=1, shard_size=1024, window_shards=16, order="window")
    o = EpochOrder(S, cfg, epoch=3)
    slots = np.concatenate([np.arange(500), S - 1 - np.arange(500)])
    ids = o.samples(slots)
    assert ids.shape == (1000,)
    assert ((ids >= 0) & (ids < S)).all()
    assert len(set(ids.tolist())) == 1000
    # the first window's samples come from its window_shards shards only
    assert len(set((ids[:500] // 1024).tolist())) <= 16
    stream = Stream(S, cfg)
    far = np.array([5 * S + 7, 5 * S, 2 * S - 1], dtype=np.int64)
    assert np.array_equal(stream.samples(far)[:2], EpochOrder(S, cfg, 5).samples(np.array([7, 0])))


# -- workers ----------------------------------------------------------------------------


@settings(deadline=None, max_examples=150)
@given(
    per_rank=st.integers(min_value=0, max_value=2000),
    num_workers=st.integers(min_value=1, max_value=9),
    chunk=st.integers(min_value=1, max_value=40),
)
def test_workers_partition_a_rank_and_round_robin_restores_its_order(
    per_rank: int, num_workers: int, chunk: int
) -> None:
    per_worker = [worker_indices(per_rank, w, num_workers, chunk) for w in range(num_workers)]
    for w, idx in enumerate(per_worker):
        assert len(idx) == worker_count(per_rank, w, num_workers, chunk)
    allidx = np.concatenate(per_worker)
    assert np.array_equal(np.sort(allidx), np.arange(per_rank))
    # a DataLoader takes one batch of `chunk` from each worker in turn (skipping
    # exhausted ones): that yields the rank's samples in rank order
    batches = [[idx[i : i + chunk] for i in range(0, len(idx), chunk)] for idx in per_worker]
    merged: list[int] = []
    for round_ in range(max((len(b) for b in batches), default=0)):
        for b in batches:
            if round_ < len(b):
                merged.extend(b[round_].tolist())
    assert merged == list(range(per_rank))
    # loads are balanced to within one chunk
    counts = [len(i) for i in per_worker]
    assert max(counts) - min(counts) <= chunk


@settings(deadline=None, max_examples=60)
@given(
    per_rank=st.integers(min_value=0, max_value=500),
    num_workers=st.integers(min_value=1, max_value=5),
    chunk=st.integers(min_value=1, max_value=10),
    data=st.data(),
)
def test_worker_indices_start_stop_slice_the_full_list(
    per_rank: int, num_workers: int, chunk: int, data: st.DataObject
) -> None:
    w = data.draw(st.integers(min_value=0, max_value=num_workers - 1))
    full = worker_indices(per_rank, w, num_workers, chunk)
    start = data.draw(st.integers(min_value=0, max_value=len(full) + 3))
    stop = data.draw(st.integers(min_value=0, max_value=len(full) + 3))
    got = worker_indices(per_rank, w, num_workers, chunk, start, stop)
    assert got.tolist() == full[start:stop].tolist()


@pytest.mark.parametrize("worker", [-1, 3])
def test_worker_out_of_range(worker: int) -> None:
    with pytest.raises(ConfigError, match="worker"):
        worker_indices(10, worker, 3, 2)


# -- ranks and epochs -------------------------------------------------------------------


def rank_sets(split: EpochSplit) -> list[np.ndarray]:
    return [split.rank_positions(r, np.arange(split.per_rank)) for r in range(split.world)]


@SETTINGS
@given(
    S=st.integers(min_value=1, max_value=5000),
    world=st.integers(min_value=1, max_value=17),
    epoch=st.integers(min_value=0, max_value=50),
    drop=st.booleans(),
)
def test_every_rank_gets_exactly_per_rank_samples(
    S: int, world: int, epoch: int, drop: bool
) -> None:
    eset = first_epoch_set(epoch, S, world, drop)
    split = EpochSplit(eset, world)
    size = intervals.size(eset)
    assert split.per_rank == size // world
    ranks = rank_sets(split)
    members = set(intervals.members_at(eset, np.arange(size)).tolist())
    taken: list[int] = []
    for r, pos in enumerate(ranks):
        assert len(pos) == split.per_rank
        assert set(pos.tolist()) <= members
        # rank r takes ordered members [r * n, (r + 1) * n)
        assert pos.tolist() == sorted(members)[r * split.per_rank : (r + 1) * split.per_rank]
        taken.extend(pos.tolist())
    assert len(set(taken)) == len(taken)
    leftover = set(
        intervals.members_at(split.leftover(), np.arange(intervals.size(split.leftover()))).tolist()
    )
    assert len(leftover) < world
    assert leftover | set(taken) == members
    assert not leftover & set(taken)


@SETTINGS
@given(
    S=st.integers(min_value=1, max_value=400),
    world=st.integers(min_value=1, max_value=9),
    epochs=st.integers(min_value=1, max_value=12),
)
def test_carry_over_delivers_the_stream_without_gaps_or_repeats(
    S: int, world: int, epochs: int
) -> None:
    eset = first_epoch_set(0, S, world, drop_remainder=False)
    delivered: list[int] = []
    for t in range(epochs):
        # one world size throughout: the carried set is what first_epoch_set says
        assert intervals.to_list(eset) == intervals.to_list(first_epoch_set(t, S, world, False))
        split = EpochSplit(eset, world)
        for pos in rank_sets(split):
            delivered.extend(pos.tolist())
        # after epoch t, data epochs 0..t are all delivered except fewer than `world`
        undelivered = (t + 1) * S - len(delivered)
        assert 0 <= undelivered < world
        assert intervals.size(split.leftover()) == undelivered
        eset = split.next_epoch_set(t, S, drop_remainder=False)
    assert sorted(delivered) == list(range(len(delivered)))


@SETTINGS
@given(
    S=st.integers(min_value=1, max_value=400),
    world=st.integers(min_value=1, max_value=9),
    epochs=st.integers(min_value=1, max_value=8),
)
def test_drop_remainder_delivers_within_each_data_epoch(S: int, world: int, epochs: int) -> None:
    eset = first_epoch_set(0, S, world, drop_remainder=True)
    for t in range(epochs):
        assert intervals.to_list(eset) == intervals.to_list(first_epoch_set(t, S, world, True))
        split = EpochSplit(eset, world)
        delivered = np.concatenate(rank_sets(split))
        assert len(delivered) == (S // world) * world
        assert len(set(delivered.tolist())) == len(delivered)
        assert ((delivered >= t * S) & (delivered < (t + 1) * S)).all()
        eset = split.next_epoch_set(t, S, drop_remainder=True)


@SETTINGS
@given(
    S=st.integers(min_value=1, max_value=2000),
    world=st.integers(min_value=1, max_value=9),
    data=st.data(),
)
def test_consumed_is_every_ranks_first_samples(S: int, world: int, data: st.DataObject) -> None:
    split = EpochSplit(first_epoch_set(1, S, world, False), world)
    m = data.draw(st.integers(min_value=0, max_value=split.per_rank))
    consumed = split.consumed(m)
    expected = {int(p) for pos in rank_sets(split) for p in pos[:m]}
    got = set(intervals.members_at(consumed, np.arange(intervals.size(consumed))).tolist())
    assert got == expected
    assert intervals.size(consumed) == m * world
