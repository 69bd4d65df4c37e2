"""A data-parallel job (torch.distributed over gloo, real processes) whose rank 0 starts the
coordinator: killed with SIGKILL mid-epoch and resumed on another number of ranks."""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from .helpers import Written, reap, write_dataset

SEQ_LEN = 32
B = 4
HERE = Path(__file__).parent


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Written:
    root = tmp_path_factory.mktemp("rank0")
    return write_dataset(root / "ds", num_docs=150, seed=5, block_tokens=512, blocks_per_file=4)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def launch(world: int, out: Path, args: list[str]) -> list[subprocess.Popen[str]]:
    port = free_port()
    procs = []
    for rank in range(world):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(world), LOCAL_WORLD_SIZE=str(world),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))  # fmt: skip
        env.pop("STOKER_COORDINATOR", None)
        procs.append(
            subprocess.Popen(
                [
                    sys.executable,
                    str(HERE / "_train_rank.py"),
                    "--out",
                    str(out / f"r{rank}.jsonl"),
                    *args,
                ],
                env=env,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
        )
    return procs


def children(pid: int) -> list[int]:
    text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    return [int(x) for x in text.split()]


def steps(out: Path, world: int) -> dict[int, list[dict]]:
    return {
        r: [json.loads(line) for line in (out / f"r{r}.jsonl").read_text().splitlines()]
        for r in range(world)
    }


def test_rank0_coordinator_survives_a_crash_and_resumes_on_three_ranks(
    dataset: Written, tmp_path: Path
) -> None:
    common = ["--dataset", str(dataset.path), "--seq-len", str(SEQ_LEN), "--batch", str(B),
              "--lease-size", "24"]  # fmt: skip
    state = tmp_path / "state.json"
    run1, run2 = tmp_path / "run1", tmp_path / "run2"
    run1.mkdir(), run2.mkdir()
    SAVE, STOP = 3, 5
    procs = launch(2, run1, [*common, "--save-at", str(SAVE), "--state", str(state),
                             "--stop-at", str(STOP)])  # fmt: skip
    for p in procs:
        assert p.stdout is not None
        assert p.stdout.readline().startswith("stopped"), "rank did not reach the crash point"
    started = [c for c in children(procs[0].pid)
               if b"coordinator" in Path(f"/proc/{c}/cmdline").read_bytes()]  # fmt: skip
    assert len(started) == 1  # rank 0 started the coordinator as its child
    coordinator = os.pidfd_open(started[0])
    for p in procs:
        p.send_signal(signal.SIGKILL)
        reap(p)
    # its pipe from rank 0 closed, so the coordinator exits by itself
    ready, _, _ = select.select([coordinator], [], [], 30)
    assert ready, "the coordinator outlived rank 0"
    os.close(coordinator)

    saved = json.loads(state.read_text())
    assert saved["batches"] == SAVE
    procs = launch(3, run2, [*common, "--resume", str(state), "--epochs", "2"])
    for p in procs:
        out, _ = p.communicate(timeout=300)
        assert p.returncode == 0, out

    first = steps(run1, 2)
    second = steps(run2, 3)
    n = dataset.num_samples(SEQ_LEN)
    trained = [i for r in first for s in first[r] if s["step"] <= SAVE for i in s["ids"]]
    epoch0 = trained + [i for r in second for s in second[r] if s["epoch"] == 0 for i in s["ids"]]
    epoch1 = [i for r in second for s in second[r] if s["epoch"] == 1 for i in s["ids"]]
    got = Counter(epoch0)
    assert got.most_common(1)[0][1] == 1  # nothing twice in the epoch
    assert set(got) <= set(range(n))
    missing = set(range(n)) - set(got)
    assert len(missing) < 3 and missing <= set(epoch1)  # what did not divide by 3 came next
    # every rank took the same number of steps in each epoch
    for e in (0, 1):
        assert len({sum(s["epoch"] == e for s in second[r]) for r in range(3)}) == 1
    assert len(epoch1) >= n - 2
