"""A mixture plan's state (stoker.mixture.plan.MixPlan): small whatever the position,
an exact continuation on the same sources and weights, every source continuing from
where it stood when the weights change or a source is added or removed at a restore."""

from __future__ import annotations

import json
from fractions import Fraction

import pytest

from stoker.errors import StateError
from stoker.mixture.plan import MixPlan
from stoker.mixture.schedule import WeightSchedule

SIZES = {0: 37, 1: 11, 2: 5}  # epoch sizes: the small sources repeat often


def plan(weights: dict[str, float], world: int = 3, batch: int = 4) -> MixPlan:
    names = list(weights)
    return MixPlan(
        WeightSchedule.constant(weights),
        batch,
        world,
        lambda source, epoch: SIZES[["web", "code", "math", "books"].index(names[source]) % 3],
    )


def steps(p: MixPlan, n: int) -> list[tuple]:
    out = []
    for _ in range(n):
        s = p.next()
        out.append((s.step, s.taken, [s.rank_items(r) for r in range(p.world)]))
    return out


WEIGHTS = {"web": 0.6, "code": 0.3, "math": 0.1}


def test_a_restore_continues_exactly() -> None:
    whole = steps(plan(WEIGHTS), 60)
    first = plan(WEIGHTS)
    steps(first, 23)
    state = json.loads(json.dumps(first.state_dict()))  # as it would be saved
    again = plan(WEIGHTS)
    again.load_state_dict(state)
    assert steps(again, 37) == whole[23:]


def test_the_state_stays_small_whatever_the_position() -> None:
    p = plan(WEIGHTS)
    steps(p, 5)
    small = len(json.dumps(p.state_dict()))
    for _ in range(20_000):
        p.next()
    assert len(json.dumps(p.state_dict())) <= small + 40  # a few more digits, no more
    assert p.counts == tuple(p.state_dict()["sources"][n]["count"] for n in WEIGHTS)
    assert sum(p.counts) == 20_005 * 12


def test_new_weights_at_a_restore_take_over_from_the_next_step() -> None:
    p = plan(WEIGHTS)
    steps(p, 30)
    state = p.state_dict()
    at = dict(zip(WEIGHTS, p.counts, strict=True))
    q = plan({"web": 0.1, "code": 0.1, "math": 0.8})
    q.load_state_dict(state)
    assert q.counts == tuple(at.values()) and q.step == 30
    steps(q, 50)
    # from the restore on, each source's count follows the new weights within one sample
    for name, w in zip(
        ("web", "code", "math"), (Fraction(1, 10), Fraction(1, 10), Fraction(8, 10)), strict=True
    ):
        grown = q.counts[list(WEIGHTS).index(name)] - at[name]
        assert abs(grown - 50 * 12 * w) < 1, name
    # and every source went on from its own position in its own epochs
    assert q.epochs != [(0, 0)] * 3


def test_a_source_added_or_removed_at_a_restore() -> None:
    p = plan(WEIGHTS)
    steps(p, 10)
    state = p.state_dict()
    grown = plan({"web": 0.5, "code": 0.25, "books": 0.25})  # math out, books in
    grown.load_state_dict(state)
    assert grown.counts == (p.counts[0], p.counts[1], 0)  # books from its beginning
    assert grown.epochs[2] == (0, 0)
    steps(grown, 40)
    assert abs((grown.counts[2]) - 40 * 12 * Fraction(1, 4)) < 1


@pytest.mark.parametrize(
    ("edit", "match"),
    [
        (lambda s: s.update(mixture_state=9), "version"),
        (lambda s: s.update(step=-1), "'step'"),
        (lambda s: s["sources"]["web"].update(count="3"), "sources.web.count"),
        (lambda s: s["regime"].pop("world"), "regime.world"),
        (lambda s: s["regime"].update(world=5), "world 5"),
        (lambda s: s.update(sources=["web", "code", "math"]), "must be objects"),
        (lambda s: s.update(sources=None), "must be objects"),
        (lambda s: s["sources"].update(web=3), "'sources.web' must be an object"),
        (lambda s: s["regime"].update(counts=[0, 0, 0]), "'regime.counts' must be an object"),
        (lambda s: s["sources"]["math"].update(taken=99), "its epoch 0 deals 5"),
        (lambda s: s["sources"]["web"].update(count=10**6), "do not follow from its regime"),
    ],
)
def test_a_bad_state_is_refused_by_field(edit, match: str) -> None:
    p = plan(WEIGHTS)
    steps(p, 3)
    state = json.loads(json.dumps(p.state_dict()))
    edit(state)
    with pytest.raises(StateError, match=match):
        plan(WEIGHTS).load_state_dict(state)
