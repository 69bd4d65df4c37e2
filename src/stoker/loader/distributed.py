"""Where this process sits in the job: rank, world size, DataLoader worker.

Ranks come from explicit ``rank=`` / ``world_size=`` arguments first, then from
``torch.distributed`` when it is initialised, else from the ``RANK`` /
``WORLD_SIZE`` / ``LOCAL_RANK`` environment variables (read here, at iteration
time, and nowhere else), else a single process. stoker never initialises
``torch.distributed`` itself.

The environment is checked, not trusted: ``RANK`` without ``WORLD_SIZE`` (or the
reverse), a value that is not an integer, a negative value or ``RANK >=
WORLD_SIZE`` is a ``ConfigError`` naming the variable. A half-set environment
would otherwise make every process rank 0 of a world of one, each reading the
whole dataset (or rank 0 of the right world, reading half of it).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from stoker import env
from stoker.errors import ConfigError


@dataclass(frozen=True)
class Placement:
    rank: int = 0
    world: int = 1
    local_rank: int = 0
    worker: int = 0
    num_workers: int = 1


def _env_int(env: Mapping[str, str], name: str, minimum: int) -> int | None:
    """The integer in ``env[name]``, or None when unset; ConfigError when malformed."""
    raw = env.get(name)
    if raw is None:
        return None
    try:
        value = int(raw.strip())
    except ValueError:
        raise ConfigError(
            f"environment variable {name}={raw!r} is not an integer; set it to an "
            f"integer >= {minimum} (as torchrun does) or unset it"
        ) from None
    if value < minimum:
        raise ConfigError(
            f"environment variable {name}={value} is out of range: it must be >= {minimum}"
        )
    return value


def env_ranks(
    env: Mapping[str, str], need_rank: bool = True, need_world: bool = True
) -> tuple[int, int]:
    """(rank, world) from ``RANK`` / ``WORLD_SIZE`` in ``env``; (0, 1) when neither is set.

    A variable whose value is needed (``need_rank`` / ``need_world``) must be set
    whenever the other one is: one of the pair alone is a ``ConfigError``.
    """
    # only the values needed are read: an explicit argument stands in for its variable
    rank = _env_int(env, "RANK", 0) if need_rank else None
    world = _env_int(env, "WORLD_SIZE", 1) if need_world else None
    if need_rank and rank is None and "WORLD_SIZE" in env:
        raise ConfigError(
            f"WORLD_SIZE={env['WORLD_SIZE']} is set but RANK is not: set RANK to this process's "
            "rank in [0, WORLD_SIZE), pass rank= explicitly, or unset WORLD_SIZE"
        )
    if need_world and world is None and "RANK" in env:
        raise ConfigError(
            f"RANK={env['RANK']} is set but WORLD_SIZE is not: set WORLD_SIZE to the number "
            "of ranks, pass world_size= explicitly, or unset RANK"
        )
    if rank is not None and world is not None and rank >= world:
        raise ConfigError(
            f"RANK={rank} is out of range for WORLD_SIZE={world}: RANK must be in [0, WORLD_SIZE)"
        )
    return (0 if rank is None else rank), (1 if world is None else world)


def detect(rank: int | None = None, world: int | None = None) -> Placement:
    source = "rank=/world_size="
    if rank is None or world is None:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            d_rank, d_world = dist.get_rank(), dist.get_world_size()
            source = "torch.distributed"
        else:
            d_rank, d_world = env_ranks(env.ranks(), rank is None, world is None)
            source = "RANK/WORLD_SIZE"
        rank = d_rank if rank is None else rank
        world = d_world if world is None else world
    if world < 1 or not 0 <= rank < world:
        raise ConfigError(
            f"rank {rank} is not in a world of size {world} (from {source}): "
            "the rank must be in [0, world_size)"
        )
    local_rank = _env_int(env.ranks(), "LOCAL_RANK", 0)
    from torch.utils.data import get_worker_info

    info = get_worker_info()
    worker, num_workers = (info.id, info.num_workers) if info is not None else (0, 1)
    return Placement(rank, world, 0 if local_rank is None else local_rank, worker, num_workers)
