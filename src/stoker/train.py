"""The launch recipes' training job (deploy/): a small causal LM trained on a token
dataset that stoker feeds, one process a GPU (or a CPU rank) under ``torchrun`` on any
number of nodes.

    torchrun --nnodes N --nproc-per-node G --rdzv-backend c10d --rdzv-endpoint HOST:29400 \\
        -m stoker.train --dataset s3://bucket/tokens --cache-dir /mnt/nvme/stoker \\
        --checkpoint /shared/run1

Positions come from the job's coordinator (``coordinator="rank0"``: rank 0 starts it
and the other ranks find it through torchrun's store; ``STOKER_COORDINATOR`` names a
running one instead), so every sample is trained exactly once an epoch whatever the
ranks' speeds. With ``--cache-dir``, each node's processes read through its node agent.
With ``--checkpoint DIR``, rank 0 saves the model, the optimizer and the loader's state
every ``--save-every`` steps and at the end (``DIR/step-N``, named by ``DIR/LATEST``
once whole), and a job started again with the same DIR
(on any number of nodes) goes on from there: the samples trained before the save are
not trained again, and none after it is lost. ``--record FILE`` appends each step's
sample ids, one JSON line a step (``{rank}`` in FILE: one file a rank).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    from stoker import env

    ap = argparse.ArgumentParser(prog="python -m stoker.train", description=__doc__.split("\n")[0])
    ap.add_argument("--dataset", default=env.get("STOKER_DATASET"),
                    help="a token dataset's URL (default: $STOKER_DATASET)")  # fmt: skip
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--batch-size", type=int, default=8, help="per rank")
    ap.add_argument("--num-workers", type=int, default=2, help="loader processes a rank")
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--steps", type=int, default=0, help="stop after this many (0: the epochs)")
    ap.add_argument("--cache-dir", help="read through this node's agent on DIR")
    ap.add_argument("--lease-size", type=int, default=0, help="samples a lease (0: default)")
    ap.add_argument("--checkpoint", help="save to and resume from DIR (rank 0 writes)")
    ap.add_argument("--save-every", type=int, default=100, help="steps between checkpoints")
    ap.add_argument("--record", help="append each step's sample ids to FILE ({rank}: a rank's)")
    ap.add_argument("--lr", type=float, default=3e-3)
    a = ap.parse_args(argv)
    if not a.dataset:
        ap.error("give --dataset URL (or set STOKER_DATASET)")
    return a


def main(argv: list[str] | None = None, device: Any = None) -> int:
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel

    import stoker
    from stoker import env
    from stoker.demo import _TinyLM

    a = parse(argv)
    cuda = torch.cuda.is_available()
    if device is None:
        local = int(env.get("LOCAL_RANK", "0") or 0)
        device = torch.device("cuda", local) if cuda else torch.device("cpu")
    device = torch.device(device)
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.set_device(device)
    owned = not dist.is_initialized()  # (a launcher such as Ray Train may have made it)
    if owned:
        dist.init_process_group("nccl" if cuda else "gloo", timeout=timedelta(seconds=300))
    rank = dist.get_rank()
    ds = stoker.TokenDataset(
        a.dataset, a.seq_len, batch_size=a.batch_size, seed=1234, cache_dir=a.cache_dir
    )
    config = stoker.LeaseConfig(lease_size=a.lease_size) if a.lease_size else None
    loader = stoker.TokenLoader(
        ds,
        a.num_workers,
        coordinator="rank0",
        coordinator_config=config,
        device=device if cuda else None,  # (batches land on the GPU ahead of the step)
    )
    torch.manual_seed(0)
    model = _TinyLM(ds.manifest.vocab_size, a.seq_len).to(device)
    ddp = DistributedDataParallel(model)
    opt = torch.optim.AdamW(ddp.parameters(), lr=a.lr)
    step = 0
    ckpt = Path(a.checkpoint) if a.checkpoint else None
    latest = _latest(ckpt) if ckpt is not None else None
    if latest is not None:
        saved = json.loads((latest / "state.json").read_text())
        weights = torch.load(latest / "model.pt", map_location=device, weights_only=True)
        model.load_state_dict(weights["model"])
        opt.load_state_dict(weights["optimizer"])
        loader.load_state_dict(saved["loader"])
        step = int(saved["step"])
        if rank == 0:
            print(f"stoker.train: resumed at step {step} from {latest}", flush=True)
    record = open(a.record.format(rank=rank), "a") if a.record else None  # noqa: SIM115
    wait = busy = 0.0
    done = False
    try:
        # a pass goes on with the epoch the checkpoint was in (or the next, when it was
        # finished); the job ends after the pass of epoch --epochs - 1
        while not done:
            it = iter(loader)
            trained, epoch = 0, None
            while True:
                t0 = time.perf_counter()
                batch = next(it, None)
                if batch is None:
                    break
                epoch = loader.last_epoch.epoch if loader.last_epoch else None
                if epoch is not None and epoch >= a.epochs:  # (every rank: the same epoch)
                    done = True
                    break
                trained += 1
                t1 = time.perf_counter()
                tokens = batch["tokens"].to(device, non_blocking=True)
                logits = ddp(tokens[:, :-1])
                loss = F.cross_entropy(
                    logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1)
                )
                opt.zero_grad(set_to_none=True)
                loss.backward()  # type: ignore[no-untyped-call]
                opt.step()
                step += 1
                wait, busy = wait + t1 - t0, busy + time.perf_counter() - t1
                if record is not None:
                    record.write(json.dumps({"step": step, "ids": batch["sample_id"].tolist()}))
                    record.write("\n")
                    record.flush()
                if ckpt is not None and step % a.save_every == 0:
                    _save(ckpt, rank, step, model, opt, loader)
                if rank == 0 and step % 50 == 0:
                    share = wait / max(wait + busy, 1e-9)
                    print(f"stoker.train: step {step} loss {float(loss):.3f} "
                          f"data wait {share:.1%}", flush=True)  # fmt: skip
                if a.steps and step >= a.steps:
                    done = True
                    break
            close = getattr(it, "close", None)
            if close is not None:
                close()  # (a pass broken off: its workers stop now)
            if not trained or epoch is None or epoch + 1 >= a.epochs:
                done = True
        if ckpt is not None:
            _save(ckpt, rank, step, model, opt, loader)
    finally:
        if record is not None:
            record.close()
    dist.barrier()
    loader.close()
    if owned:
        dist.destroy_process_group()
    if rank == 0:
        print(f"stoker.train: done at step {step}", flush=True)
    return 0


def ray_loop(config: dict[str, Any]) -> None:
    """The job as Ray Train's ``train_loop_per_worker`` (deploy/ray/train.py):
    ``config["argv"]`` are its arguments; the process group and the device are Ray
    Train's."""
    import ray.train.torch

    main(list(config["argv"]), device=ray.train.torch.get_device())


