"""Loader workers end with their rank: a rank killed with SIGKILL leaves no worker behind."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from .helpers import Written, reap, write_dataset

JOB = Path(__file__).with_name("_doctor_job.py")


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Written:
    return write_dataset(tmp_path_factory.mktemp("orphans") / "ds", num_docs=200, seed=4)


def test_workers_of_a_killed_rank_exit(dataset: Written) -> None:
    rank = subprocess.Popen(
        [sys.executable, str(JOB), "--metrics-port", "0", "--dataset", str(dataset.path),
         "--workers", "2", "--step", "0.05", "--seq-len", "32"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert rank.stdout is not None and rank.stdout.readline().strip() == "ready"
        workers = [int(x) for x in Path(f"/proc/{rank.pid}/task/{rank.pid}/children").read_text().split()]  # fmt: skip
        assert len(workers) == 2
        pidfds = [os.pidfd_open(w) for w in workers]
        rank.send_signal(signal.SIGKILL)
        rank.wait()
        # each worker exits by itself (it would otherwise wait on its pipe forever)
        gone = [fd for fd in pidfds if select.select([fd], [], [], 30)[0]]
        assert len(gone) == 2
        for fd in pidfds:
            os.close(fd)
    finally:
        reap(rank)  # and its pipes
