"""The Ray Train recipe as written (deploy/ray/train.py running ``python -m
stoker.train``'s job as Ray Train workers) on a local Ray instance: two workers, whose
process group Ray Train makes, train an epoch fed by the coordinator rank 0 starts and
the other finds through that group's store; every sample once (but for what does not
divide among the ranks, which opens the next epoch), as many steps each, and the
checkpoint saved.

As root it runs in a network namespace that has only loopback, so that nothing Ray
starts can send beyond this machine."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from .helpers import write_dataset
from .test_netns import clean_env, tail

pytest.importorskip("ray.train")

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
B = 4


def test_the_ray_train_recipe_trains_an_epoch_once(
    tmp_path: Path, loopback_only: list[str]
) -> None:
    written = write_dataset(tmp_path / "ds", num_docs=60, seed=5, block_tokens=512)
    n = written.num_samples(32)
    temp = tempfile.mkdtemp(prefix="ray-", dir="/tmp")  # (Ray's sockets: a short path)
    env = clean_env(RAY_USAGE_STATS_ENABLED="0", HOME=str(tmp_path), RAY_TMPDIR=temp,
                    PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}")  # fmt: skip
    argv = [*loopback_only, sys.executable, str(ROOT / "deploy" / "ray" / "train.py"),
            "--workers", "2", "--storage", str(tmp_path / "ray-runs"), "--",
            "--dataset", str(written.path), "--seq-len", "32", "--batch-size", str(B),
            "--num-workers", "0", "--checkpoint", str(tmp_path / "ckpt"),
            "--record", str(tmp_path / "rank-{rank}.jsonl")]  # fmt: skip
    try:
        with open(tmp_path / "ray.log", "wb") as log:
            code = subprocess.run(argv, env=env, stdout=log, stderr=log, timeout=280).returncode
    finally:
        shutil.rmtree(temp, ignore_errors=True)
    assert code == 0, tail(tmp_path / "ray.log", 60)
    steps = {
        r: [json.loads(x) for x in (tmp_path / f"rank-{r}.jsonl").read_text().splitlines()]
        for r in range(2)
    }
    ids = [i for rows in steps.values() for s in rows for i in s["ids"]]
    assert len(ids) == len(set(ids)) and set(ids) <= set(range(n))
    assert len(ids) == n - n % 2  # (an equal share each: the odd one opens epoch 1)
    assert len(steps[0]) == len(steps[1])
    latest = (tmp_path / "ckpt" / "LATEST").read_text()
    assert json.loads((tmp_path / "ckpt" / latest / "state.json").read_text())["step"] == len(
        steps[0]
    )
