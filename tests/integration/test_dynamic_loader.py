"""TokenLoader fed by a coordinator process: exactly once, equal batches per rank, real content."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

import stoker
from stoker import plan
from stoker.coordinator.client import CoordinatorClient

from .helpers import Written, check_samples, unbatch, write_dataset

SEQ_LEN = 32


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Written:
    root = tmp_path_factory.mktemp("dyn")
    return write_dataset(root / "ds", num_docs=120, seed=11, block_tokens=512, blocks_per_file=4)


@pytest.fixture
def coordinator(tmp_path: Path, dataset: Written):
    def start(world: int, lease_size: int = 40):
        proc = subprocess.Popen(
            [sys.executable, "-m", "stoker.cli", "coordinator", "--state", str(tmp_path / "state"),
             "--world", str(world), "--dataset", str(dataset.path), "--seq-len", str(SEQ_LEN),
             "--lease-size", str(lease_size)],
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
        p.kill()
        p.wait()


@pytest.mark.parametrize("num_workers", [0, 2])
def test_two_ranks_through_the_coordinator(coordinator, dataset: Written, num_workers: int) -> None:
    client = coordinator(world=2)
    B = 5
    per_rank: dict[int, list[dict]] = {}
    batches_per_rank = {}
    for rank in (0, 1):
        ds = stoker.TokenDataset(str(dataset.path), SEQ_LEN, batch_size=B, rank=rank, world_size=2)
        loader = stoker.TokenLoader(ds, num_workers, coordinator=client)
        batches = list(loader)
        assert all(len(b["sample_id"]) == B for b in batches[:-1])
        batches_per_rank[rank] = len(batches)
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
