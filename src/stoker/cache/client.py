"""A reader's handle on the node agent: connect (starting the agent if none runs), ask, map.

:class:`AgentClient` holds only its settings, so it pickles into DataLoader
workers; every process opens its own connection on first use (pins belong to
a connection, so each process's pins are its own). When the agent dies the
next request reconnects, starting a new agent if needed, reopens the datasets
and repeats the request; blocks already mapped stay readable (a mapping
outlives the file's name), so nothing a reader holds is lost.
"""

from __future__ import annotations

import json
import mmap
import os
import socket
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np

from stoker import errors
from stoker._proto import agent_pb2 as pb
from stoker.cache import wire
from stoker.cache.paths import AgentPaths, default_cache_dir
from stoker.errors import AgentError


class AgentClient:
    """Talks to the agent that owns ``cache_dir`` (by default the user's cache directory).

    ``cache_limit``, ``shm_limit``, ``max_remote``, ``max_rate`` and
    ``idle_exit`` are used when this client has to start the agent (which then
    exits after ``idle_exit`` seconds without a reader); an agent already
    running keeps its own settings.
    """

    def __init__(
        self,
        cache_dir: str | os.PathLike[str] | None = None,
        cache_limit: int = 64 << 30,
        shm_limit: int = 4 << 30,
        *,
        autostart: bool = True,
        timeout: float = 60.0,
        max_remote: int = 16,
        max_rate: float = 0.0,
        idle_exit: float = 300.0,
    ) -> None:
        self.paths = AgentPaths(cache_dir if cache_dir is not None else default_cache_dir())
        self.cache_limit = cache_limit
        self.shm_limit = shm_limit
        self.autostart = autostart
        self.timeout = timeout
        self.max_remote = max_remote
        self.max_rate = max_rate
        self.idle_exit = idle_exit
        self._opened: dict[str, pb.Open] = {}
        self._reset()

    def _reset(self) -> None:
        self._pid = os.getpid()
        self._sock: socket.socket | None = None
        self._lock = threading.Lock()
        self._next_id = 0
        self._warned_inline = False
        self.reconnects = 0

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        for k in ("_sock", "_lock", "_pid", "_warned_inline"):
            state.pop(k, None)
        state["_opened"] = {k: v.SerializeToString() for k, v in self._opened.items()}
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        opened = state.pop("_opened")
        self.__dict__.update(state)
        self._opened = {k: pb.Open.FromString(v) for k, v in opened.items()}
        self._reset()

    # -- connection -----------------------------------------------------------------
    def _connect_once(self) -> socket.socket:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(str(self.paths.socket))
            wire.send(
                sock,
                pb.Request(id=0, hello=pb.Hello(protocol=wire.PROTOCOL_VERSION, pid=os.getpid())),
            )
            resp = wire.recv(sock, pb.Response)
        except BaseException:
            sock.close()
            raise
        if resp.error:
            sock.close()
            raise AgentError(f"agent at {self.paths.socket} refused the connection: {resp.error}")
        return sock

    def _spawn(self) -> subprocess.Popen[bytes]:
        self.paths.cache_dir.mkdir(parents=True, exist_ok=True)
        cmd = [
            sys.executable,
            "-m",
            "stoker.cache.agent",
            "--cache-dir",
            str(self.paths.cache_dir),
            "--cache-limit",
            str(self.cache_limit),
            "--shm-limit",
            str(self.shm_limit),
            "--max-remote",
            str(self.max_remote),
            "--max-rate",
            str(self.max_rate),
            "--idle-exit",
            str(self.idle_exit),
        ]
        with open(self.paths.log, "ab") as logf:
            return subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=logf,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # outlives this reader; not hit by its Ctrl-C
                close_fds=True,
            )

    def _connect(self) -> socket.socket:
        """Connect, starting an agent when none answers; give up after ``timeout``."""
        deadline = time.monotonic() + self.timeout
        spawned: subprocess.Popen[bytes] | None = None
        while True:
            try:
                return self._connect_once()
            except (
                FileNotFoundError,
                ConnectionRefusedError,
                ConnectionResetError,
                BrokenPipeError,
            ):
                pass
            if not self.autostart:
                raise AgentError(
                    f"no stoker agent at {self.paths.socket}; start one with "
                    f"`stoker agent --cache-dir {self.paths.cache_dir} --cache-limit ...`"
                )
            if spawned is None:
                spawned = self._spawn()
            elif spawned.poll() not in (None, 3):  # 3: another agent won the race; fine
                raise AgentError(
                    f"the stoker agent for {self.paths.cache_dir} exited with code "
                    f"{spawned.returncode}; see {self.paths.log}:\n{self._log_tail()}"
                )
            if time.monotonic() > deadline:
                raise AgentError(
                    f"no stoker agent answered at {self.paths.socket} within {self.timeout:.0f} s; "
                    f"see {self.paths.log}"
                )
            time.sleep(0.02)  # the agent is starting: poll its socket

    def _log_tail(self) -> str:
        try:
            return "\n".join(self.paths.log.read_text(errors="replace").splitlines()[-10:])
        except OSError:
            return ""

    def _call(self, req: pb.Request) -> pb.Response:
        if self._pid != os.getpid():  # forked: never share the parent's connection
            self._reset()
        with self._lock:
            deadline = time.monotonic() + self.timeout
            while True:
                fresh = self._sock is None
                try:
                    if self._sock is None:
                        self._sock = self._connect()
                        if self._opened and req.WhichOneof("kind") != "open":
                            for op in self._opened.values():
                                self._request(pb.Request(open=op))
                    resp = self._request(req)
                    break
                except (ConnectionError, OSError) as exc:
                    if isinstance(exc, wire.ProtocolError):
                        raise
                    if self._sock is not None:
                        self._sock.close()
                    self._sock = None
                    self.reconnects += 1
                    if time.monotonic() > deadline:
                        raise AgentError(
                            f"lost the stoker agent at {self.paths.socket} and could not reconnect "
                            f"within {self.timeout:.0f} s ({exc})"
                        ) from exc
                    if fresh:
                        time.sleep(0.05)  # back off between failed connections
        if resp.error:
            kind = getattr(errors, resp.error_kind, None) if resp.error_kind else None
            if isinstance(kind, type) and issubclass(kind, errors.StokerError):
                raise kind(f"{resp.error} (from the stoker agent)")
            raise AgentError(f"stoker agent: {resp.error}")
        return resp

    def _request(self, req: pb.Request) -> pb.Response:
        assert self._sock is not None
        self._next_id += 1
        req.id = self._next_id
        wire.send(self._sock, req)
        resp = wire.recv(self._sock, pb.Response)
        if resp.id != req.id:
            raise wire.ProtocolError(f"agent answered request {resp.id}, expected {req.id}")
        return resp

    def close(self) -> None:
        """Close this process's connection (the agent releases its pins)."""
        if self._pid == os.getpid() and self._sock is not None:
            self._sock.close()
            self._sock = None

    # -- requests -------------------------------------------------------------------
    def open(self, url: str, storage_options: dict[str, Any] | None, dataset_id: str) -> None:
        op = pb.Open(
            url=url,
            storage_options_json=json.dumps(storage_options) if storage_options else "",
            dataset_id=dataset_id,
        )
        self._call(pb.Request(open=op))
        self._opened[dataset_id] = op

    def get(self, dataset_id: str, block: int) -> pb.Block:
        """Pin ``block`` and say where it is (or carry its record inline)."""
        got = self._call(pb.Request(get=pb.Get(dataset_id=dataset_id, block=block))).block
        if not got.pinned and not self._warned_inline:
            self._warned_inline = True
            warnings.warn(
                f"the stoker agent at {self.paths.socket} has no room in shared memory; this "
                "process decodes blocks itself until there is (raise the agent's --shm-limit "
                "or free /dev/shm)",
                stacklevel=2,
            )
        return got

    def release(self, dataset_id: str, blocks: list[int]) -> None:
        if blocks:
            self._call(pb.Request(release=pb.Release(dataset_id=dataset_id, blocks=blocks)))

    def plan(self, dataset_id: str, blocks: list[int]) -> None:
        self._call(pb.Request(plan=pb.Plan(dataset_id=dataset_id, blocks=blocks)))

    def holdings(self, dataset_id: str) -> list[int]:
        """Blocks of the dataset this node's agent holds (memory or disk)."""
        r = self._call(pb.Request(holdings=pb.Holdings(dataset_id=dataset_id)))
        return [int(b) for b in r.held.blocks]

    @property
    def node(self) -> str:
        """This node's cache, named for locality: the host and the agent's directory."""
        return f"{socket.gethostname()}:{self.paths.cache_dir}"

    def stats(self) -> dict[str, Any]:
        """The agent's counters and gauges."""
        return dict(json.loads(self._call(pb.Request(stats=pb.StatsRequest())).stats.json))


def map_block(path: str | Path, tokens: int, dtype: np.dtype) -> tuple[np.ndarray, np.ndarray]:
    """Read-only views of a decoded block file: its tokens and its document-start flags."""
    fd = os.open(path, os.O_RDONLY)
    try:
        mm = mmap.mmap(fd, 0, prot=mmap.PROT_READ)
    finally:
        os.close(fd)
    flags_at = -(-tokens * dtype.itemsize // 8) * 8
    toks = np.frombuffer(mm, dtype=dtype, count=tokens)
    flags = np.frombuffer(mm, dtype=np.bool_, count=tokens, offset=flags_at)
    return toks, flags
