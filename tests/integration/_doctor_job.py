"""A training rank for the doctor's tests: TokenLoader with metrics, a simulated step.

With ``--torch`` the rank reads through torch's DataLoader instead (wrapped in
``stoker.Metered``), its samples passed through a transform that burns
``--transform-ms`` of CPU each (in worker ``--slow-worker`` only, if given).

With ``--mixture`` it reads a stoker.Mixture of token datasets instead.

Prints "ready" once it has taken its first step (its metrics endpoint is up), then trains
epoch after epoch until its standard input closes. With WORLD_SIZE > 1 it joins a gloo
group and all-reduces every step, as data-parallel training does (a slow rank then slows
the others' steps, not their data).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

from torch.utils.data import IterableDataset

import stoker


class Transformed(IterableDataset):  # type: ignore[type-arg]
    """``dataset``'s samples, each after ``cpu`` seconds of computation (a costly transform);
    with ``only`` set, in that DataLoader worker alone (its share of the data is costly)."""

    def __init__(self, dataset: stoker.TokenDataset, cpu: float, only: int | None) -> None:
        self.dataset, self.cpu, self.only = dataset, cpu, only

    def __iter__(self) -> Iterator[dict[str, Any]]:
        from torch.utils.data import get_worker_info

        info = get_worker_info()
        cpu = self.cpu if self.only is None or (info and info.id == self.only) else 0.0
        for sample in self.dataset:
            start = time.thread_time()
            while time.thread_time() - start < cpu:
                sample["tokens"].sum()
            yield sample


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dataset", help="a token dataset's URL (or --mixture)")
    ap.add_argument("--mixture", help='JSON {"name": [URL, weight], ...}: a mixture of them')
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--prefetch", type=int, default=4)
    ap.add_argument("--step", type=float, default=0.0, help="seconds of simulated compute")
    ap.add_argument("--metrics-port", type=int, required=True)
    ap.add_argument("--cache-dir")
    ap.add_argument("--cache-limit", type=int, default=64 << 30)
    ap.add_argument("--shm-limit", type=int, default=4 << 30)
    ap.add_argument("--window-shards", type=int, default=16)
    ap.add_argument("--arena-blocks", type=int, help="decoded blocks a reader holds")
    ap.add_argument("--torch", action="store_true", help="torch DataLoader + stoker.Metered")
    ap.add_argument("--transform-ms", type=float, default=0.0, help="CPU per sample (--torch)")
    ap.add_argument("--slow-worker", type=int, help="the transform costs in this worker only")
    a = ap.parse_args()

    world = int(os.environ.get("WORLD_SIZE", "1"))
    dist = None
    if world > 1:
        import torch.distributed as dist

        dist.init_process_group("gloo")
    ds: Any = None
    if a.dataset:
        ds = stoker.TokenDataset(
            a.dataset, a.seq_len, batch_size=a.batch, cache_dir=a.cache_dir,
            cache_limit=a.cache_limit, shm_limit=a.shm_limit, window_shards=a.window_shards,
            agent=None if a.cache_dir else False, arena_blocks=a.arena_blocks,
        )  # fmt: skip
    if a.mixture:
        parts = json.loads(a.mixture)
        ds = stoker.Mixture(
            {n: stoker.TokenDataset(url, a.seq_len, window_shards=a.window_shards, agent=False)
             for n, (url, _) in parts.items()},
            {n: w for n, (_, w) in parts.items()},
            batch_size=a.batch,
        )  # fmt: skip
    loader: Any
    if a.torch:
        from torch.utils.data import DataLoader

        loader = stoker.Metered(
            DataLoader(Transformed(ds, a.transform_ms / 1e3, a.slow_worker), batch_size=a.batch,
                       num_workers=a.workers, prefetch_factor=a.prefetch),
            metrics_port=a.metrics_port,
        )  # fmt: skip
    else:
        loader = stoker.TokenLoader(ds, a.workers, prefetch=a.prefetch, metrics_port=a.metrics_port)
    stop = threading.Event()
    # raw reads of fd 0: a thread blocked in sys.stdin.read() holds the stream's lock, and
    # the forked loader workers (which close sys.stdin) would wait for it forever
    threading.Thread(target=lambda: (os.read(0, 1), stop.set()), daemon=True).start()
    first = True
    while not stop.is_set():
        for _ in loader:
            if a.step:
                time.sleep(a.step)  # the training step's compute
            if dist is not None:
                import torch

                dist.all_reduce(torch.ones(1))
            if first:
                print("ready", flush=True)
                first = False
            if stop.is_set():
                break
    print(json.dumps(loader.stats()), flush=True)
    if dist is not None:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
