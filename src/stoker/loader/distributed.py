"""Where this process sits in the job: rank, world size, DataLoader worker.

Ranks come from ``torch.distributed`` when it is initialised, else from the
``RANK`` / ``WORLD_SIZE`` / ``LOCAL_RANK`` environment variables (read here,
at iteration time, and nowhere else), else a single process. stoker never
initialises ``torch.distributed`` itself.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from stoker.errors import ConfigError


@dataclass(frozen=True)
class Placement:
    rank: int = 0
    world: int = 1
    local_rank: int = 0
    worker: int = 0
    num_workers: int = 1


def detect(rank: int | None = None, world: int | None = None) -> Placement:
    if rank is None or world is None:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            d_rank, d_world = dist.get_rank(), dist.get_world_size()
        else:
            d_rank = int(os.environ.get("RANK", "0"))
            d_world = int(os.environ.get("WORLD_SIZE", "1"))
        rank = d_rank if rank is None else rank
        world = d_world if world is None else world
    if world < 1 or not 0 <= rank < world:
        raise ConfigError(f"rank {rank} is not in a world of size {world}")
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    from torch.utils.data import get_worker_info

    info = get_worker_info()
    worker, num_workers = (info.id, info.num_workers) if info is not None else (0, 1)
    return Placement(rank, world, local_rank, worker, num_workers)
