"""TokenLoader fed by a coordinator process: exactly once, equal batches per rank, real content."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

import stoker
from stoker import plan
from stoker.coordinator.client import CoordinatorClient

from .helpers import Written, check_samples, reap, unbatch, write_dataset

SEQ_LEN = 32


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Written:
    root = tmp_path_factory.mktemp("dyn")
    return write_dataset(root / "ds", num_docs=120, seed=11, block_tokens=512, blocks_per_file=4)


@pytest.fixture
def coordinator(tmp_path: Path, dataset: Written):
    def start(world: int, lease_size: int = 40, restore: str | None = None):
        for p in procs:  # one coordinator at a time: a new one replaces the last
            reap(p)
        extra = ["--restore", restore] if restore else []
        proc = subprocess.Popen(
            [sys.executable, "-m", "stoker.cli", "coordinator", "--state", str(tmp_path / "state"),
             "--world", str(world), "--dataset", str(dataset.path), "--seq-len", str(SEQ_LEN),
             "--lease-size", str(lease_size), *extra],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
        procs.append(proc)
        assert proc.stdout is not None
        for line in proc.stdout:
            if "serving" in line:
                return CoordinatorClient(line.split("serving ")[1].split()[0])
        raise AssertionError("coordinator did not start")

    procs: list[subprocess.Popen[str]] = []
    yield start
    for p in procs:
        reap(p)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_two_ranks_through_the_coordinator(
    coordinator, dataset: Written, num_workers: int, tmp_path: Path
) -> None:
    client = coordinator(world=2)
    B = 5
    per_rank: dict[int, list[dict]] = {}
    batches_per_rank = {}
    order: dict[int, list[list[int]]] = {}
    for rank in (0, 1):
        ds = stoker.TokenDataset(str(dataset.path), SEQ_LEN, batch_size=B, rank=rank, world_size=2)
        loader = stoker.TokenLoader(ds, num_workers, coordinator=client)
        batches = list(loader)
        assert all(len(b["sample_id"]) == B for b in batches[:-1])
        batches_per_rank[rank] = len(batches)
        order[rank] = [b["sample_id"].tolist() for b in batches]
        per_rank[rank] = unbatch(batches)
        assert loader.last_epoch is not None and loader.last_epoch.dropped == 0
    n = dataset.num_samples(SEQ_LEN)
    quota = n // 2
    assert batches_per_rank[0] == batches_per_rank[1] == -(-quota // B)
    ids = check_samples(dataset, SEQ_LEN, per_rank[0] + per_rank[1])  # content is right
    assert len(ids) == len(set(ids)) == 2 * quota
    # the ids are the epoch's positions through the same pure plan as static reading
    ds = stoker.TokenDataset(str(dataset.path), SEQ_LEN)
    stream = plan.Stream(ds.num_samples, ds.shuffle_config)
    epoch0 = set(stream.samples(np.arange(0, n)).tolist())
    assert set(ids) <= epoch0
    assert Counter(ids).most_common(1)[0][1] == 1
    # the journal replays each rank's exact batch sequence
    assert replayed(tmp_path / "state") == {(0, r): order[r] for r in (0, 1)}


def replayed(state: Path) -> dict[tuple[int, int], list[list[int]]]:
    """``stoker replay``'s batches by (epoch, rank), as a list indexed by step - 1 (steps
    before a rank joined, in a restored run, are None)."""
    out = subprocess.run(
        [sys.executable, "-m", "stoker.cli", "replay", "--state", str(state)],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    got: dict[tuple[int, int], list[list[int]]] = {}
    for line in out.splitlines():
        row = json.loads(line)
        steps = got.setdefault((row["epoch"], row["rank"]), [])
        assert row["step"] > len(steps)  # in order, never twice
        steps.extend([None] * (row["step"] - 1 - len(steps)))
        steps.append(row["sample_ids"])
    return got


def test_checkpoint_at_a_step_restores_on_three_ranks_exactly_once(
    coordinator, dataset: Written, tmp_path: Path
) -> None:
    """Two ranks train in lockstep; rank 0 alone checkpoints after step 3 while rank 1 has
    already taken step 4; the job dies and comes back on three ranks from that state."""
    B, K = 4, 3
    client = coordinator(world=2, lease_size=24)
    loaders = []
    for rank in (0, 1):
        ds = stoker.TokenDataset(str(dataset.path), SEQ_LEN, batch_size=B, rank=rank, world_size=2)
        loaders.append(stoker.TokenLoader(ds, 0, coordinator=client))
    its = [iter(ld) for ld in loaders]
    trained: list[int] = []
    order: dict[int, list[list[int]]] = {0: [], 1: []}
    for _ in range(K):  # steps 1..K on both ranks
        for r, it in enumerate(its):
            order[r].append(next(it)["sample_id"].tolist())
            trained += order[r][-1]
    next(its[1])  # rank 1 is one batch ahead when rank 0 saves: that batch is lost in the crash
    state = loaders[0].state_dict()
    assert state["mode"] == "coordinator" and state["batches"] == K
    assert sorted(state["snapshot"]["consumed"]) == state["snapshot"]["consumed"]
    n = dataset.num_samples(SEQ_LEN)
    consumed = sum(b - a for a, b in state["snapshot"]["consumed"])
    assert consumed == 2 * K * B
    saved = tmp_path / "state" / "checkpoints" / "job" / f"{state['checkpoint']}.json"
    assert saved.is_file()  # also in the coordinator's state store

    # a fresh coordinator on three ranks from the checkpoint (the old one is gone)
    client3 = coordinator(world=3, lease_size=24, restore=state["checkpoint"])
    rows: list[dict] = []
    counts = []
    order3: dict[int, list[list[int]]] = {}
    for rank in range(3):
        ds = stoker.TokenDataset(str(dataset.path), SEQ_LEN, batch_size=B, rank=rank, world_size=3)
        loader = stoker.TokenLoader(ds, 0, coordinator=client3)
        loader.load_state_dict(state)
        batches = list(loader)
        counts.append(len(batches))
        rows += unbatch(batches)
        order3[rank] = [b["sample_id"].tolist() for b in batches]
    after = check_samples(dataset, SEQ_LEN, rows)  # the content is right
    assert len(set(counts)) == 1  # equal batches per rank
    got = Counter(trained + after)
    assert got.most_common(1)[0][1] == 1  # nothing twice
    left = n - len(got)
    assert 0 <= left < 3  # only the part that does not divide by three carries over
    assert left == (n - consumed) % 3
    # the replay of epoch 0: the old run up to the checkpoint, then the restored run
    got_order = replayed(tmp_path / "state")
    assert {k: v for k, v in got_order.items() if k[0] == 0} == {
        (0, 0): order[0] + order3[0],
        (0, 1): order[1] + order3[1],
        (0, 2): [None] * K + order3[2],  # rank 2 joined at step K + 1
    }


def test_a_coordinator_not_restored_from_the_state_is_refused(
    coordinator, dataset: Written
) -> None:
    B = 4
    client = coordinator(world=1, lease_size=24)
    ds = stoker.TokenDataset(str(dataset.path), SEQ_LEN, batch_size=B)
    loader = stoker.TokenLoader(ds, 0, coordinator=client)
    it = iter(loader)
    next(it)
    state = loader.state_dict()
    fresh = coordinator(world=1, lease_size=24)
    other = stoker.TokenLoader(stoker.TokenDataset(str(dataset.path), SEQ_LEN, batch_size=B),
                               0, coordinator=fresh)  # fmt: skip
    other.load_state_dict(state)
    with pytest.raises(stoker.StateError, match=state["checkpoint"]):
        next(iter(other))
    static = stoker.TokenLoader(stoker.TokenDataset(str(dataset.path), SEQ_LEN, batch_size=B))
    with pytest.raises(stoker.StateError, match="coordinator"):
        static.load_state_dict(state)
