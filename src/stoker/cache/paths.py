"""Where a node agent keeps its files, derived from the cache directory alone.

Everything an agent owns hangs off its cache directory, so two agents never
share a file unless they share the directory (and then the lock file lets only
one run):

``<cache_dir>/.stoker-cache``      marker: this directory belongs to a stoker agent
``<cache_dir>/agent.lock``          held (flock) by the running agent; the kernel drops
                                    it when the agent dies, so a crash leaves no stale lock
``<cache_dir>/agent.sock``          the Unix socket readers connect to
``<cache_dir>/agent.log``           the log of an agent started automatically
``<cache_dir>/agent.spawn``         held (flock) by the reader starting the agent, so the
                                    readers of a machine start one agent, not one each
``<cache_dir>/blocks/<id>/<n>.rec`` disk tier: verified compressed block records
``/dev/shm/stoker-<uid>-<hash>/``   memory tier: one file a block (``<key>-<n>.tok``:
                                    decoded tokens; ``.arrow``: a records block, or its
                                    images decoded)

The default cache directory is per user (``$STOKER_CACHE_DIR``, else
``$XDG_CACHE_HOME/stoker``, else ``~/.cache/stoker``), and the memory tier's
name carries the uid and a hash of the cache directory, so the caches of
different users on one machine never collide.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from stoker import env

MARKER = ".stoker-cache"
SHM_ROOT = Path("/dev/shm")


def default_cache_dir() -> Path:
    given = env.get("STOKER_CACHE_DIR")
    if given:
        return Path(given)
    xdg = env.get("XDG_CACHE_HOME")
    base = Path(xdg) if xdg else Path.home() / ".cache"
    return base / "stoker"


class AgentPaths:
    """The files of the agent that owns ``cache_dir``."""

    def __init__(
        self,
        cache_dir: str | os.PathLike[str],
        shm_root: Path | None = None,
        uid: int | None = None,
    ) -> None:
        self.cache_dir = Path(cache_dir).resolve()
        self.marker = self.cache_dir / MARKER
        self.lock = self.cache_dir / "agent.lock"
        self.socket = self.cache_dir / "agent.sock"
        self.log = self.cache_dir / "agent.log"
        self.spawning = self.cache_dir / "agent.spawn"
        self.blocks = self.cache_dir / "blocks"
        digest = hashlib.sha256(str(self.cache_dir).encode()).hexdigest()[:12]
        uid = os.getuid() if uid is None else uid
        self.shm = (shm_root or SHM_ROOT) / f"stoker-{uid}-{digest}"

    def record(self, dataset_id: str, block: int) -> Path:
        return self.blocks / dataset_id / f"{block}.rec"

    def decoded(self, key: str, block: int, suffix: str = ".tok") -> Path:
        """A block's file in the memory tier (``key``: the dataset's, or its view's)."""
        return self.shm / f"{key}-{block}{suffix}"
