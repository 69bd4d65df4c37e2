"""The mixture's position map (stoker.mixture.stream): pure, tested without data."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as hs

from stoker import intervals
from stoker.mixture.plan import MixPlan
from stoker.mixture.schedule import WeightSchedule
from stoker.mixture.stream import (
    MAX_SOURCE_SAMPLES,
    MAX_SOURCES,
    MixStream,
    decode,
    encode,
    share_positions,
    share_start,
    source_epochs,
    source_positions,
)

SCHEDULE = WeightSchedule.constant({"a": 5, "b": 3, "c": 2})
SIZES = [50, 17, 9]


def stream(world: int, batch: int, spe: int, base: dict | None = None) -> MixStream:
    return MixStream(
        lambda: MixPlan(SCHEDULE, batch, world, lambda i, _e: SIZES[i]),
        base,
        spe,
        [lambda p: np.asarray(p, dtype=np.int64) for _ in SIZES],  # position = id
        SIZES,
    )


@given(
    size=hs.integers(1, 200),
    world=hs.integers(1, 9),
    cut=hs.lists(hs.tuples(hs.integers(0, 300), hs.integers(1, 40)), max_size=4),
)
def test_shares_cover_an_epoch_set_once_in_contiguous_runs(
    size: int, world: int, cut: list[tuple[int, int]]
) -> None:
    iv = intervals.subtract(
        intervals.make([(1000, 1000 + size)]),
        intervals.make([(1000 + a, 1000 + a + n) for a, n in cut]),
    )
    n = intervals.size(iv)
    got = []
    for r in range(world):
        k = -(-(n - r) // world) if n > r else 0  # rank r's share: ceil((n - r) / world)
        assert share_start(n, world, r) == sum(-(-(n - q) // world) for q in range(r))
        pos = share_positions(iv, world, np.full(k, r), np.arange(k))
        got.extend(pos.tolist())
    assert got == intervals.members_at(iv, np.arange(n)).tolist()


def test_ids_encode_their_source_and_its_epoch() -> None:
    top = MAX_SOURCE_SAMPLES - 1
    got = encode(
        np.array([0, 2, 7, MAX_SOURCES - 1]), np.array([5, top, 0, top]), np.array([0, 3, 65537, 9])
    )
    src, ids = decode(got)
    assert src.tolist() == [0, 2, 7, MAX_SOURCES - 1] and ids.tolist() == [5, top, 0, top]
    assert source_epochs(got).tolist() == [0, 3, 1, 9]  # (modulo 2 ** 16)
    assert (got >= 0).all() and len(set(got.tolist())) == 4


@settings(max_examples=40, deadline=None)
@given(world=hs.integers(1, 4), batch=hs.integers(1, 6), spe=hs.integers(1, 12))
def test_every_rank_every_step_and_each_source_epoch_once(world: int, batch: int, spe: int) -> None:
    s = stream(world, batch, spe)
    per_rank = spe * batch
    steps = 3 * spe
    seen: dict[int, list[int]] = {0: [], 1: [], 2: []}
    for step in range(steps):
        e, m = divmod(step, spe)
        row = []
        for r in range(world):
            pos = e * per_rank * world + r * per_rank + m * batch + np.arange(batch)
            ids = s.samples(pos)
            assert np.array_equal(ids, s.rank_ids(step, r))
            row.extend(ids.tolist())
        assert len(set(row)) == len(row) == world * batch
        src, sid = decode(np.array(row))
        for i in range(3):
            seen[i].extend(sid[src == i].tolist())
    for i, size in enumerate(SIZES):
        ids = np.array(seen[i], dtype=np.int64)  # source epoch f: [f S, (f + 1) S), once each
        for f in range(int(ids.max()) // size + 1 if len(ids) else 0):
            mine = ids[ids // size == f]
            assert len(set(mine.tolist())) == len(mine)
            if f < len(ids) // size:  # an epoch that has run out by now was read whole
                assert len(mine) == size


def test_a_stream_from_a_state_maps_as_the_one_from_the_start() -> None:
    world, batch, spe = 3, 4, 10
    plan = MixPlan(SCHEDULE, batch, world, lambda i, _e: SIZES[i])
    for _ in range(13):
        plan.next()
    late = stream(world, batch, spe, plan.state_dict())
    early = stream(world, batch, spe)
    for step in range(13, 40):
        for r in range(world):
            assert np.array_equal(late.rank_ids(step, r), early.rank_ids(step, r))


def test_a_step_gone_from_what_is_kept_is_planned_again() -> None:
    s = stream(2, 3, 5)
    s.KEEP = 4 * 3  # rows: four steps of three, so the least kept, 16 steps
    first = [s.rank_ids(step, 1).copy() for step in range(40)]
    assert sum(len(a) for a in s._kept.values()) == 16  # steps kept
    assert s._find(1, 0) is None
    assert np.array_equal(s.rank_ids(0, 1), first[0])
    assert np.array_equal(s.rank_ids(1, 0), stream(2, 3, 5).rank_ids(1, 0))


@settings(max_examples=30, deadline=None)
@given(world=hs.integers(1, 12), seed=hs.integers(0, 2**32 - 1))
def test_positions_in_any_order_map_as_each_ranks_own_stream(world: int, seed: int) -> None:
    """A coordinator's consumer reads stretches of any rank's positions, in the order its
    leases come (here, random stretches of random ranks): each maps as that rank's own
    stream maps it, with a few ranks' plans kept at most."""
    batch, spe = 3, 40
    rng = np.random.default_rng(seed)
    s = stream(world, batch, spe)
    s.AHEAD = 8  # (stretches of a few steps: many plans, and many made again)
    per_rank = spe * batch
    alone = stream(world, batch, spe)  # each rank's ids of each step, one rank at a time
    want = {
        r: np.concatenate([alone.rank_ids(step, r) for step in range(3 * spe)])
        for r in range(world)
    }
    for _ in range(25):
        epoch, r = int(rng.integers(0, 3)), int(rng.integers(0, world))
        lo = int(rng.integers(0, per_rank))
        m = np.arange(lo, min(per_rank, lo + int(rng.integers(1, 50))))
        got = s.samples(epoch * per_rank * world + r * per_rank + m)
        assert got.tolist() == want[r][epoch * per_rank + m].tolist()
        assert len(s._plans) <= s.PLANS


