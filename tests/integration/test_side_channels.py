"""Metrics never stop a process: a taken port moves to a free one, and every process that
serves metrics records where, so `stoker doctor` and `stoker top` find a job unaided.

Real processes throughout: a training rank (TokenLoader), the node agent, the
coordinator, each started with its metrics port held by another socket; the doctor and
top are the real CLI, told nothing but the runtime directory (as every process of one
user on one machine shares it)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from .helpers import Written, reap, write_dataset

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from servers import free_port

JOB = Path(__file__).with_name("_doctor_job.py")


@pytest.fixture
def held_port() -> Iterator[int]:
    """A loopback port some other program listens on."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(1)
    yield int(s.getsockname()[1])
    s.close()


@pytest.fixture
def run_env(tmp_path: Path) -> dict[str, str]:
    return {**os.environ, "STOKER_RUNTIME_DIR": str(tmp_path / "run")}


def records(env: dict[str, str]) -> list[dict]:
    d = Path(env["STOKER_RUNTIME_DIR"]) / "endpoints"
    return [json.loads(f.read_text()) for f in sorted(d.glob("*.json"))] if d.exists() else []


def scrape(address: str) -> str:
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as r:
        return r.read().decode()


def wait_line(proc: subprocess.Popen[str], want: str) -> list[str]:
    assert proc.stdout is not None
    seen = []
    for line in proc.stdout:
        seen.append(line)
        if want in line if want != "ready" else line.strip() == "ready":
            return seen
    raise AssertionError(f"no {want!r} in the output:\n" + "".join(seen))


