"""The mixture's reader (stoker.mixture.reader): each source's rows read ahead a chunk at
a time, against readers that check the protocol (fills in plan order) and count their
reads."""

from __future__ import annotations

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as hs

from stoker.loader.batch import SAMPLE_ID, Field, Layout
from stoker.mixture.reader import SOURCE, MixReader
from stoker.mixture.stream import decode, encode

WIDTH = 5
LAYOUT = Layout({"tokens": Field(torch.int64, (WIDTH,)), "mask": Field(torch.bool, (WIDTH,))})
NARROW = LAYOUT.with_dtypes({"tokens": torch.int32})
MIXED = Layout({**{k: f for k, f in LAYOUT.items() if k != SAMPLE_ID}, SOURCE: Field(torch.int64)})


def row(source: int, sid: int) -> np.ndarray:
    return source * 100_000 + sid * WIDTH + np.arange(WIDTH)


class Checked:
    """A reader of source ``source``: rows from ids; a fill that is not its plan's head
    plans again (as stoker's readers do), counted."""

    def __init__(self, source: int) -> None:
        self.source = source
        self.layout, self.horizon = LAYOUT, 1
        self.planned = np.zeros(0, dtype=np.int64)
        self.pos = 0
        self.fills: list[int] = []
        self.seen: list[int] = []  # every id filled, in order
        self.replans = 0
        self.closed = False

    def plan(self, upcoming: np.ndarray) -> None:
        self.planned, self.pos = np.asarray(upcoming, dtype=np.int64), 0

    def fill(self, ids: np.ndarray, out: dict[str, np.ndarray]) -> None:
        n = len(ids)
        if not np.array_equal(self.planned[self.pos : self.pos + n], ids):
            self.replans += 1
            self.plan(ids)
        assert set(out) == {"tokens", "mask"} and out["tokens"].dtype == np.int32
        for j, sid in enumerate(ids.tolist()):
            out["tokens"][j] = row(self.source, sid)
            out["mask"][j] = (row(self.source, sid) % 3) == 0
        self.pos += n
        self.fills.append(n)
        self.seen += ids.tolist()

    def close(self) -> None:
        self.closed = True


def reader(k: int = 3, chunk: int = 16) -> tuple[MixReader, list[Checked]]:
    rs = [Checked(i) for i in range(k)]
    return MixReader(rs, [NARROW] * k, MIXED, 1, chunk=chunk), rs  # type: ignore[list-item]


def check(ids: np.ndarray, out: dict[str, np.ndarray]) -> None:
    src, sid = decode(ids)
    np.testing.assert_array_equal(out[SOURCE], src)
    want = np.array(
        [row(s, i) for s, i in zip(src.tolist(), sid.tolist(), strict=True)], dtype=np.int64
    ).reshape(len(ids), WIDTH)
    np.testing.assert_array_equal(out["tokens"], want)
    np.testing.assert_array_equal(out["mask"], want % 3 == 0)


def mixed_ids(rng: np.random.Generator, n: int, k: int = 3) -> np.ndarray:
    """``n`` mixture ids: sources at random, each source's ids counting up from a random
    start (a source's ids are its own order)."""
    src = rng.integers(0, k, size=n)
    sid = np.zeros(n, dtype=np.int64)
    for i in range(k):
        at = src == i
        sid[at] = int(rng.integers(0, 1000)) + np.arange(int(at.sum()))
    return encode(src, sid)


def test_a_source_is_read_a_chunk_at_a_time_not_once_a_batch() -> None:
    rng = np.random.default_rng(0)
    ids = mixed_ids(rng, 4000)
    mix, rs = reader(chunk=64)
    mix.plan(ids)
    for a in range(0, len(ids), 8):
        out = MIXED.allocate(8)
        mix.fill(ids[a : a + 8], out)
        check(ids[a : a + 8], out)
    src = decode(ids)[0]
    for i, r in enumerate(rs):
        n = int((src == i).sum())
        assert sum(r.fills) == n and r.replans == 0
        # reads double from the first batch's need (1, 2, 4, ... 64), then each tops the
        # buffer up to a chunk (fewer than a batch's rows were left)
        assert len(r.fills) <= n // (64 - 8) + 8, (len(r.fills), n)
        assert r.fills[0] == int((src[:8] == i).sum())  # the first batch waits for its own


def test_planning_the_rest_keeps_the_rows_read_ahead() -> None:
    """The consumer plans again from its next batch on (a longer plan): rows already read
    stay, and no reader is asked for a sample twice."""
    rng = np.random.default_rng(1)
    ids = mixed_ids(rng, 600)
    mix, rs = reader()
    mix.plan(ids[:100])
    for a in range(0, 600, 10):
        if a and a % 50 == 0:
            mix.plan(ids[a : a + 100])
        out = MIXED.allocate(10)
        mix.fill(ids[a : a + 10], out)
        check(ids[a : a + 10], out)
    src = decode(ids)[0]
    assert [sum(r.fills) for r in rs] == [int((src == i).sum()) for i in range(3)]
    assert all(r.replans == 0 for r in rs)


@settings(max_examples=150, deadline=None)
@given(
    seed=hs.integers(0, 2**32 - 1),
    chunk=hs.integers(1, 20),
    steps=hs.lists(
        hs.tuples(hs.sampled_from(["fill", "fill", "fill", "extend", "replace", "stray"]),
                  hs.integers(0, 40)),
        min_size=1,
        max_size=40,
    ),
)  # fmt: skip
def test_any_sequence_of_plans_and_fills_gives_the_right_rows(
    seed: int, chunk: int, steps: list[tuple[str, int]]
) -> None:
    """Fills of any size (larger than a chunk too), the plan extended, replaced by another,
    or a fill of ids never planned: every row is its id's."""
    rng = np.random.default_rng(seed)
    mix, rs = reader(chunk=chunk)
    plan = mixed_ids(rng, 50)
    mix.plan(plan)
    at = 0
    for what, n in steps:
        if what == "extend":  # the rest of the plan and more, from the next fill on
            plan = np.concatenate([plan[at:], mixed_ids(rng, n)])
            at = 0
            mix.plan(plan)
        elif what == "replace":
            plan, at = mixed_ids(rng, n + 1), 0
            mix.plan(plan)
        elif what == "stray":  # ids nobody planned: read all the same
            ids = mixed_ids(rng, n)
            out = MIXED.allocate(n)
            mix.fill(ids, out)
            check(ids, out)
            plan, at = ids, n  # the reader knows nothing after them
        else:
            n = min(n, len(plan) - at)
            out = MIXED.allocate(n)
            mix.fill(plan[at : at + n], out)
            check(plan[at : at + n], out)
            at += n
    mix.close()
    assert all(r.closed for r in rs)


def test_a_new_plan_keeps_the_rows_held_that_begin_it() -> None:
    """A plan that starts with some of the rows read ahead (a lease's tail taken away)
    keeps those: none is read twice."""
    mix, rs = reader(k=1, chunk=16)
    ids = encode(0, np.arange(100))
    mix.plan(ids)
    for a in (0, 4):  # reads of 4 rows, then 8: rows 8-11 held ahead
        out = MIXED.allocate(4)
        mix.fill(ids[a : a + 4], out)
    assert rs[0].seen == list(range(12))
    new = np.concatenate([ids[8:10], encode(0, np.arange(500, 520))])
    mix.plan(new)
    out = MIXED.allocate(10)
    mix.fill(new[:10], out)
    check(new[:10], out)
    assert rs[0].seen.count(8) == rs[0].seen.count(9) == 1  # kept, not read again
    assert rs[0].seen[12:] == list(range(500, 508))
