"""coordinator="rank0" says where its state lives, and cleans up only what it made itself."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from .helpers import Written, write_dataset

JOB = """
import sys, stoker
ds = stoker.TokenDataset(sys.argv[1], 32, batch_size=4)
kw = {"coordinator_state": sys.argv[2]} if len(sys.argv) > 2 else {}
loader = stoker.TokenLoader(ds, 0, coordinator="rank0", **kw)
print(sum(1 for _ in loader), flush=True)
"""


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Written:
    return write_dataset(tmp_path_factory.mktemp("r0s") / "ds", num_docs=60, seed=2,
                         block_tokens=512)  # fmt: skip


def run_job(*args: str) -> tuple[Path, subprocess.CompletedProcess[str]]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "STOKER_COORDINATOR")}  # fmt: skip
    proc = subprocess.run([sys.executable, "-c", JOB, *args], capture_output=True, text=True,
                          timeout=300, env=env)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert int(proc.stdout.split()[-1]) > 0  # it trained through an epoch
    lines = [line for line in proc.stderr.splitlines() if "its state" in line]
    assert len(lines) == 1, proc.stderr  # one line, naming the state
    m = re.search(r"is in (\S+): ", lines[0])
    assert m, lines[0]
    return Path(m.group(1)), proc


def test_a_temporary_state_is_named_then_removed(dataset: Written) -> None:
    state, _ = run_job(str(dataset.path))
    assert state.name.startswith("stoker-coordinator-")
    assert not state.exists()  # the job ended cleanly: the directory it made is gone


def test_a_given_state_is_kept(dataset: Written, tmp_path: Path) -> None:
    state, proc = run_job(str(dataset.path), str(tmp_path / "state"))
    assert state == tmp_path / "state"
    assert any(state.rglob("*")), "the journal is under the given state"
    assert "kept" in proc.stderr
