"""stoker's training job (``python -m stoker.train``) on a Ray cluster with Ray Train:
one Ray Train worker a GPU (or a CPU rank), placed by Ray; Ray Train makes the
torch.distributed process group, rank 0 starts the job's coordinator and the other
ranks find it (address and a fresh token) in that group's store; each node's workers
read through its node agent on --cache-dir.

    pip install 'stoker[ray]' 'ray[train]'
    python deploy/ray/train.py --workers 16 --gpu -- \\
        --dataset s3://bucket/tokens --cache-dir /mnt/nvme/stoker --checkpoint /shared/run1

Arguments after ``--`` go to the job (``python -m stoker.train --help``); --checkpoint
must be a directory every node reaches, and a run started again with it resumes from
its last save on however many workers it has. Ports: Ray's own, torch.distributed's
(Ray Train picks one) and the coordinator's on rank 0's node (any free port, or
STOKER_COORDINATOR_BIND=HOST:PORT). The cluster: ``--ray-address`` or $RAY_ADDRESS,
else a local Ray instance.
"""

from __future__ import annotations

import argparse
import os
import sys


def main(argv: list[str] | None = None) -> int:
    import ray
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    from stoker.train import parse, ray_loop

    argv = sys.argv[1:] if argv is None else argv
    ours, job = (
        (argv[: argv.index("--")], argv[argv.index("--") + 1 :]) if "--" in argv else (argv, [])
    )
    ap = argparse.ArgumentParser(prog="deploy/ray/train.py", description=__doc__.split("\n")[0])
    ap.add_argument("--workers", type=int, required=True, help="Ray Train workers (ranks)")
    ap.add_argument("--gpu", action="store_true", help="one GPU a worker")
    ap.add_argument("--ray-address", help="the Ray cluster (default: $RAY_ADDRESS, or a local one)")
    ap.add_argument("--storage", help="Ray Train's run storage (default: Ray's own)")
    a = ap.parse_args(ours)
    given = parse(job)  # (the job's arguments checked here, before a worker starts)
    if "--dataset" not in job:  # (from $STOKER_DATASET here: the workers have not got it)
        job = ["--dataset", given.dataset, *job]
    if not ray.is_initialized():
        # stoker's variables set here (STOKER_COORDINATOR_BIND, tokens) go to the workers
        ours_env = {k: v for k, v in os.environ.items() if k.startswith("STOKER_")}
        ray.init(address=a.ray_address, runtime_env={"env_vars": ours_env})
    trainer = TorchTrainer(
        ray_loop,
        train_loop_config={"argv": job},
        scaling_config=ScalingConfig(num_workers=a.workers, use_gpu=a.gpu),
        run_config=RunConfig(name="stoker-train", storage_path=a.storage),
    )
    trainer.fit()
    return 0


if __name__ == "__main__":
    sys.exit(main())
