"""The coordinator needs its token on every call, loopback included; consumer ids are random.

A real `stoker coordinator` started without a token makes one and writes it to a file
only its user can read; clients on the machine find it there. A raw gRPC channel with
no token, and a client with a wrong one, can neither register, lease nor confirm."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from stoker._proto import coordinator_pb2 as pb
from stoker._proto import coordinator_pb2_grpc as pb_grpc
from stoker.coordinator.client import CoordinatorClient, LeaseRejected

from .helpers import reap


@pytest.fixture
def coordinator(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[subprocess.Popen[str], str, Path]]:
    run = tmp_path / "run"
    monkeypatch.setenv("STOKER_RUNTIME_DIR", str(run))  # this process and the coordinator
    monkeypatch.delenv("STOKER_COORDINATOR_TOKEN", raising=False)
    monkeypatch.delenv("STOKER_COORDINATOR_TOKEN_FILE", raising=False)
    proc = subprocess.Popen(
        [sys.executable, "-m", "stoker.cli", "coordinator", "--state", str(tmp_path / "state"),
         "--world", "2", "--num-samples", "1000", "--lease-size", "10", "--metrics-port", "-1"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=dict(os.environ),
    )  # fmt: skip
    assert proc.stdout is not None
    seen = []
    for line in proc.stdout:
        seen.append(line)
        if "stoker coordinator: serving" in line:
            break
    else:
        raise AssertionError("".join(seen))
    address = seen[-1].split("serving ")[1].split()[0]
    token_lines = [line for line in seen if "token in " in line]
    assert len(token_lines) == 1, seen
    token_file = Path(token_lines[0].split("token in ")[1].split()[0])
    yield proc, address, token_file
    reap(proc)


def test_no_token_no_service(coordinator: tuple[subprocess.Popen[str], str, Path]) -> None:
    proc, address, token_file = coordinator
    assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
    token = token_file.read_text().strip()
    assert len(token) >= 32
    # a raw channel without the token
    with grpc.insecure_channel(address) as channel:
        stub = pb_grpc.CoordinatorStub(channel)
        for call, req in (
            (stub.Register, pb.RegisterRequest(rank=0, worker=0)),
            (stub.Lease, pb.LeaseRequest(consumer=1, epoch=0)),
            (stub.Confirm, pb.ConfirmRequest(consumer=1, epoch=0, lease=1, upto=5)),
            (stub.Batch, pb.BatchRequest()),
        ):
            with pytest.raises(grpc.RpcError) as err:
                call(req, timeout=10)
            assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
    # the client finds the token in the well-known file; consumer ids are not a counter
    good = CoordinatorClient(address, retry_for=10)
    a, epoch = good.register(0, 0)
    b, _ = good.register(1, 0)
    assert a > 2**32 and b > 2**32 and abs(a - b) > 2**16
    grant = good.lease(a, epoch, [])
    assert grant.status == "granted"
    # a wrong token cannot register, lease or confirm, even with a real consumer id
    bad = CoordinatorClient(address, token="wrong", retry_for=10)
    for attempt in (
        lambda: bad.register(0, 1),
        lambda: bad.lease(a, epoch, []),
        lambda: bad.confirm(a, epoch, grant.lease, grant.start + 1),
    ):
        with pytest.raises(LeaseRejected) as rej:
            attempt()
        assert rej.value.code == "UNAUTHENTICATED"
    assert good.confirm(a, epoch, grant.lease, grant.start + 1) is False  # still a's
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0
    assert token not in out  # never logged
    assert not token_file.exists()  # removed at a clean exit


def test_a_token_file_named_in_the_environment(
    coordinator: tuple[subprocess.Popen[str], str, Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _, address, token_file = coordinator
    copy = tmp_path / "my-token"
    copy.write_text(token_file.read_text())
    monkeypatch.setenv("STOKER_RUNTIME_DIR", str(tmp_path / "elsewhere"))  # no well-known file
    with pytest.raises(LeaseRejected):
        CoordinatorClient(address, retry_for=10).register(0, 0)
    monkeypatch.setenv("STOKER_COORDINATOR_TOKEN_FILE", str(copy))
    assert CoordinatorClient(address, retry_for=10).register(0, 0)[0] > 0
    monkeypatch.delenv("STOKER_COORDINATOR_TOKEN_FILE")
    monkeypatch.setenv("STOKER_COORDINATOR_TOKEN", copy.read_text().strip())
    assert CoordinatorClient(address, retry_for=10).register(1, 0)[0] > 0


@pytest.mark.parametrize("content", [None, ""])
def test_a_bad_token_file_is_named(tmp_path: Path, content: str | None) -> None:
    path = tmp_path / "token"
    if content is not None:
        path.write_text(content)
    proc = subprocess.run(
        [sys.executable, "-m", "stoker.cli", "coordinator", "--state", str(tmp_path / "s"),
         "--world", "1", "--num-samples", "10", "--token-file", str(path),
         "--metrics-port", "-1"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert f"--token-file {path}" in proc.stderr
    assert "Traceback" not in proc.stderr
