"""Preprocessing workers as Ray actors (:mod:`stoker.preprocess.ray`) on a local Ray
instance: they offer themselves to the coordinator, a trainer's rows through them are
its own bit for bit, an actor killed mid-epoch is started again by Ray and offers
itself anew (its rows asked of the other meanwhile), and stopped workers leave the
coordinator's pool.

The run is ray_pool_run.py in its own process; as root it runs in a network namespace
that has only loopback, so that nothing Ray starts can send beyond this machine."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from .helpers import photo_records

pytest.importorskip("ray")

RUN = Path(__file__).with_name("ray_pool_run.py")


@pytest.mark.slow
def test_workers_as_ray_actors_serve_the_pool_through_a_kill(
    tmp_path: Path, loopback_only: list[str]
) -> None:
    images = photo_records(tmp_path / "ds", 96, 4, (40, 120), (5, 7), 20_000)
    # (Ray's sockets live under its temp directory: a short path keeps them in bounds)
    temp = tempfile.mkdtemp(prefix="ray-", dir="/tmp")
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "HOME": str(tmp_path)}
    try:
        done = subprocess.run(
            [*loopback_only, sys.executable, str(RUN), str(images), temp, str(tmp_path / "state")],
            capture_output=True,
            text=True,
            env=env,
            timeout=240,
        )
    finally:
        shutil.rmtree(temp, ignore_errors=True)
    assert done.returncode == 0, done.stderr[-4000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    first, second = seen["addresses"]
    again = seen["restarted"]
    assert all(a.startswith("127.0.0.1:") for a in (first, second, again))
    assert seen["nodes"] == ["127.0.0.1", "127.0.0.1"]
    assert (
        "image" in seen["compared"] and seen["differ"] == []
    )  # every row the trainer's own, bit for bit
    made = seen["made_by"]
    assert sum(made.values()) == 96
    assert made.get(second, 0) > 0 and made.get(again, 0) > 0  # the restarted one too
    assert second not in seen["listed_after_scale"] and again in seen["listed_after_scale"]
    assert seen["left"] == [again]
    assert again not in seen["listed_after_shutdown"]
