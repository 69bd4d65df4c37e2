"""The node agent's settings: one dataclass, the single source of ``stoker agent``'s
defaults, and what a reader that starts the agent hands it (as one JSON message,
:mod:`stoker.settings`)."""

from __future__ import annotations

from dataclasses import dataclass

#: Where an agent serves its metrics unless told otherwise (a second agent on the machine
#: finds it taken and serves on a free port, recorded in the runtime directory).
METRICS_PORT = 9409
#: Reader connections served at once; one more is refused with an error (each has a thread).
MAX_CONNECTIONS = 1024
#: Seconds a frame may take once it has begun (and a new connection, to say hello): a peer
#: that sends part of a frame and stops is dropped, and a reader that does not take its
#: answers is too.
FRAME_TIMEOUT = 30.0


@dataclass(frozen=True)
class AgentConfig:
    """``cache_dir`` is the disk tier's directory (owned by the agent), ``cache_limit``
    its size; ``shm_limit`` bounds the memory tier (``shm_root``, default /dev/shm).
    ``max_remote`` requests to remote storage at once, at most ``max_rate`` per second
    (0: no cap); ``decode_threads`` decode blocks; ``prefetch_bytes`` bounds what is
    read ahead of readers (default: half the memory tier). The agent exits after
    ``idle_exit`` seconds without a reader (None: never), serves at most
    ``max_connections`` readers, gives a request ``frame_timeout`` seconds to arrive,
    and serves /metrics on ``metrics_port`` (0: any free port; None: none)."""

    cache_dir: str
    cache_limit: int = 64 << 30
    shm_limit: int = 4 << 30
    max_remote: int = 16
    max_rate: float = 0.0
    decode_threads: int = 4
    prefetch_bytes: int | None = None
    shm_root: str | None = None
    idle_exit: float | None = None
    max_connections: int = MAX_CONNECTIONS
    frame_timeout: float = FRAME_TIMEOUT
    metrics_port: int | None = METRICS_PORT
