"""A real 2-rank run: separate processes, torch.distributed (gloo over loopback) or env variables.

Each rank runs tests/integration/_dist_worker.py, which builds a TokenDataset
without rank/world_size arguments, so the dataset must find its place from
torch.distributed or from RANK / WORLD_SIZE, inside a DataLoader worker.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from servers import free_port

from .helpers import Written, assert_exactly_once

WORKER = Path(__file__).with_name("_dist_worker.py")
WORLD = 2
EPOCHS = 2


def odd_seq_len(written: Written) -> int:
    """A seq_len giving an odd number of samples, so 2 ranks leave one over."""
    for seq_len in range(16, 65):
        if written.num_samples(seq_len) % 2 == 1:
            return seq_len
    raise AssertionError("no seq_len in [16, 64] gives an odd sample count")


def base_env() -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
    }
    env["GLOO_SOCKET_IFNAME"] = "lo"  # keep gloo's pairs on loopback
    env["OMP_NUM_THREADS"] = "1"
    return env


def run_ranks(tmp_path: Path, url: str, seq_len: int, use_process_group: bool) -> list[dict]:
    procs, outs = [], []
    init = f"tcp://127.0.0.1:{free_port()}"
    for rank in range(WORLD):
        out = tmp_path / f"rank{rank}.json"
        env = base_env()
        args = [sys.executable, str(WORKER), str(out), url, str(seq_len), str(EPOCHS)]
        if use_process_group:
            args += [init, str(rank), str(WORLD)]
        else:
            env.update(RANK=str(rank), WORLD_SIZE=str(WORLD), LOCAL_RANK=str(rank))
        log = open(tmp_path / f"rank{rank}.log", "wb")  # noqa: SIM115
        procs.append(subprocess.Popen(args, env=env, stdout=log, stderr=subprocess.STDOUT))
        log.close()
        outs.append(out)
    try:
        codes = [p.wait(timeout=240) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    logs = "\n".join(
        f"--- rank {r} ---\n{(tmp_path / f'rank{r}.log').read_text(errors='replace')[-3000:]}"
        for r in range(WORLD)
    )
    assert codes == [0] * WORLD, logs
    return [json.loads(out.read_text()) for out in outs]


def check_run(results: list[dict], num_samples: int) -> None:
    assert [r["num_samples"] for r in results] == [num_samples] * WORLD
    assert all(r["tokens_ok"] for r in results)
    assert len({r["pid"] for r in results}) == WORLD
    S = num_samples
    assert S % WORLD == 1

    # epoch 0: every rank gets S // 2 samples, disjoint, one left over
    e0 = [r["epochs"][0]["ids"] for r in results]
    per_rank = S // WORLD
    assert [len(ids) for ids in e0] == [per_rank] * WORLD
    assert [r["epochs"][0]["len"] for r in results] == [-(-per_rank // 4)] * WORLD
    union = [i for ids in e0 for i in ids]
    assert len(set(union)) == len(union) == per_rank * WORLD
    missing = set(range(S)) - set(union)
    assert len(missing) == S - per_rank * WORLD == 1

    # epoch 1 delivers the carried sample first (rank 0's first), then a full data
    # epoch: S + 1 samples split evenly, nothing left over
    e1 = [r["epochs"][1]["ids"] for r in results]
    assert [len(ids) for ids in e1] == [(S + 1) // WORLD] * WORLD
    assert e1[0][0] in missing
    counts = Counter(i for ids in e1 for i in ids)
    assert counts == Counter(range(S)) + Counter(missing)
    assert e1 != e0


@pytest.mark.slow
def test_two_ranks_through_torch_distributed(small_dataset: Written, tmp_path: Path) -> None:
    seq_len = odd_seq_len(small_dataset)
    S = small_dataset.num_samples(seq_len)
    results = run_ranks(tmp_path, str(small_dataset.path), seq_len, use_process_group=True)
    assert [r["env_rank"] for r in results] == [None] * WORLD  # only torch.distributed says
    check_run(results, S)
    # every rank gathered the same picture, and it is what each rank reported
    for epoch in range(EPOCHS):
        gathered = [r["epochs"][epoch]["gathered"] for r in results]
        own = [r["epochs"][epoch]["ids"] for r in results]
        assert gathered[0] == gathered[1] == own


@pytest.mark.slow
def test_two_ranks_from_environment_variables(small_dataset: Written, tmp_path: Path) -> None:
    seq_len = odd_seq_len(small_dataset)
    S = small_dataset.num_samples(seq_len)
    results = run_ranks(tmp_path, str(small_dataset.path), seq_len, use_process_group=False)
    assert [r["env_rank"] for r in results] == ["0", "1"]
    check_run(results, S)


def test_single_process_sees_the_whole_epoch(small_dataset: Written, monkeypatch) -> None:
    """Without a process group or RANK/WORLD_SIZE, one process is the whole job."""
    from stoker import TokenDataset

    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    seq_len = odd_seq_len(small_dataset)
    url = str(small_dataset.path)
    ds = TokenDataset(url, seq_len, shard_size=4, window_shards=2, seed=5)
    whole = [item["sample_id"] for item in ds]
    assert_exactly_once(whole, ds.num_samples)

    # the placement is read when iterating, not when the dataset is built
    halves = []
    for rank in range(WORLD):
        ds = TokenDataset(url, seq_len, shard_size=4, window_shards=2, seed=5)
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", str(WORLD))
        halves.append([item["sample_id"] for item in ds])
    n = ds.num_samples // WORLD
    assert halves == [whole[:n], whole[n : 2 * n]]
