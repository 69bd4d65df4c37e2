"""The runtime directory: endpoint records of live processes only, private token files."""

from __future__ import annotations

import json
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from stoker import runtime
from stoker.errors import ConfigError


@pytest.fixture(autouse=True)
def private_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    d = tmp_path / "run"
    monkeypatch.setenv(runtime.ENV_DIR, str(d))
    return d


def test_records_of_dead_processes_are_ignored_and_removed(private_dir: Path) -> None:
    mine = runtime.announce("rank 0", "127.0.0.1", 1234)
    assert mine is not None
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    stale = private_dir / "endpoints" / f"{gone.stdout.strip()}-9400.json"
    stale.write_text(json.dumps({"pid": int(gone.stdout), "role": "rank 0",
                                 "address": "127.0.0.1:9400"}))  # fmt: skip
    found = runtime.endpoints()
    assert [r["address"] for r in found] == ["127.0.0.1:1234"]
    assert not stale.exists()
    runtime.withdraw(mine)
    assert runtime.endpoints() == []


def test_a_token_file_is_private(private_dir: Path) -> None:
    path = runtime.write_token("localhost:5005", "secret")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(private_dir.stat().st_mode) == 0o700
    assert runtime.read_token("127.0.0.1:5005") == "secret"
    assert runtime.read_token("127.0.0.1:5006") is None


def test_a_shared_runtime_directory_is_refused(private_dir: Path) -> None:
    private_dir.mkdir(mode=0o777)
    private_dir.chmod(0o777)
    with pytest.raises(ConfigError, match=str(private_dir)):
        runtime.runtime_dir()


def test_token_files_of_coordinators_that_are_gone_are_swept(private_dir: Path) -> None:
    import socket

    listening = socket.socket()
    listening.bind(("127.0.0.1", 0))
    listening.listen(1)
    live = runtime.write_token(f"127.0.0.1:{listening.getsockname()[1]}", "a")
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    dead_port = closed.getsockname()[1]
    closed.close()  # nothing listens there now
    dead = runtime.write_token(f"127.0.0.1:{dead_port}", "b")
    fresh = runtime.write_token("127.0.0.1:1", "c")  # a new coordinator's file is kept
    assert fresh.exists() and live.exists() and not dead.exists()
    listening.close()
