"""stoker.plan's second order, ``order="spread"`` (SpreadOrder), and the keyed
permutations it is built from, held to a construction written out from its definition."""

from __future__ import annotations

import itertools
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stoker.errors import ConfigError, StateError
from stoker.loader import state
from stoker.permutation import Permutation, derive_key, derive_keys, permute
from stoker.plan import ShuffleConfig, SpreadOrder, Stream, epoch_order, spread_profile

SETTINGS = settings(deadline=None, max_examples=60)


def spread(seed: int, unit: int, mean: int, window: int = 4) -> ShuffleConfig:
    return ShuffleConfig(seed, True, unit, window, "spread", mean).resolve(1)


def reference(S: int, config: ShuffleConfig, epoch: int) -> list[int]:
    """The order as the definition says, built turn by turn with plain loops."""
    u, m = config.shard_size, config.spread
    assert u is not None
    key = derive_key(config.seed, epoch)
    nu = -(-S // u)
    arrivals = Permutation(nu, derive_key(key, 1))
    dealt: dict[int, list[tuple[int, list[int]]]] = {}  # turn -> (delay, group) dealt to it
    for t in range(nu):
        unit = int(arrivals(t))
        size = min(u, S - unit * u)
        mine = Permutation(size, derive_key(key, 3, unit))
        shuffled = [unit * u + int(mine(j)) for j in range(size)]
        start = 0
        for d, count in enumerate(spread_profile(size, m)):
            dealt.setdefault(t + d, []).append((d, shuffled[start : start + count]))
            start += count
    out: list[int] = []
    for turn in sorted(dealt):
        content = [i for _, group in sorted(dealt[turn]) for i in group]  # delay 0 first
        if content:
            p = Permutation(len(content), derive_key(key, 4, turn))
            out.extend(content[int(p(i))] for i in range(len(content)))
    return out


# -- keyed permutations ---------------------------------------------------------------------


@pytest.mark.parametrize("n", [1, 2, 3, 7, 64, 1000, 4097])
def test_permute_is_permutation_of_each_key(n: int) -> None:
    rng = np.random.default_rng(n)
    keys = derive_keys(derive_key(9, 2), np.arange(12))
    idx = rng.integers(0, n, 400)
    row = rng.integers(0, len(keys), 400)
    want = [int(Permutation(n, int(keys[r]))(int(i))) for i, r in zip(idx, row)]
    assert permute(idx, keys[row], n).tolist() == want
    assert permute(idx, keys, n, row).tolist() == want  # a table of keys and rows
    whole = permute(np.arange(n), np.full(n, keys[3]), n)
    assert sorted(whole.tolist()) == list(range(n))


def test_permute_refuses_an_index_outside_its_domain() -> None:
    with pytest.raises(IndexError):
        permute(np.array([5]), np.array([1], dtype=np.uint64), 5)


def test_derive_keys_is_derive_key_of_the_prefix() -> None:
    got = derive_keys(derive_key(3, 4), np.array([0, 9, 2**40]))
    assert got.tolist() == [derive_key(3, 4, p) for p in (0, 9, 2**40)]


# -- the profile ----------------------------------------------------------------------------


@given(st.integers(1, 5000), st.integers(1, 12))
@SETTINGS
def test_profile_deals_every_sample_by_the_geometric_law(size: int, mean: int) -> None:
    counts = spread_profile(size, mean)
    assert sum(counts) == size and min(counts) >= 0
    q = Fraction(mean, mean + 1)
    for d, c in enumerate(counts):
        assert abs(c - size * (1 - q) * q**d) < 1  # each within one of the exact share
    assert counts[0] >= counts[-1]


def test_profile_mean_is_the_spread() -> None:
    for mean in (2, 4, 8):
        counts = spread_profile(100_000, mean)
        got = sum(d * c for d, c in enumerate(counts)) / 100_000
        assert abs(got - mean) < 0.01


# -- the order ------------------------------------------------------------------------------

GRID = list(
    itertools.product(
        [1, 2, 7, 30, 31, 255, 257],  # samples
        [1, 3, 8, 30],  # unit
        [1, 2, 4],  # spread
    )
)


@pytest.mark.parametrize(("S", "unit", "mean"), GRID)
def test_order_is_its_definition(S: int, unit: int, mean: int) -> None:
    """Short last units, fewer units than turns of delay, one unit, one sample: all as the
    turn-by-turn construction deals them."""
    config = spread(11, unit, mean)
    for epoch in (0, 3):
        got = SpreadOrder(S, config, epoch).samples(np.arange(S)).tolist()
        assert got == reference(S, config, epoch)


@given(st.integers(1, 20_000), st.integers(1, 300), st.integers(1, 8), st.integers(0, 2**32))
@SETTINGS
def test_every_sample_once_and_turns_tile_the_epoch(
    S: int, unit: int, mean: int, seed: int
) -> None:
    o = SpreadOrder(S, spread(seed, unit, mean), 1)
    ids = o.samples(np.arange(S))
    assert np.array_equal(np.sort(ids), np.arange(S))
    starts = o.turn_start(np.arange(o.num_turns + 1))
    assert starts[0] == 0 and starts[-1] == S and (np.diff(starts) >= 0).all()
    k = np.arange(S)
    assert np.array_equal(o.turn_of(k), np.searchsorted(starts, k, side="right") - 1)
    # any slots, in any order and shape, map as the whole epoch does
    pick = np.random.default_rng(seed).integers(0, S, (3, 5))
    assert np.array_equal(o.samples(pick), ids[pick])


def test_a_full_turn_draws_from_every_unit_of_its_delays() -> None:
    """Once D units have arrived, each turn holds ``unit`` samples from D distinct units."""
    S, unit, mean = 40_000, 64, 4
    o = SpreadOrder(S, spread(2, unit, mean), 0)
    ids = o.samples(np.arange(S))
    starts = o.turn_start(np.arange(o.num_turns + 1))
    for t in range(o.D - 1, o.nu):
        if o.q <= t < o.q + o.D:
            continue
        turn = ids[starts[t] : starts[t + 1]]
        assert len(turn) == unit
        assert len(np.unique(turn // unit)) == o.D


@pytest.mark.parametrize(("unit", "mean"), [(64, 2), (256, 4), (100, 6)])
def test_resident_samples_stay_within_the_profile_bound(unit: int, mean: int) -> None:
    """Held from its unit's first turn to its own slot, no more samples are resident at
    once than the profile's mean delay plus one, in units: what a reader must hold."""
    S = 60_000
    o = SpreadOrder(S, spread(4, unit, mean), 0)
    ids = o.samples(np.arange(S))
    slot = np.empty(S, dtype=np.int64)
    slot[ids] = np.arange(S)
    first = np.full(o.nu, S, dtype=np.int64)
    np.minimum.at(first, ids // unit, np.arange(S))
    held = np.zeros(S + 1, dtype=np.int64)
    np.add.at(held, first[np.arange(S) // unit], 1)
    np.add.at(held, slot + 1, -1)
    bound = sum(d * c for d, c in enumerate(spread_profile(unit, mean))) + unit
    assert np.cumsum(held).max() <= bound
    assert bound <= (mean + 1.1) * unit


def test_window_spans_hold_every_sample_of_its_slots() -> None:
    S, unit = 9_000, 50
    o = SpreadOrder(S, spread(7, unit, 3, window=5), 2)
    ids = o.samples(np.arange(S))
    starts = o.window_start(np.arange(o.num_windows + 1))
    assert starts[0] == 0 and starts[-1] == S
    for w in range(o.num_windows):
        spans = o.window_spans(w)
        inside = ids[starts[w] : starts[w + 1]]
        covered = np.zeros(S, dtype=bool)
        for a, b in spans:
            covered[a:b] = True
        assert covered[inside].all()
        assert len(spans) <= o.ws + o.D - 1


def test_epochs_and_seeds_differ_and_repeat() -> None:
    S = 5000
    a = SpreadOrder(S, spread(1, 40, 4), 0).samples(np.arange(S))
    assert np.array_equal(a, SpreadOrder(S, spread(1, 40, 4), 0).samples(np.arange(S)))
    assert not np.array_equal(a, SpreadOrder(S, spread(1, 40, 4), 1).samples(np.arange(S)))
    assert not np.array_equal(a, SpreadOrder(S, spread(2, 40, 4), 0).samples(np.arange(S)))


def test_an_epoch_of_a_trillion_samples_costs_no_tables() -> None:
    """Built and read at any slot without a table over the samples or the units."""
    S = 10**12
    o = SpreadOrder(S, spread(1, 256, 4), 5)
    slots = np.array([0, 7, S // 2, S - 1])
    ids = o.samples(slots)
    assert ((ids >= 0) & (ids < S)).all() and len(set(ids.tolist())) == 4
    assert len(o._anchors) < 4 * o.D + 8
    whole = o.samples(np.arange(S // 2, S // 2 + 5000))
    assert len(np.unique(whole)) == 5000


def test_unshuffled_is_source_order() -> None:
    config = ShuffleConfig(0, False, 16, 4, "spread", 4).resolve(1)
    assert SpreadOrder(300, config, 5).samples(np.arange(300)).tolist() == list(range(300))


def test_stream_and_epoch_order_pick_the_order_by_name() -> None:
    config = spread(3, 16, 2)
    assert isinstance(epoch_order(500, config, 0), SpreadOrder)
    positions = np.arange(1000)  # two data epochs end to end
    got = Stream(500, config).samples(positions)
    want = np.concatenate([SpreadOrder(500, config, e).samples(np.arange(500)) for e in (0, 1)])
    assert np.array_equal(got, want)


# -- configuration and state ----------------------------------------------------------------


def test_config_resolves_a_unit_of_one_block_and_checks_its_fields() -> None:
    assert ShuffleConfig(order="spread").resolve(2048, 524288).shard_size == 256
    assert ShuffleConfig(order="spread").resolve(1000, 524288).shard_size == 524
    assert ShuffleConfig(order="spread").resolve(2048).shard_size == 256  # default blocks
    assert ShuffleConfig().resolve(2048, 524288).shard_size == 256  # the default order
    assert ShuffleConfig(order="window").resolve(2048, 524288).shard_size == 512
    with pytest.raises(ConfigError, match="order"):
        ShuffleConfig(order="random").resolve(8)
    with pytest.raises(ConfigError, match="spread"):
        ShuffleConfig(order="spread", spread=0).resolve(8)


def test_a_state_of_one_order_never_resumes_the_other() -> None:
    identity = {
        "dataset_id": "d",
        "num_samples": 100,
        "seq_len": 8,
        "seed": 0,
        "shuffle": True,
        "shard_size": 4,
        "window_shards": 2,
    }
    progress = state.Progress(0, np.array([[0, 100]], dtype=np.int64), 1, 1)
    saved_window = state.build(identity, False, progress, None)
    spread_identity = {**identity, "order": "spread", "spread": 4}
    saved_spread = state.build(spread_identity, False, progress, None)
    state.check(saved_window, identity)
    state.check(saved_spread, spread_identity)
    with pytest.raises(StateError, match="order"):
        state.check(saved_window, spread_identity)
    with pytest.raises(StateError, match="order"):
        state.check(saved_spread, identity)
    with pytest.raises(StateError, match="spread"):
        state.check(saved_spread, {**spread_identity, "spread": 5})
