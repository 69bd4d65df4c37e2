"""The coordinator's metadata service: readers take the manifest and the block index from it,
and only blocks from storage (checked against a real nginx origin's access log)."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

import stoker
from stoker.coordinator.client import CoordinatorClient

from .helpers import Written, check_samples, reap, unbatch, write_dataset

SEQ_LEN = 32


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Written:
    root = tmp_path_factory.mktemp("meta")
    return write_dataset(root / "ds", num_docs=60, seed=3, block_tokens=512, blocks_per_file=4)


@pytest.fixture
def start_coordinator(tmp_path: Path) -> Iterator:
    procs: list[subprocess.Popen[str]] = []

    def start(*source: str) -> CoordinatorClient:
        proc = subprocess.Popen(
            [sys.executable, "-m", "stoker.cli", "coordinator", "--state", str(tmp_path / "st"),
             "--world", "1", *source],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
        procs.append(proc)
        assert proc.stdout is not None
        for line in proc.stdout:
            if "serving" in line:
                return CoordinatorClient(line.split("serving ")[1].split()[0], retry_for=10)
        raise AssertionError("coordinator did not start")

    yield start
    for p in procs:
        reap(p)


def test_readers_take_manifest_and_index_from_the_coordinator(
    nginx_origin, dataset: Written, start_coordinator
) -> None:
    origin = nginx_origin(dataset.path.parent)
    url = origin.url_for("ds")
    client = start_coordinator("--dataset", url, "--seq-len", str(SEQ_LEN))
    origin.sync_access_log()
    origin.clear_access_log()  # the coordinator's own reads are done
    rows = []
    for _ in range(3):  # three readers, e.g. three ranks
        ds = stoker.TokenDataset(url, SEQ_LEN, batch_size=4, metadata=client)
        rows += unbatch(stoker.TokenLoader(ds))
    paths = Counter(r.path for r in origin.access_log())
    index_path = "/ds/" + dataset.manifest.index.path
    assert paths["/ds/manifest.json"] == 0 and paths[index_path] == 0
    assert sum(n for p, n in paths.items() if p.startswith("/ds/data/")) > 0  # blocks: storage
    ids = check_samples(dataset, SEQ_LEN, rows)  # the content is right
    assert sorted(Counter(ids).values()) == [3] * dataset.num_samples(SEQ_LEN)


def test_a_reader_of_another_dataset_or_a_coordinator_without_one_is_refused(
    dataset: Written, start_coordinator, tmp_path: Path
) -> None:
    client = start_coordinator("--dataset", str(dataset.path), "--seq-len", str(SEQ_LEN))
    other = dataset.copy_to(tmp_path / "other")
    with pytest.raises(stoker.ManifestError, match=r"serves .*another dataset"):
        stoker.TokenDataset(str(other.path), SEQ_LEN, metadata=client)
    bare = start_coordinator("--num-samples", "100")
    with pytest.raises(stoker.ManifestError, match="serves no dataset"):
        stoker.TokenDataset(str(dataset.path), SEQ_LEN, metadata=bare)
