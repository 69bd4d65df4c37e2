"""Every environment variable stoker reads: read here, when asked for, never at import.

The README's table lists the same variables (a test checks that both agree). Code
elsewhere calls :func:`get` with a name of :data:`VARIABLES`; an unknown name is a
programming error, so a new variable cannot be read without being documented here.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

#: Name -> what it does.
VARIABLES: Mapping[str, str] = {
    # where this process sits in the job (torch.distributed, when initialised, wins)
    "RANK": "this process's rank (with WORLD_SIZE; torchrun sets both)",
    "WORLD_SIZE": "the number of ranks (with RANK)",
    "LOCAL_RANK": "the rank on this machine (metrics port offset)",
    "LOCAL_WORLD_SIZE": "ranks on this machine: whether rank 0's coordinator must bind beyond loopback",
    "MASTER_ADDR": "rank 0's host: the address rank 0's coordinator binds on a multi-node job",
    "TORCHELASTIC_RESTART_COUNT": "torchelastic's restart attempt: each attempt's coordinator has its own store key",
    # the coordinator
    "STOKER_COORDINATOR": 'host:port of a running coordinator for coordinator="rank0" to use instead of starting one',
    "STOKER_COORDINATOR_BIND": "host:port rank 0's coordinator binds",
    "STOKER_COORDINATOR_TOKEN": "the coordinator's shared token (clients and `stoker coordinator`)",
    "STOKER_COORDINATOR_TOKEN_FILE": "a file holding the coordinator's token (clients)",
    "STOKER_PREPROCESS_TOKEN": "the preprocessing workers' shared token (trainers and `stoker preprocess-worker`)",
    "STOKER_DATASET": "the token dataset `python -m stoker.train` trains on (its `--dataset`)",
    # where files go
    "STOKER_CACHE_DIR": "the node agent's cache directory when none is given (default ~/.cache/stoker)",
    "XDG_CACHE_HOME": "the base of the default cache directory",
    "STOKER_RUNTIME_DIR": "the per-user directory of endpoint records and token files",
    "XDG_RUNTIME_DIR": "the base of the default runtime directory",
    # devices
    "STOKER_STRICT_DEVICE": "1: a CUDA device asked for without CUDA is an error, not a warning",
}


def get(name: str, default: str | None = None) -> str | None:
    """The value of variable ``name`` (one of :data:`VARIABLES`), or ``default``."""
    if name not in VARIABLES:
        raise KeyError(f"{name} is not one of stoker's environment variables (stoker.env)")
    return os.environ.get(name, default)


def ranks() -> Mapping[str, str]:
    """The placement variables (RANK, WORLD_SIZE, LOCAL_RANK) that are set."""
    return {k: os.environ[k] for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK") if k in os.environ}