def test_a_rank_whose_port_is_taken_trains_and_is_found(
    tmp_path: Path, held_port: int, run_env: dict[str, str]
) -> None:
    ds: Written = write_dataset(tmp_path / "ds", num_docs=300, seed=3, block_tokens=4096)
    job = subprocess.Popen(
        [sys.executable, str(JOB), "--dataset", str(ds.path), "--metrics-port", str(held_port),
         "--workers", "1", "--step", "0.01"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env=run_env,
    )  # fmt: skip
    try:
        seen = wait_line(job, "ready")  # it trains: the taken port did not kill it
        assert any(f"metrics port {held_port} is taken" in line for line in seen), seen
        (rec,) = records(run_env)
        assert rec["pid"] == job.pid and rec["role"] == "rank 0"
        assert not rec["address"].endswith(f":{held_port}")
        assert "stoker_loader_batches_total" in scrape(rec["address"])
        # doctor and top with no endpoint find the rank through the runtime directory
        doc = subprocess.run(
            [sys.executable, "-m", "stoker.cli", "doctor", "--window", "2", "--json"],
            capture_output=True, text=True, timeout=120, env=run_env,
        )  # fmt: skip
        assert doc.returncode == 0, doc.stderr
        assert json.loads(doc.stdout)["bottleneck"] != "no-data"
        top = subprocess.run(
            [sys.executable, "-m", "stoker.cli", "top", "--interval", "1", "--iterations", "1"],
            capture_output=True, text=True, timeout=120, env=run_env,
        )  # fmt: skip
        assert top.returncode == 0, top.stderr
        row = [line.split() for line in top.stdout.splitlines() if line.strip().startswith("0 ")]
        assert row and row[0][-1] == "-", top.stdout  # no coordinator: a dash, not nan
        assert "nan" not in top.stdout
    finally:
        assert job.stdin is not None
        job.stdin.close()  # its cue to stop
        job.wait(timeout=60)
        reap(job)  # its stdout
    assert job.returncode == 0
    assert records(run_env) == []  # a clean exit removes its record


@pytest.mark.parametrize("service", ["agent", "coordinator"])
def test_a_service_whose_port_is_taken_serves_elsewhere(
    tmp_path: Path, held_port: int, run_env: dict[str, str], service: str
) -> None:
    if service == "agent":
        args = ["agent", "--cache-dir", str(tmp_path / "cache"), "--cache-limit", "1G",
                "--shm-limit", "64M", "--shm-root", str(tmp_path / "shm")]  # fmt: skip
        (tmp_path / "shm").mkdir()
    else:
        args = ["coordinator", "--state", str(tmp_path / "state"), "--world", "1",
                "--num-samples", "100"]  # fmt: skip
    proc = subprocess.Popen(
        [sys.executable, "-m", "stoker.cli", *args, "--metrics-port", str(held_port)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=run_env,
    )  # fmt: skip
    try:
        seen = wait_line(proc, f"stoker {service}: serving")
        (rec,) = records(run_env)
        assert rec["pid"] == proc.pid and rec["role"] == service, seen
        assert not rec["address"].endswith(f":{held_port}")
        assert f"stoker_{service}_" in scrape(rec["address"])
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out
    assert records(run_env) == []


def test_doctor_takes_several_endpoints_after_one_flag(
    tmp_path: Path, run_env: dict[str, str]
) -> None:
    cmd = [sys.executable, "-m", "stoker.cli", "coordinator", "--world", "1",
           "--num-samples", "100", "--metrics-port", "0"]  # fmt: skip
    procs = [
        subprocess.Popen(
            [*cmd, "--state", str(tmp_path / f"s{i}")],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=run_env,
        )
        for i in range(2)
    ]
    try:
        lines = [wait_line(p, "stoker coordinator: serving")[-1] for p in procs]
        addresses = [line.split("metrics on ")[1].rstrip(")\n") for line in lines]
        doc = subprocess.run(
            [sys.executable, "-m", "stoker.cli", "doctor", "--endpoint", *addresses,
             "--window", "0.5", "--json"],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert doc.returncode == 0, doc.stderr
        d = json.loads(doc.stdout)
        assert d["bottleneck"] == "no-data"  # coordinators only: no rank reports batches
        dead = f"127.0.0.1:{free_port()}"
        top = subprocess.run(
            [sys.executable, "-m", "stoker.cli", "top", "--endpoint", *addresses,
             "--endpoint", dead, "--interval", "0.5", "--iterations", "1"],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert top.returncode == 0, top.stderr
        assert "2 endpoints" in top.stdout and f"unreachable: {dead}" in top.stdout
        # nothing recorded and nothing given: a clear error naming where it looked
        empty = {**run_env, "STOKER_RUNTIME_DIR": str(tmp_path / "nothing")}
        none = subprocess.run(
            [sys.executable, "-m", "stoker.cli", "doctor", "--window", "0.1"],
            capture_output=True, text=True, timeout=120, env=empty,
        )  # fmt: skip
        assert none.returncode == 2 and str(tmp_path / "nothing") in none.stderr
    finally:
        for p in procs:
            reap(p)


def test_a_metrics_endpoint_drops_half_sent_requests_and_keeps_scraping(
    tmp_path: Path, run_env: dict[str, str]
) -> None:
    (tmp_path / "shm").mkdir()
    proc = subprocess.Popen(
        [sys.executable, "-m", "stoker.cli", "agent", "--cache-dir", str(tmp_path / "cache"),
         "--cache-limit", "1G", "--shm-limit", "64M", "--shm-root", str(tmp_path / "shm"),
         "--metrics-port", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=run_env,
    )  # fmt: skip
    try:
        wait_line(proc, "stoker agent: serving")
        (rec,) = records(run_env)
        host, port = rec["address"].rsplit(":", 1)
        partial = [socket.create_connection((host, int(port)), timeout=60) for _ in range(20)]
        for s in partial:
            s.sendall(b"GET /metr")  # and nothing more
        assert "stoker_agent_" in scrape(rec["address"])  # served meanwhile
        for s in partial:  # each dropped by the server's deadline (10 s)
            s.settimeout(60)
            assert s.recv(65536) == b""
            s.close()
        flood = [socket.create_connection((host, int(port)), timeout=60) for _ in range(60)]
        for s in flood:
            s.sendall(b"GET /metr")
        closed = 0
        for s in flood[40:]:  # past the 32 served at once: closed unanswered, at once
            s.settimeout(5)
            try:
                closed += s.recv(65536) == b""
            except (TimeoutError, ConnectionResetError):
                pass
        assert closed >= 15
        for s in flood:
            s.close()
        assert proc.poll() is None
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
        assert "Traceback" not in out  # a stalled client is dropped without a word
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            proc.communicate(timeout=60)


def test_the_demo_trains_when_its_metrics_port_is_taken(
    tmp_path: Path, held_port: int, run_env: dict[str, str]
) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "stoker.cli", "demo", "--steps", "6", "--metrics-port",
         str(held_port), "--workdir", str(tmp_path / "demo")],
        capture_output=True, text=True, timeout=600, env=run_env,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert f"metrics port {held_port} is taken" in proc.stderr
    assert "exact resume" in proc.stdout and "OK" in proc.stdout


def test_port_zero_means_any_free_port_for_every_rank(
    run_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import stoker

    monkeypatch.setenv("STOKER_RUNTIME_DIR", run_env["STOKER_RUNTIME_DIR"])
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    batches = [{"tokens": [0]}] * 3
    assert list(stoker.Metered(batches, metrics_port=0)) == batches
    mine = [r for r in records(run_env) if r["pid"] == os.getpid()]
    assert len(mine) == 1, mine
    port = int(mine[0]["address"].rsplit(":", 1)[1])
    assert port > 1024  # a free port, not 0 + local rank
    assert "stoker_loader_batches_total" in scrape(mine[0]["address"])
