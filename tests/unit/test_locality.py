"""Which windows of an epoch a node's cache holds, checked against the plan's own mapping."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as hs

from stoker import plan
from stoker.coordinator.holdings import local_ranges


def blocks_of(ids: np.ndarray, seq_len: int, bt: int) -> set[int]:
    out: set[int] = set()
    for s in ids.tolist():
        out.update(range(s * seq_len // bt, (s + 1) * seq_len // bt + 1))
    return out


def span_ids(order: plan.SpreadOrder, w: int) -> np.ndarray:
    return np.concatenate([np.arange(a, b) for a, b in order.window_spans(w)])


@settings(max_examples=120, deadline=None)
@given(
    S=hs.integers(1, 300),
    seq_len=hs.integers(1, 40),
    bt=hs.integers(8, 200),
    shard=hs.integers(1, 20),
    ws=hs.integers(1, 4),
    shuffle=hs.booleans(),
    epoch=hs.integers(0, 3),
    data=hs.data(),
)
def test_the_windows_a_cache_holds_are_reported(S, seq_len, bt, shard, ws, shuffle, epoch, data):
    config = plan.ShuffleConfig(7, shuffle, shard, ws, order="window")
    order = plan.EpochOrder(S, config, epoch)
    starts = order.window_start(np.arange(order.num_windows + 1)).tolist()
    w = data.draw(hs.integers(0, order.num_windows - 1))
    # the node cached exactly the blocks of window w's samples (found through samples())
    ids = order.samples(np.arange(starts[w], starts[w + 1]))
    held = blocks_of(ids, seq_len, bt)
    got = local_ranges(S, seq_len, bt, config, epoch, held)
    base = epoch * S
    assert any(a <= base + starts[w] and base + starts[w + 1] <= b for a, b in got)
    # every window reported has at least half its blocks held
    for v in range(order.num_windows):
        lo, hi = base + starts[v], base + starts[v + 1]
        inside = any(a <= lo and hi <= b for a, b in got)
        need = blocks_of(order.samples(np.arange(starts[v], starts[v + 1])), seq_len, bt)
        assert inside == (len(need & held) >= 0.5 * len(need))
    assert local_ranges(S, seq_len, bt, config, epoch, []) == []


@settings(max_examples=120, deadline=None)
@given(
    S=hs.integers(1, 300),
    seq_len=hs.integers(1, 40),
    bt=hs.integers(8, 200),
    unit=hs.integers(1, 20),
    ws=hs.integers(1, 4),
    spread=hs.integers(1, 4),
    epoch=hs.integers(0, 3),
    data=hs.data(),
)
def test_spread_windows_are_their_units_blocks(S, seq_len, bt, unit, ws, spread, epoch, data):
    """With order="spread" a window is the units its turns deal from: a node that holds
    half their blocks is local to it, and its slots hold only their samples."""
    config = plan.ShuffleConfig(7, True, unit, ws, "spread", spread)
    order = plan.SpreadOrder(S, config, epoch)
    starts = order.window_start(np.arange(order.num_windows + 1)).tolist()
    w = data.draw(hs.integers(0, order.num_windows - 1))
    slots = order.samples(np.arange(starts[w], starts[w + 1]))
    assert set(slots.tolist()) <= set(span_ids(order, w).tolist())
    held = blocks_of(span_ids(order, w), seq_len, bt)
    got = local_ranges(S, seq_len, bt, config, epoch, held)
    base = epoch * S
    assert any(a <= base + starts[w] and base + starts[w + 1] <= b for a, b in got)
    for v in range(order.num_windows):
        lo, hi = base + starts[v], base + starts[v + 1]
        if lo == hi:
            continue
        inside = any(a <= lo and hi <= b for a, b in got)
        need = blocks_of(span_ids(order, v), seq_len, bt)
        assert inside == (len(need & held) >= 0.5 * len(need))


def test_the_coordinator_claims_the_windows_the_plan_has() -> None:
    """What the lease table claims for a node (from the stream description alone) is the
    window the plan puts a position in, for both orders, away from an epoch's ends (and
    with no short shard or unit, which moves the windows after it a little)."""
    import json

    from stoker.coordinator import locality

    S = 204_800  # a multiple of both unit sizes
    for config in (
        plan.ShuffleConfig(3, True, 256, 16, order="window"),
        plan.ShuffleConfig(3, True, 256, 16, "spread", 4),
        plan.ShuffleConfig(3, True, 100, 3, "spread", 7),
    ):
        desc = {"num_samples": S, "shard_size": 256 if config.shard_size == 256 else 100}
        desc.update(window_shards=config.window_shards, order=config.order, spread=config.spread)
        geometry = locality.windows(json.dumps(desc))
        assert geometry is not None
        order = plan.epoch_order(S, config, 2)
        starts = order.window_start(np.arange(order.num_windows + 1))
        for x in range(S // 4, 3 * S // 4, 997):
            claimed: list[tuple[int, int]] = []
            locality.claim(claimed, geometry, 2 * S + x, 2 * S + x + 1)
            w = int(np.searchsorted(starts, x, side="right")) - 1
            assert claimed == [(2 * S + int(starts[w]), 2 * S + int(starts[w + 1]))]


def test_a_spread_jobs_leases_span_four_times_a_units_reach() -> None:
    """A fresh lease of a spread-order job is at least four times the turns a unit's
    samples are dealt over (a block's samples then lie in one lease, or in the next one
    its reader already knows); a window-order job keeps the configured size."""
    import json

    from stoker.coordinator import locality
    from stoker.coordinator.leases import LeaseTable
    from stoker.coordinator.model import Config

    S, unit = 200_000, 256
    turns = len(plan.spread_profile(unit, 4))
    spread = json.dumps(
        {"num_samples": S, "shard_size": unit, "window_shards": 16, "order": "spread", "spread": 4}
    )
    window = json.dumps({"num_samples": S, "shard_size": unit, "window_shards": 16})
    assert locality.lease_size(window, 4096) == 4096
    assert locality.lease_size(spread, 4096) == 4 * (turns + 1) * unit > 4096
    assert locality.lease_size(spread, 10**6) == 10**6  # a larger setting stands
    assert locality.lease_size("not json", 4096) == 4096
    for stream, size in ((spread, 4 * (turns + 1) * unit), (window, 4096)):
        table = LeaseTable(0, [(0, S)], 1, Config(lease_size=4096))
        c = table.register(0, 0, 0.0, stream=stream)
        grant = table.request(c, 0.0)
        assert grant is not None and grant.end - grant.start == size


def _spread_stream(S: int, unit: int = 256) -> str:
    import json

    return json.dumps(
        {"num_samples": S, "shard_size": unit, "window_shards": 16, "order": "spread", "spread": 4}
    )


def test_the_journal_keeps_the_lease_size_the_table_granted() -> None:
    """A replay grants what the live table granted; a journal written before leases were
    sized by the stream (no size in it) replays with the configured size, as it ran."""
    from stoker.coordinator.leases import LeaseTable
    from stoker.coordinator.model import Config, Event

    S = 200_000
    live = LeaseTable(0, [(0, S)], 1, Config(lease_size=4096))
    c = live.register(0, 0, 0.0, stream=_spread_stream(S))
    first = live.request(c, 0.0)
    assert first is not None and first.end - first.start > 4096
    assert LeaseTable.replay(live.events).state() == live.state()
    # the same calls as an older coordinator journaled them
    old = [
        Event(e.kind, e.now, {k: v for k, v in e.args.items() if k != "lease_size"})
        for e in live.events
    ]
    replayed = LeaseTable.replay(old)
    (lease,) = replayed.leases.values()
    assert lease.end - lease.start == 4096


def test_a_ranks_consumers_share_its_room_in_long_leases() -> None:
    from stoker.coordinator.leases import LeaseTable
    from stoker.coordinator.model import Config

    S = 60_000  # less than four long leases
    table = LeaseTable(0, [(0, S)], 1, Config(lease_size=1024))
    stream = _spread_stream(S)
    ids = [table.register(0, w, 0.0, stream=stream) for w in range(4)]
    sizes = []
    for c in ids:
        g = table.request(c, 0.0)
        assert g is not None
        sizes.append(g.end - g.start)
    assert table.steals == 0  # every consumer got a fresh lease, none was split
    assert all(1024 <= n <= S // 4 for n in sizes), sizes


def test_a_mixtures_lease_gives_each_source_the_lease_it_would_take_alone() -> None:
    """A source of least weight w sees about w of a mixture's lease: the lease is the
    longest of the sources' own over their least weights (capped), at least the setting."""
    import json

    from stoker.coordinator import locality

    S, unit = 200_000, 256
    spread = json.loads(_spread_stream(S, unit))
    alone = locality.lease_size(json.dumps(spread), 0)
    window = {"num_samples": S, "shard_size": unit, "window_shards": 16}
    weights = {"names": ["a", "b"], "linear": True,
               "points": [[0, ["1/2", "1/2"]], [100, ["7/8", "1/8"]]]}  # fmt: skip

    def mixture(a: dict, b: dict, w: dict = weights) -> str:
        return json.dumps({"mixture": {"a": a, "b": b}, "weights": w, "world": 2,
                           "batch_size": 8, "steps_per_epoch": 10})  # fmt: skip

    assert locality.lease_size(mixture(window, spread), 4096) == alone * 8  # b's least: 1/8
    assert locality.lease_size(mixture(spread, window), 4096) == alone * 2  # a's least: 1/2
    assert locality.lease_size(mixture(window, window), 4096) == 4096
    # the positions an epoch holds: 10 steps x 8 x 2 ranks (a dataset's: not said)
    assert locality.positions_per_epoch(mixture(window, window)) == 160
    assert locality.positions_per_epoch(json.dumps(window)) is None
    assert locality.positions_per_epoch("[1]") is None
    none = {**weights, "points": [[0, ["1", "0"]]]}  # a source of weight 0 reads nothing
    assert locality.lease_size(mixture(window, spread, none), 4096) == 4096
    later = {**weights, "points": [[0, ["1", "0"]], [100, ["3/4", "1/4"]]]}  # read from 100
    assert locality.lease_size(mixture(window, spread, later), 4096) == alone * 4
    broken = {**weights, "points": [[0, ["1/0", "1"]]]}
    assert locality.lease_size(mixture(spread, window, broken), 4096) == 4096
    tiny = {**weights, "points": [[0, ["1/1048576", "1048575/1048576"]]]}
    assert locality.lease_size(mixture(spread, window, tiny), 4096) == locality.MIXTURE_LEASE_MAX
