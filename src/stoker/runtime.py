"""Where a machine's stoker processes say what they serve: one per-user runtime directory.

``$STOKER_RUNTIME_DIR``, else ``$XDG_RUNTIME_DIR/stoker``, else ``/tmp/stoker-<uid>``;
created ``0700`` and refused when another user owns it or others may write it::

    endpoints/<pid>-<port>.json        a process serving /metrics: pid, role, address
    coordinator-<host>-<port>.token    the token a standalone coordinator made itself (0600)

Every process that serves metrics (a training rank, the node agent, the coordinator)
writes its record once it has bound the port and removes it when it exits cleanly;
readers skip (and remove) the records of processes that no longer exist, so
``stoker doctor`` and ``stoker top`` find a running job's endpoints without being told.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import re
import socket
import stat
from pathlib import Path
from typing import Any

from stoker import env
from stoker.errors import ConfigError

ENV_DIR = "STOKER_RUNTIME_DIR"


def runtime_dir(create: bool = True) -> Path:
    """This user's runtime directory (made ``0700`` when ``create``)."""
    given, xdg = env.get(ENV_DIR), env.get("XDG_RUNTIME_DIR")
    if given:
        path = Path(given)
    elif xdg:
        path = Path(xdg) / "stoker"
    else:
        path = Path("/tmp") / f"stoker-{os.getuid()}"
    if create:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
    if path.exists():
        st = path.stat()
        if st.st_uid != os.getuid() or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            raise ConfigError(
                f"runtime directory {path} belongs to uid {st.st_uid} or others may write it; "
                f"set {ENV_DIR} to a private directory"
            )
    return path


def _start_time(pid: int) -> str:
    """When ``pid`` started (clock ticks since boot), telling a reused pid apart; '' if unknown."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    return text.rsplit(")", 1)[1].split()[19]


def alive(pid: int, started: str = "") -> bool:
    """Whether process ``pid`` exists (and, given its ``started`` time, is that process,
    not a later one that reused the pid)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return not started or _start_time(pid) in ("", started)


def _write_private(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` readable by this user only (written aside, then renamed)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, text.encode())
    finally:
        os.close(fd)
    os.replace(tmp, path)


# -- metrics endpoints -----------------------------------------------------------------
def announce(role: str, host: str, port: int, **extra: Any) -> Path | None:
    """Record that this process serves ``/metrics`` at ``host:port`` (removed at a clean
    exit); None when the runtime directory cannot be written (the endpoint still serves)."""
    try:
        d = runtime_dir() / "endpoints"
        d.mkdir(mode=0o700, exist_ok=True)
        pid = os.getpid()
        path = d / f"{pid}-{port}.json"
        record = {"pid": pid, "started": _start_time(pid), "role": role,
                  "address": f"{host}:{port}", **extra}  # fmt: skip
        _write_private(path, json.dumps(record))
    except (OSError, ConfigError):
        return None
    atexit.register(withdraw, path, pid)
    return path


def withdraw(path: Path, pid: int | None = None) -> None:
    """Remove a record :func:`announce` wrote (only in the process that wrote it)."""
    if pid is None or pid == os.getpid():
        path.unlink(missing_ok=True)


def endpoints(role: str | None = None) -> list[dict[str, Any]]:
    """Records of the live processes that serve metrics on this machine, oldest first;
    records of processes that are gone are removed."""
    try:
        d = runtime_dir(create=False) / "endpoints"
        files = sorted(d.glob("*.json"), key=lambda f: f.stat().st_mtime)
    except (OSError, ConfigError):
        return []
    out = []
    for f in files:
        try:
            rec = json.loads(f.read_text())
            pid = int(rec["pid"])
            address = str(rec["address"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if not alive(pid, str(rec.get("started", ""))):
            with contextlib.suppress(OSError):
                f.unlink()
            continue
        if role is None or rec.get("role") == role:
            out.append({**rec, "pid": pid, "address": address})
    return out


# -- coordinator tokens ----------------------------------------------------------------
def token_path(address: str, service: str = "coordinator") -> Path:
    """The well-known token file of the ``service`` (the coordinator, or a preprocessing
    worker: ``"preprocess"``) at ``address`` (``host:port``)."""
    host, _, port = address.rpartition(":")
    host = host.strip("[]")
    if host in ("localhost", ""):
        host = "127.0.0.1"
    safe = re.sub(r"[^A-Za-z0-9.]", "_", host)
    return runtime_dir(create=False) / f"{service}-{safe}-{port}.token"


def write_token(address: str, token: str, service: str = "coordinator") -> Path:
    """Store ``token`` as the well-known token of ``address`` (``0600``); returns the file.
    Token files of loopback services that no longer listen go (:func:`sweep_tokens`)."""
    runtime_dir()
    path = token_path(address, service)
    sweep_tokens(keep=path)
    _write_private(path, token + "\n")
    return path


def sweep_tokens(keep: Path | None = None) -> int:
    """Remove the token files of loopback services nothing listens for any more (one
    killed with SIGKILL leaves its file); returns how many went."""
    gone = 0
    try:
        files = list(runtime_dir(create=False).glob("*-127.0.0.1-*.token"))
    except (OSError, ConfigError):
        return 0
    for f in files:
        if f == keep:
            continue
        try:
            port = int(f.stem.rsplit("-", 1)[1])
        except ValueError:
            continue
        with socket.socket() as s:
            s.settimeout(0.5)
            try:
                s.connect(("127.0.0.1", port))
                continue  # something listens: maybe its coordinator
            except ConnectionRefusedError:
                pass
            except OSError:
                continue
        with contextlib.suppress(OSError):
            f.unlink()
            gone += 1
    return gone


def read_token(address: str, service: str = "coordinator") -> str | None:
    """The well-known token of the ``service`` at ``address``, if this user has one."""
    try:
        return token_path(address, service).read_text().strip() or None
    except (OSError, ConfigError):
        return None
