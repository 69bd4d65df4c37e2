"""Every stateful front end resumes exactly, through the one check in tests/resume.py: at
the start, mid-epoch, at an epoch's end, mid second epoch, and resumed twice."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from resume import FrontEnd, assert_resumes, assert_same_samples

import stoker

from .helpers import Written, write_dataset

SEQ_LEN, B = 32, 8
CONFIG: dict[str, Any] = {"seed": 5, "shard_size": 6, "window_shards": 3}
SPREAD = stoker.ShuffleConfig(seed=5, shard_size=6, window_shards=3, order="spread", spread=2)


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> Written:
    return write_dataset(tmp_path_factory.mktemp("resume") / "ds", num_docs=50, seed=23)


@pytest.fixture(autouse=True)
def one_rank(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "STOKER_COORDINATOR"):
        monkeypatch.delenv(name, raising=False)


def item_ids(item: dict[str, Any]) -> list[int]:
    return [int(item["sample_id"])]


def batch_ids(batch: dict[str, Any]) -> list[int]:
    return batch["sample_id"].tolist()


def fed_epoch(loader: stoker.TokenLoader) -> int:
    """The coordinator's epoch of the pass in progress (it, not the loader, decides)."""
    assert loader.last_epoch is not None and loader.last_epoch.epoch is not None
    return loader.last_epoch.epoch


@pytest.fixture(scope="module")
def front_ends(written: Written, tmp_path_factory: pytest.TempPathFactory) -> dict[str, FrontEnd]:
    def dataset() -> stoker.TokenDataset:
        return stoker.TokenDataset(str(written.path), SEQ_LEN, batch_size=B, **CONFIG)

    def spread() -> stoker.TokenDataset:  # the second order, through the same front ends
        return stoker.TokenDataset(str(written.path), SEQ_LEN, batch_size=B, shuffle=SPREAD)

    states = itertools.count()
    root = tmp_path_factory.mktemp("coordinator")

    def fed(num_workers: int, of: Any = dataset) -> stoker.TokenLoader:
        # a fresh coordinator (state directory) each time: the old job is gone
        state = str(root / f"state{next(states)}")
        return stoker.TokenLoader(of(), num_workers, coordinator="rank0", coordinator_state=state)

    fes = [
        FrontEnd("dataset", dataset, item_ids),
        FrontEnd("loader0", lambda: stoker.TokenLoader(dataset(), 0), batch_ids),
        FrontEnd("loader2", lambda: stoker.TokenLoader(dataset(), 2), batch_ids),
        FrontEnd(
            "loader2_device", lambda: stoker.TokenLoader(dataset(), 2, device="cpu"), batch_ids
        ),
        FrontEnd(
            "prefetcher",
            lambda: stoker.DevicePrefetcher(stoker.TokenLoader(dataset(), 2), device="cpu"),
            batch_ids,
        ),
        FrontEnd("coordinator0", lambda: fed(0), batch_ids, ordered=False, epoch_of=fed_epoch),
        FrontEnd("coordinator2", lambda: fed(2), batch_ids, ordered=False, epoch_of=fed_epoch),
        FrontEnd("spread_dataset", spread, item_ids),
        FrontEnd("spread_loader2", lambda: stoker.TokenLoader(spread(), 2), batch_ids),
        FrontEnd(
            "spread_coordinator0",
            lambda: fed(0, spread),
            batch_ids,
            ordered=False,
            epoch_of=fed_epoch,
        ),
    ]
    return {fe.name: fe for fe in fes}


NAMES = [
    "dataset",
    "loader0",
    "loader2",
    "loader2_device",
    "prefetcher",
    "coordinator0",
    "coordinator2",
    "spread_dataset",
    "spread_loader2",
    "spread_coordinator0",
]


@pytest.mark.parametrize("name", NAMES)
def test_the_reference_is_every_sample_once_per_epoch(
    front_ends: dict[str, FrontEnd], written: Written, name: str
) -> None:
    """What the resumes are held to: two epochs, each every sample once, in fresh orders."""
    fe = front_ends[name]
    n = written.num_samples(SEQ_LEN)
    ref = fe.reference()
    assert len(ref) == 2
    for e, epoch in enumerate(ref):
        assert_same_samples([i for u in epoch for i in u], range(n), f"{name}, epoch {e}")
        size = 1 if name.endswith("dataset") else B
        assert all(len(u) == size for u in epoch[:-1]) and 1 <= len(epoch[-1]) <= size
    assert ref[0] != ref[1]  # shuffled anew: resuming into the wrong epoch would show
    if fe.ordered:  # every static front end hands out the dataset's one order
        flat = [[i for u in epoch for i in u] for epoch in ref]
        items = front_ends["spread_dataset" if "spread" in name else "dataset"].reference()
        assert flat == [[i for u in epoch for i in u] for epoch in items]


@pytest.mark.parametrize("where", ["start", "mid_epoch", "epoch_end", "mid_second_epoch"])
@pytest.mark.parametrize("name", NAMES)
def test_a_restore_continues_the_run(
    front_ends: dict[str, FrontEnd], name: str, where: str
) -> None:
    fe = front_ends[name]
    assert_resumes(fe, fe.points()[where])


@pytest.mark.parametrize("name", NAMES)
def test_a_restore_of_a_restore_continues_the_run(
    front_ends: dict[str, FrontEnd], name: str
) -> None:
    """Save mid-epoch, restore, take on into the second epoch, save again, restore, finish."""
    fe = front_ends[name]
    n0 = len(fe.reference()[0])
    assert_resumes(fe, n0 // 3, then=n0 - n0 // 3 + 2)


@pytest.mark.parametrize(
    ("name", "into"),
    [("loader2", "loader0"), ("loader0", "prefetcher"), ("loader2_device", "loader2")],
)
def test_a_state_restores_into_another_topology(
    front_ends: dict[str, FrontEnd], name: str, into: str
) -> None:
    """A state says what training took, whoever read it: other workers, a device or none."""
    fe = front_ends[name]
    assert_resumes(fe, fe.points()["mid_epoch"], then=5, into=front_ends[into])
