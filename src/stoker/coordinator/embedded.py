"""The coordinator of a job started by its rank 0, found by the others through the job's store.

``TokenLoader(ds, coordinator="rank0")`` needs no service started by hand:

* with ``STOKER_COORDINATOR=host:port`` set (and ``STOKER_COORDINATOR_TOKEN`` when
  it is not on loopback), every rank uses that coordinator;
* otherwise rank 0 starts ``stoker coordinator`` as its child process (a process
  of its own, so the coordinator's work never competes with rank 0's Python
  thread; it exits when rank 0's pipe to it closes, i.e. when rank 0 exits or
  dies) and publishes its address and a fresh token in the torch.distributed
  store, where the other ranks read them. Values in the store are plain text.
  Rank 0 prints one line (stderr) naming where the coordinator's state lives (what
  ``stoker replay`` reads); a temporary state directory, made when no state URL is
  given, is removed once the coordinator stops cleanly; a given one never is.

Where it binds: ``STOKER_COORDINATOR_BIND`` if set; loopback when the job runs
on one machine; else the address ``MASTER_ADDR`` resolves to (rank 0's machine
in a torchrun launch), which needs the token the other ranks get from the store.
"""

from __future__ import annotations

import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
from typing import Any

from stoker import env, settings
from stoker.coordinator.client import CoordinatorClient
from stoker.coordinator.journal import Journal
from stoker.coordinator.leases import Config
from stoker.errors import ConfigError

ENV_ADDRESS = "STOKER_COORDINATOR"
ENV_TOKEN = "STOKER_COORDINATOR_TOKEN"
ENV_BIND = "STOKER_COORDINATOR_BIND"


def _store() -> Any:
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return None
    return dist.distributed_c10d._get_default_store()


def _store_key(job: str) -> str:
    # a torchelastic restart keeps the store: each attempt has its own key
    attempt = env.get("TORCHELASTIC_RESTART_COUNT", "0")
    return f"stoker/coordinator/{job}/{attempt}"


def default_bind(world: int) -> str:
    bind = env.get(ENV_BIND)
    if bind:
        return bind
    local = int(env.get("LOCAL_WORLD_SIZE") or str(world))
    master = env.get("MASTER_ADDR") or ""
    if world <= local or not master:
        return "127.0.0.1:0"
    try:
        return f"{socket.gethostbyname(master)}:0"
    except OSError as exc:
        raise ConfigError(
            f"cannot resolve MASTER_ADDR {master!r} to bind the coordinator ({exc}); "
            f"set {ENV_BIND}=HOST:PORT"
        ) from None


class Embedded:
    """A coordinator started by this process (rank 0); :meth:`close` stops it.

    ``temporary``: the state directory was made here (no state URL given); it is removed
    once the coordinator has stopped cleanly. A state URL the user gave is never removed.
    """

    def __init__(
        self,
        proc: subprocess.Popen[bytes],
        address: str,
        state_url: str,
        temporary: bool = False,
    ) -> None:
        self.proc = proc
        self.address = address
        self.state_url = state_url
        self.temporary = temporary

    def close(self) -> None:
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()  # its cue to stop
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.temporary and self.proc.returncode == 0:
            shutil.rmtree(self.state_url, ignore_errors=True)
            self.temporary = False


def spawn(
    num_samples: int,
    world: int,
    *,
    state_url: str | None = None,
    job: str = "job",
    bind: str | None = None,
    token: str | None = None,
    config: Config | None = None,
    drop_remainder: bool = False,
    restore: tuple[str, dict[str, Any]] | None = None,
) -> Embedded:
    """Start ``stoker coordinator`` as a child process; returns once it serves."""
    config = config or Config()
    temporary = state_url is None
    state_url = state_url or tempfile.mkdtemp(prefix="stoker-coordinator-")
    bind = bind or default_bind(world)
    cmd = [
        sys.executable, "-m", "stoker.cli", "coordinator",
        "--state", state_url, "--job", job, "--world", str(world),
        "--num-samples", str(num_samples), "--bind", bind, "--exit-with-parent",
        "--config-json", settings.to_json(config),
    ]  # fmt: skip
    if drop_remainder:
        cmd.append("--drop-remainder")
    if restore is not None:
        name, snapshot = restore
        Journal(state_url, job).write_checkpoint(name, snapshot)  # the state travels inline
        cmd += ["--restore", name]
    child_env = dict(os.environ)  # the child inherits this environment
    child_env.pop(ENV_TOKEN, None)
    if token:
        child_env[ENV_TOKEN] = token
    proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=child_env)
    assert proc.stdout is not None
    seen = []
    for raw in proc.stdout:
        line = raw.decode(errors="replace")
        seen.append(line)
        if "serving " in line:
            address = line.split("serving ")[1].split()[0]
            proc.stdout.close()
            keep = (
                "a temporary directory, removed when the job ends cleanly (give "
                "coordinator_state= to keep it)"
                if temporary
                else "kept"
            )
            print(
                f"stoker: coordinator at {address}; its state (journal, checkpoints; "
                f"`stoker replay --state {state_url} --job {job}`) is in {state_url}: {keep}",
                file=sys.stderr,
                flush=True,
            )
            return Embedded(proc, address, state_url, temporary)
    proc.wait()
    raise ConfigError(
        f"the coordinator did not start (exit code {proc.returncode}): {''.join(seen)[-2000:]}"
    )


def connect(
    num_samples: int,
    rank: int,
    world: int,
    *,
    state_url: str | None = None,
    job: str = "job",
    config: Config | None = None,
    drop_remainder: bool = False,
    restore: tuple[str, dict[str, Any]] | None = None,
) -> tuple[CoordinatorClient, Embedded | None]:
    """This rank's client of the job's coordinator, and the coordinator if rank 0 started it."""
    address = env.get(ENV_ADDRESS)
    if address:
        return CoordinatorClient(address, env.get(ENV_TOKEN)), None
    store = _store()
    if store is None and world > 1:
        raise ConfigError(
            f'coordinator="rank0" with {world} ranks needs torch.distributed initialised '
            f"(its store carries the address), or {ENV_ADDRESS}=host:port"
        )
    key = _store_key(job)
    if rank == 0:
        token = secrets.token_urlsafe(24)
        started = spawn(
            num_samples,
            world,
            state_url=state_url,
            job=job,
            token=token,
            config=config,
            drop_remainder=drop_remainder,
            restore=restore,
        )
        host, port = started.address.rsplit(":", 1)
        if host in ("0.0.0.0", "::", "[::]"):
            host = socket.gethostname()
        address = f"{host}:{port}"
        if store is not None:
            store.set(key, f"{address} {token}")
        return CoordinatorClient(address, token), started
    address, token = store.get(key).decode().split(" ", 1)
    return CoordinatorClient(address, token), None
