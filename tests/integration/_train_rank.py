"""One rank of a data-parallel job (torch.distributed, gloo) fed by coordinator="rank0".

With --mixture, the rank reads a stoker.Mixture of token datasets instead (cut in
shards of 5 samples, windows of 3, as tests/integration/test_mixture.py's are).
Run under the usual launcher environment (RANK, WORLD_SIZE, MASTER_ADDR,
MASTER_PORT). Each step all-reduces a tensor, as training does, then records
the batch's sample ids (one JSON line per step in --out). Rank 0 saves the
loader's state after step --save-at. After step --stop-at the rank prints
"stopped" and blocks until it is killed (the test kills it: a crash). After step
--pause-at the rank prints "paused K" and waits for a line on stdin before it goes
on (the test does something to the job meanwhile, e.g. restarts the coordinator).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

import stoker


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dataset", help="a token dataset's URL (or --mixture)")
    ap.add_argument("--mixture", help='JSON {"name": [URL, weight], ...}: a mixture of them')
    ap.add_argument("--seq-len", type=int, required=True)
    ap.add_argument("--batch", type=int, required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--workers", type=int, default=0)
    ap.add_argument("--lease-size", type=int, default=64)
    ap.add_argument("--cache-dir")
    ap.add_argument("--save-at", type=int, default=0)
    ap.add_argument("--state", help="where rank 0 saves the state (with --save-at)")
    ap.add_argument("--resume", help="a saved state to resume from")
    ap.add_argument("--stop-at", type=int, default=0)
    ap.add_argument("--pause-at", type=int, default=0)
    a = ap.parse_args()

    dist.init_process_group("gloo", timeout=timedelta(seconds=120))
    rank = dist.get_rank()
    ds: stoker.TokenDataset | stoker.Mixture
    if a.mixture:
        parts = json.loads(a.mixture)
        ds = stoker.Mixture(
            {n: stoker.TokenDataset(url, a.seq_len, seed=i, shard_size=5, window_shards=3)
             for i, (n, (url, _)) in enumerate(parts.items())},
            {n: w for n, (_, w) in parts.items()},
            batch_size=a.batch,
        )  # fmt: skip
    else:
        ds = stoker.TokenDataset(
            a.dataset, a.seq_len, batch_size=a.batch, cache_dir=a.cache_dir or None
        )
    loader = stoker.TokenLoader(
        ds,
        a.workers,
        coordinator="rank0",
        coordinator_config=stoker.LeaseConfig(lease_size=a.lease_size, timeout=10.0),
    )
    if a.resume:
        loader.load_state_dict(json.loads(Path(a.resume).read_text()))
    step = 0
    with open(a.out, "a") as out:
        for _ in range(a.epochs):
            epoch = None
            for batch in loader:
                epoch = loader.last_epoch.epoch if loader.last_epoch else None
                x = torch.ones(1)
                dist.all_reduce(x)  # every rank took this step
                step += 1
                ids = batch["sample_id"].tolist()
                out.write(json.dumps({"step": step, "epoch": epoch, "ids": ids}) + "\n")
                out.flush()
                if step == a.save_at and rank == 0:
                    tmp = a.state + ".tmp"
                    Path(tmp).write_text(json.dumps(loader.state_dict()))
                    os.replace(tmp, a.state)
                if step == a.pause_at:
                    print(f"paused {step}", flush=True)
                    sys.stdin.readline()  # the test's cue to go on
                if step == a.stop_at:
                    print(f"stopped {step}", flush=True)
                    sys.stdin.read()  # the test kills us here
    dist.barrier()
    loader.close()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