def test_one_call_over_more_than_is_kept_maps_every_position() -> None:
    """A planner asks for a batch and twice its horizon at once: more rows of one rank
    than the stream keeps. Every one is mapped (what is let go goes after the call)."""
    world, batch, spe = 2, 3, 200
    s = stream(world, batch, spe)
    s.KEEP = 8 * batch  # rows: the least kept is 16 steps, a call covers 150
    s.AHEAD = 4
    per_rank = spe * batch
    pos = per_rank + np.arange(10, 460)  # rank 1's positions of steps 3 to 153
    got = s.samples(pos)
    alone = stream(world, batch, spe)
    want = [alone.rank_ids(k // batch, 1)[k % batch] for k in range(10, 460)]
    assert got.tolist() == want
    assert sum(len(a) for a in s._kept.values()) <= 16 * 2  # and then let go


def test_a_new_ranks_plan_starts_from_the_furthest_one_behind_it(monkeypatch) -> None:
    """Under a coordinator a consumer reads many ranks' steps late in the run: a rank it
    has not read yet starts from another rank's plan, not from the stream's first step."""
    world, batch, spe = 4, 2, 50
    s = stream(world, batch, spe)
    s.AHEAD = 4
    per_rank = spe * batch
    at = 7 * per_rank * world  # epoch 7
    s.samples(at + np.arange(0, 8))  # rank 0 walks to epoch 7
    walks: list[tuple[int, int]] = []
    skip_to = MixPlan.skip_to

    def recorded(plan: MixPlan, step: int) -> None:
        walks.append((plan.step, step))
        skip_to(plan, step)

    monkeypatch.setattr(MixPlan, "skip_to", recorded)
    got = s.samples(at + per_rank + np.arange(0, 8))  # rank 1, the same steps
    assert walks and all(start >= 7 * spe for start, _ in walks)  # no walk from step 0
    monkeypatch.undo()
    alone = stream(world, batch, spe)
    want = [alone.rank_ids(7 * spe + k // batch, 1)[k % batch] for k in range(8)]
    assert got.tolist() == want


@settings(deadline=None, max_examples=30)
@given(
    world=hs.integers(1, 5),
    batch=hs.integers(1, 6),
    spe=hs.integers(1, 30),
    at=hs.integers(0, 80),
    n=hs.integers(1, 40),
)
def test_every_ranks_steps_in_one_walk_map_as_their_positions(
    world: int, batch: int, spe: int, at: int, n: int
) -> None:
    s = stream(world, batch, spe)
    got = s.step_ids(at, n)
    assert got.shape == (world, n, batch)
    per_rank = spe * batch
    for r in range(world):
        steps = np.arange(at, at + n)
        e, m = np.divmod(steps, spe)
        pos = (e * per_rank * world + r * per_rank + m * batch)[:, None] + np.arange(batch)
        np.testing.assert_array_equal(
            got[r], stream(world, batch, spe).samples(pos.ravel()).reshape(n, batch)
        )


@given(
    size=hs.integers(1, 60),
    world=hs.integers(1, 5),
    epochs=hs.lists(hs.integers(0, 4), min_size=1, max_size=30),
    cut=hs.integers(0, 59),
    data=hs.data(),
)
def test_source_positions_of_many_epochs_at_once_are_each_epochs_own(
    size: int, world: int, epochs: list[int], cut: int, data: hs.DataObject
) -> None:
    # source 0's epoch 2 is not whole (a restore on another world left part of it)
    part = intervals.make([(2 * size + min(cut, size - 1), 3 * size)])
    sets = {0: (2, part)}
    n = len(epochs)
    drawn = data.draw(hs.lists(hs.integers(0, world - 1), min_size=n, max_size=n))
    # an owner with a share in its epoch: a rank below the epoch's samples
    left = intervals.size(part)
    owner = np.array([r % min(world, left if e == 2 else size) for r, e in zip(drawn, epochs)])
    local = np.zeros(n, dtype=np.int64)  # each owner's first sample of its share
    got = source_positions(size, np.array(epochs), sets, 0, world, owner, local)
    for j, e in enumerate(epochs):
        if e == 2:
            want = share_positions(part, world, owner[j : j + 1], local[j : j + 1])[0]
        else:
            want = e * size + share_start(size, world, owner[j]) + local[j]
        assert got[j] == want
