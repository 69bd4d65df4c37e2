"""``python -m stoker.train`` through the torchrun recipe (deploy/torchrun/train-node.sh)
on this machine: two ranks train a few steps and save; the job started again on one
rank resumes from that checkpoint and finishes the epoch. No sample is trained twice
and none is lost, across the restart and the change of world size; started once more,
the finished job trains nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from servers import free_port

from .helpers import write_dataset
from .test_netns import clean_env, tail

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]


def run(tmp: Path, name: str, ranks: int, *args: str) -> None:
    env = clean_env(
        PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}",
        NNODES="1", NPROC_PER_NODE=str(ranks), RDZV_ENDPOINT=f"127.0.0.1:{free_port()}",
        RDZV_ID=name, DATASET=str(tmp / "ds"), CHECKPOINT=str(tmp / "ckpt"),
    )  # fmt: skip
    argv = ["bash", str(ROOT / "deploy" / "torchrun" / "train-node.sh"), "--seq-len", "32",
            "--batch-size", "4", "--num-workers", "0", "--save-every", "5",
            "--record", str(tmp / f"{name}-{{rank}}.jsonl"), *args]  # fmt: skip
    with open(tmp / f"{name}.log", "wb") as log:
        code = subprocess.run(argv, env=env, stdout=log, stderr=log, timeout=240).returncode
    assert code == 0, tail(tmp / f"{name}.log")


def test_a_job_resumes_from_its_checkpoint_on_another_world_size(tmp_path: Path) -> None:
    written = write_dataset(tmp_path / "ds", num_docs=60, seed=5, block_tokens=512)
    n = written.num_samples(32)
    run(tmp_path, "first", 2, "--steps", "12")
    assert (tmp_path / "ckpt" / "LATEST").read_text() == "step-000000012"
    run(tmp_path, "again", 1)
    assert "resumed at step 12" in (tmp_path / "again.log").read_text()
    ids = [
        i
        for f in sorted(tmp_path.glob("*.jsonl"))
        for line in f.read_text().splitlines()
        for i in json.loads(line)["ids"]
    ]
    assert len(ids) == len(set(ids)) == n  # once each, none lost
    # started again after its last epoch, the job trains nothing more
    run(tmp_path, "over", 1)
    assert not list(tmp_path.glob("over-*.jsonl")) or all(
        not f.read_text() for f in tmp_path.glob("over-*.jsonl")
    )
    saved = sorted(p.name for p in (tmp_path / "ckpt").iterdir())
    assert saved == ["LATEST", (tmp_path / "ckpt" / "LATEST").read_text()]  # (the old went)