def _save(ckpt: Path, rank: int, step: int, model: Any, opt: Any, loader: Any) -> None:
    """Rank 0's checkpoint at ``step``: the weights, the optimizer and the loader's state
    in a directory of their own, made whole before ``LATEST`` names it (a job killed
    while saving resumes from the one before)."""
    import shutil

    import torch

    if rank != 0:
        return
    state = loader.state_dict()
    ckpt.mkdir(parents=True, exist_ok=True)
    here = ckpt / f"step-{step:09d}"
    tmp = ckpt / f".{here.name}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    torch.save({"model": model.state_dict(), "optimizer": opt.state_dict()}, tmp / "model.pt")
    (tmp / "state.json").write_text(json.dumps({"step": step, "loader": state}))
    before = _latest(ckpt)
    if before == here:
        shutil.rmtree(tmp, ignore_errors=True)
        return  # (saved at this step already)
    shutil.rmtree(here, ignore_errors=True)  # (one a kill left before LATEST named it)
    _sync(tmp)
    os.replace(tmp, here)
    with open(ckpt / "LATEST.tmp", "w") as f:
        f.write(here.name)
        f.flush()
        os.fsync(f.fileno())
    os.replace(ckpt / "LATEST.tmp", ckpt / "LATEST")
    if before is not None:
        shutil.rmtree(before, ignore_errors=True)


def _sync(folder: Path) -> None:
    """Its files on disk before a name points at them (a node that crashes later)."""
    for p in folder.iterdir():
        with open(p, "rb") as f:
            os.fsync(f.fileno())


def _latest(ckpt: Path) -> Path | None:
    """The checkpoint ``LATEST`` in ``ckpt`` names, if any."""
    try:
        name = (ckpt / "LATEST").read_text().strip()
    except FileNotFoundError:
        return None
    return ckpt / name


if __name__ == "__main__":
    sys.exit(main())
