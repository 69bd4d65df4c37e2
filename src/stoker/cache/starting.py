"""Starting the node agent for a reader: one per machine, outliving the reader.

A reader that finds no agent spawns one (``python -m stoker.cache.agent`` with its
settings as one JSON message) in a session of its own, so it outlives the reader and
is not hit by the reader's Ctrl-C. The readers of a machine (a job's DataLoader
workers) start one agent, not one each: the one holding the spawn lock starts it, the
others wait for its socket. The handles of agents this process started stay here
until they exit, so none is left a zombie.
"""

from __future__ import annotations

import atexit
import fcntl
import os
import subprocess
import sys
import threading

from stoker import settings
from stoker.cache.config import AgentConfig
from stoker.cache.paths import AgentPaths
from stoker.errors import AgentError

#: The agents this process started and has not reaped yet: an agent outlives the client
#: that started it, so its handle stays here (not dropped while the agent runs, which
#: would leave a zombie behind once it exits) until :func:`reap` sees it exit.
_spawned: list[subprocess.Popen[bytes]] = []
_spawned_lock = threading.Lock()

#: The agent does no linear algebra: one BLAS thread, not a pool started at numpy's
#: import (a twentieth of a CPU second of the autostart on two cores).
AGENT_ENV = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def reap() -> None:
    """Forget (and reap) the agents this process started that have exited."""
    with _spawned_lock:
        _spawned[:] = [proc for proc in _spawned if proc.poll() is None]


atexit.register(reap)


def spawn(paths: AgentPaths, config: AgentConfig) -> subprocess.Popen[bytes]:
    """Start an agent for ``paths`` with ``config``, its output appended to the log."""
    paths.cache_dir.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "stoker.cache.agent", "--config-json", settings.to_json(config)]
    reap()
    with open(paths.log, "ab") as logf:
        proc = subprocess.Popen(
            cmd,
            env={**os.environ, **AGENT_ENV},
            stdin=subprocess.DEVNULL,
            stdout=logf,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # outlives this reader; not hit by its Ctrl-C
            close_fds=True,
        )
    with _spawned_lock:
        _spawned.append(proc)
    return proc


class Start:
    """An agent being started: the process spawned (None: another reader process is
    starting it) and the spawn lock held meanwhile."""

    def __init__(self, proc: subprocess.Popen[bytes] | None, lock_fd: int | None) -> None:
        self.proc = proc
        self.lock_fd = lock_fd

    def close(self) -> None:
        if self.lock_fd is not None:
            os.close(self.lock_fd)
            self.lock_fd = None


def claim_start(paths: AgentPaths, config: AgentConfig) -> Start:
    """Start the agent, unless another reader process of this machine is starting it
    (it holds the spawn lock)."""
    paths.cache_dir.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(paths.spawning, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    except OSError:
        return Start(spawn(paths, config), None)  # no lock to be had: start it anyway
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return Start(None, None)  # another reader is starting it
    try:
        return Start(spawn(paths, config), fd)
    except BaseException:
        os.close(fd)
        raise


def exited(paths: AgentPaths, proc: subprocess.Popen[bytes]) -> AgentError:
    """The error for an agent this process started that exited, with its log's tail."""
    return AgentError(
        f"the stoker agent for {paths.cache_dir} exited with code {proc.returncode}; "
        f"see {paths.log}:\n{log_tail(paths)}"
    )


def log_tail(paths: AgentPaths, lines: int = 10) -> str:
    """The last ``lines`` of the agent's log ('' if it cannot be read)."""
    try:
        return "\n".join(paths.log.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""
