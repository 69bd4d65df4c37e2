"""The consumer loop's planner: the reader always sees ``horizon`` samples ahead, into
the next epoch where the source says so, and re-plans when the source changes."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import torch

from stoker import plan
from stoker.loader import state as st
from stoker.loader.batch import Field, Layout
from stoker.loader.consumer import ConsumerSpec, Made, Planner, allocate, produce
from stoker.loader.sources import Segments, StaticSource


class Recorder:
    """A reader that records its plans and fills rows with their sample ids."""

    horizon = 6
    layout = Layout({"x": Field(torch.int64, (2,))})

    def __init__(self) -> None:
        self.plans: list[list[int]] = []
        self.read: list[int] = []
        self.closed = False

    def plan(self, upcoming: np.ndarray) -> None:
        self.plans.append(upcoming.tolist())

    def fill(self, ids: np.ndarray, out: dict[str, np.ndarray]) -> None:
        self.read.extend(ids.tolist())
        out["x"][...] = ids[:, None]

    def close(self) -> None:
        self.closed = True


def _progress(epoch: int, n: int) -> st.Progress:
    return st.Progress(epoch, np.array([[epoch * n, epoch * n + n]], dtype=np.int64), 1, 4)


def identity(p: np.ndarray) -> np.ndarray:
    return np.asarray(p, dtype=np.int64)


def test_plans_into_the_next_epoch_without_handing_it_out() -> None:
    nxt = StaticSource(_progress(1, 100), 0, 0, 1, 4)
    source = StaticSource(_progress(0, 12), 0, 0, 1, 4, following=nxt)
    reader = Recorder()
    planner = Planner(source, identity, reader, horizon=6)
    seen = [planner(pos).tolist() for pos, _ in source.batches(4)]
    assert seen == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]  # the tail is never handed out
    assert len(reader.plans[0]) >= 4 + 6  # the batch and at least `horizon` more
    last = reader.plans[-1]
    assert last[:4] == [8, 9, 10, 11]  # planned from the last batch on
    assert 100 in last  # and it sees the next epoch's first samples


def test_every_read_is_planned_with_at_least_the_horizon_ahead_while_data_lasts() -> None:
    source = StaticSource(_progress(0, 500), 0, 0, 1, 4)
    reader = Recorder()
    planner = Planner(source, identity, reader, horizon=40)
    for pos, _ in source.batches(4):
        ids = planner(pos)
        current = reader.plans[-1]
        i = current.index(int(ids[0]))
        assert current[i : i + len(ids)] == ids.tolist()  # what is read is what was planned
        assert len(current) - i >= min(40, 500 - int(ids[0]))  # and the horizon beyond it


class Stealing:
    """A source whose announced future changes (the end of a lease stolen)."""

    epoch = consumer = first_step = reregistered = 0

    def __init__(self) -> None:
        self.calls = 0

    def batches(self, size: int) -> Iterator[tuple[np.ndarray, Segments]]:
        yield np.arange(0, 4), []
        yield np.arange(50, 54), []  # not what upcoming() said: another lease

    def upcoming(self, limit: int) -> np.ndarray:
        self.calls += 1
        return np.arange(4, 4 + limit) if self.calls == 1 else np.arange(54, 54 + limit)


def test_a_batch_that_was_not_announced_replans() -> None:
    reader = Recorder()
    source = Stealing()
    planner = Planner(source, identity, reader, horizon=8)
    got = [planner(p).tolist() for p, _ in source.batches(4)]
    assert got == [[0, 1, 2, 3], [50, 51, 52, 53]]
    assert reader.plans[-1][:4] == [50, 51, 52, 53]


def test_produce_fills_what_take_gives_and_closes_the_reader() -> None:
    reader = Recorder()
    stream = plan.Stream(20, plan.ShuffleConfig(0, True, None, 4).resolve(1))
    spec = ConsumerSpec(
        source=lambda w: StaticSource(_progress(0, 20), 0, w, 1, 4),
        samples=stream.samples,
        reader=lambda _epoch: reader,
        batch_size=4,
    )
    made = [e for e in produce(spec, 0, allocate(reader.layout)) if isinstance(e, Made)]
    ids = [i for m in made for i in m.arrays["sample_id"].tolist()]
    assert sorted(ids) == list(range(20)) and ids == stream.samples(np.arange(20)).tolist()
    for m in made:
        assert (m.arrays["x"][:, 0] == m.arrays["sample_id"]).all()
    assert reader.closed


class Leases:
    """A source of two leases of 40 positions, the second granted only after 20 positions of
    the first were handed out (as a coordinator's consumer asks ahead half way)."""

    epoch = consumer = first_step = reregistered = 0

    def __init__(self) -> None:
        self.handed = 0

    def batches(self, size: int) -> Iterator[tuple[np.ndarray, Segments]]:
        for a in range(0, 80, size):
            self.handed = a + size
            yield np.arange(a, a + size, dtype=np.int64), []

    def upcoming(self, limit: int) -> np.ndarray:
        known = 80 if self.handed > 20 else 40
        return np.arange(self.handed, known, dtype=np.int64)[:limit]


def test_a_lease_granted_ahead_is_planned_before_it_is_reached() -> None:
    """The source said all it knew at the first lease's end; once it knows the next lease
    the reader is planned into it well before the first lease is read out."""
    source = Leases()
    reader = Recorder()
    planner = Planner(source, identity, reader, horizon=24)  # the first plan is short
    first_at = None
    for pos, _ in source.batches(4):
        planner(pos)
        if first_at is None and any(60 in p for p in reader.plans):
            first_at = int(pos[0])
    assert first_at is not None and first_at < 40  # planned while still in the first lease
