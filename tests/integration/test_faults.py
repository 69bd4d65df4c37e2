"""Nothing hangs: a stopped node agent, and loader workers stopped or killed, with real
processes and real signals. (scripts/faults runs the whole kill-and-stop matrix.)"""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import subprocess
import sys
import time
import zlib
from pathlib import Path
from typing import Any

import pytest

import stoker
from stoker.cache.client import AgentClient
from stoker.coordinator.client import CoordinatorClient

from .helpers import Written, assert_exactly_once, check_samples, reap, unbatch, write_dataset
from .test_agent import Agents
from .test_coordinator import Coordinators

SEQ_LEN = 32
JOB = Path(__file__).with_name("_fault_job.py")
FALLBACK = "reads blocks from storage itself"


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Written:
    """~25k tokens in 48 blocks of 512."""
    root = tmp_path_factory.mktemp("faults")
    return write_dataset(root / "ds", num_docs=160, seed=7, block_tokens=512, blocks_per_file=4)


@pytest.fixture(scope="module")
def long_epoch(tmp_path_factory: pytest.TempPathFactory) -> Written:
    """~300k tokens: an epoch of about 2,400 batches of 4, ten times a coordinator-fed
    rank's confirm window (256 batches), so its workers cannot have read the whole epoch
    ahead (and be done) by the time a test signals one of them."""
    root = tmp_path_factory.mktemp("faults-long")
    return write_dataset(root / "ds", num_docs=2000, seed=7, block_tokens=512, blocks_per_file=4)


@pytest.fixture
def coordinators():
    c = Coordinators()
    yield c
    c.close()


def job(cfg: dict[str, Any]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(JOB), json.dumps(cfg)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_paused(proc: subprocess.Popen[str], k: int) -> list[int]:
    """Wait for ``paused k``; the job's worker pids."""
    assert proc.stdout is not None
    line = proc.stdout.readline().split()
    assert line[:2] == ["paused", str(k)], f"{line}\n{proc.stderr.read() if proc.stderr else ''}"
    return [int(p) for p in line[2:]]


def go(proc: subprocess.Popen[str]) -> None:
    assert proc.stdin is not None
    proc.stdin.write("go\n")
    proc.stdin.flush()


def recorded(out: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in out.read_text().splitlines()]


def gone(pid: int) -> bool:
    """The process no longer exists (or is a zombie no one reaped yet)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rpartition(")")[2].split()[0] in ("Z", "X")


def _crc(tokens: Any) -> int:
    return zlib.crc32(tokens.astype("int64").tobytes())


# -- 1. the node agent stopped -------------------------------------------------------------


@pytest.mark.timeout(180)
def test_a_stopped_agent_is_bypassed_and_used_again_once_continued(
    dataset: Written, tmp_path: Path, agents: Agents
) -> None:
    cache = tmp_path / "cache"
    agent = agents.start(cache)
    out = tmp_path / "r.jsonl"
    cfg = dict(dataset=str(dataset.path), seq_len=SEQ_LEN, batch_size=4, out=str(out),
               cache_dir=str(cache), arena_blocks=3, pause_at=[10, 100], crc=True,
               agent=dict(autostart=False, connect_timeout=1.0, request_timeout=1.0,
                          retry_interval=0.0))  # fmt: skip
    proc = job(cfg)
    try:
        wait_paused(proc, 10)
        agent.send_signal(signal.SIGSTOP)  # wedged: its socket still accepts connections
        go(proc)
        wait_paused(proc, 100)  # read on through storage while the agent is stopped
        agent.send_signal(signal.SIGCONT)
        client = agents.client(cache)
        before = client.stats()
        # the reader's first connection, the one it left pending while the agent was stopped
        # (accepted before this client's, which came later), and this client's
        assert before["connections"] >= 3
        go(proc)
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            agent.send_signal(signal.SIGCONT)
        reap(proc)
    assert proc.returncode == 0 and stdout.split()[-2] == "done", stderr
    assert stderr.count(FALLBACK) == 1, stderr  # one warning
    rows = [(i, c) for rec in recorded(out) for i, c in zip(rec["ids"], rec["crc"], strict=True)]
    ids = [i for i, _ in rows]
    n = dataset.num_samples(SEQ_LEN)
    assert sorted(ids) == list(range(n))  # the epoch, exactly once
    for sid, crc in rows:  # and every sample's tokens right
        assert crc == _crc(dataset.sample(sid, SEQ_LEN)[0]), f"sample {sid}"
    after = client.stats()
    used = ("memory_hits", "memory_misses")
    assert sum(after[k] for k in used) > sum(before[k] for k in used)  # the agent again


@pytest.mark.timeout(60)
def test_a_connection_to_a_stopped_agent_times_out_and_is_used_once_it_answers(
    dataset: Written, tmp_path: Path, agents: Agents
) -> None:
    cache = tmp_path / "cache"
    agent = agents.start(cache)
    ds = stoker.TokenDataset(str(dataset.path), SEQ_LEN, agent=False)
    dataset_id = ds.manifest.dataset_id
    client = agents.client(cache, connect_timeout=0.5, retry_interval=0.0)
    agent.send_signal(signal.SIGSTOP)
    try:
        with pytest.warns(RuntimeWarning, match="did not answer a connection within 0.5 s"):
            client.open(str(dataset.path), None, dataset_id)
        got = client.get(dataset_id, 1)  # no waiting now: read it yourself
        assert not got.pinned and not got.record and client.falling_back
    finally:
        agent.send_signal(signal.SIGCONT)
    deadline = time.monotonic() + 30
    while client.falling_back:  # each request looks at the pending connection, never waits
        assert time.monotonic() < deadline, "the continued agent was never used again"
        time.sleep(0.01)
        got = client.get(dataset_id, 1)
    assert got.pinned  # through the agent again (the dataset reopened on the new connection)
    lo, hi = dataset.block_range(1)
    assert got.tokens == hi - lo


def _take(it: Any, k: int) -> list[dict[str, Any]]:
    return unbatch(next(it) for _ in range(k))


@pytest.mark.timeout(120)
def test_a_killed_agent_without_autostart_falls_back_and_a_new_one_is_used(
    dataset: Written, tmp_path: Path, agents: Agents
) -> None:
    cache = tmp_path / "cache"
    agent = agents.start(cache)
    client = agents.client(cache, connect_timeout=1.0, retry_interval=0.0)
    ds = stoker.TokenDataset(str(dataset.path), SEQ_LEN, batch_size=4, agent=client,
                             arena_blocks=3)  # fmt: skip
    it = iter(stoker.TokenLoader(ds))
    samples = _take(it, 20)
    agent.kill()
    agent.wait()
    with pytest.warns(RuntimeWarning, match=FALLBACK):
        samples += _take(it, 40)  # read on from storage
    assert client.falling_back
    with pytest.raises(stoker.AgentError, match="is not running"):
        client.stats()  # nothing to fall back to
    agents.start(cache)  # a new agent on the directory (as a user would)
    samples += unbatch(it)
    assert not client.falling_back
    assert client.stats()["memory_misses"] > 0  # the new agent served the rest
    assert_exactly_once(check_samples(dataset, SEQ_LEN, samples), ds.num_samples)


@pytest.mark.timeout(120)
def test_an_agent_refusing_the_connection_is_bypassed(
    dataset: Written, tmp_path: Path, agents: Agents
) -> None:
    cache = tmp_path / "cache"
    agents.start(cache, "--max-connections", "1")
    holder = agents.client(cache)
    holder.stats()  # holds the agent's one connection
    client = agents.client(cache)
    ds = stoker.TokenDataset(str(dataset.path), SEQ_LEN, batch_size=4, agent=client)
    with pytest.warns(RuntimeWarning, match="refused the connection"):
        samples = unbatch(stoker.TokenLoader(ds))
    assert_exactly_once(check_samples(dataset, SEQ_LEN, samples), ds.num_samples)
    assert holder.stats()["memory_misses"] == 0  # every block came from storage


def test_agent_client_timeouts_are_checked() -> None:
    for bad in (dict(timeout=0), dict(connect_timeout=-1), dict(request_timeout=0)):
        name = next(iter(bad))
        with pytest.raises(stoker.ConfigError, match=name):
            AgentClient("/nonexistent", **bad)
    with pytest.raises(stoker.ConfigError, match="retry_interval"):
        AgentClient("/nonexistent", retry_interval=-1)


# -- 2. loader workers stopped or killed -----------------------------------------------------


def _workers() -> list[int]:
    return sorted(p.pid for p in multiprocessing.active_children() if p.name.startswith("stoker"))


def _signal_a_worker_mid_epoch(loader: stoker.TokenLoader, sig: int) -> tuple[int, list[int]]:
    """Iterate ``loader``; after 3 batches send ``sig`` to its worker 1. The worker pids and
    the number of batches before the WorkerError (which must come)."""
    pids: list[int] = []
    got = 0
    with pytest.raises(stoker.WorkerError) as info:
        for got, _ in enumerate(loader, 1):
            if got == 3:
                pids = _workers()
                assert len(pids) == 2
                by_name = {p.name: p.pid for p in multiprocessing.active_children()}
                victim = next(pid for name, pid in by_name.items() if name.endswith("-1"))
                os.kill(victim, sig)
    assert pids, f"the epoch ended after {got} batches without reaching the signal"
    err = info.value
    assert err.worker == 1 and err.pid == victim
    assert f"loader worker 1 (pid {victim})" in str(err)
    if sig == signal.SIGSTOP:
        assert "not responding" in str(err) and "2 s" in str(err), str(err)
    else:
        assert "killed by SIGKILL" in str(err), str(err)
    return victim, pids


@pytest.mark.timeout(120)
@pytest.mark.parametrize("sig", [signal.SIGSTOP, signal.SIGKILL], ids=["stop", "kill"])
def test_a_static_loader_names_a_stopped_or_killed_worker_and_leaves_none(
    dataset: Written, sig: int
) -> None:
    ds = stoker.TokenDataset(str(dataset.path), SEQ_LEN, batch_size=4)
    loader = stoker.TokenLoader(ds, 2, prefetch=2, timeout=2.0)
    _, pids = _signal_a_worker_mid_epoch(loader, sig)
    assert [p for p in pids if not gone(p)] == []  # a stopped worker too: SIGKILL after grace


@pytest.mark.timeout(180)
@pytest.mark.parametrize("sig", [signal.SIGSTOP, signal.SIGKILL], ids=["stop", "kill"])
def test_a_coordinator_fed_loader_names_a_stopped_or_killed_worker_and_leaves_none(
    long_epoch: Written, tmp_path: Path, coordinators: Coordinators, sig: int
) -> None:
    # (a short epoch could be read and confirmed whole before batch 3 is handed out: both
    # workers done, the signal too late to be seen; a CI run on a loaded machine saw it)
    dataset = long_epoch
    _, address = coordinators.start(
        "--state", str(tmp_path / "state"), "--world", "1", "--dataset", str(dataset.path),
        "--seq-len", str(SEQ_LEN), "--lease-size", "40",
    )  # fmt: skip
    ds = stoker.TokenDataset(str(dataset.path), SEQ_LEN, batch_size=4)
    loader = stoker.TokenLoader(
        ds, 2, prefetch=2, timeout=2.0, coordinator=CoordinatorClient(address)
    )
    _, pids = _signal_a_worker_mid_epoch(loader, sig)
    assert [p for p in pids if not gone(p)] == []


@pytest.mark.timeout(180)
@pytest.mark.parametrize("fed", ["static", "coordinator"])
def test_a_job_with_a_stopped_worker_fails_with_a_worker_error_and_exits(
    long_epoch: Written, tmp_path: Path, coordinators: Coordinators, fed: str
) -> None:
    # the long epoch: a short one could be read whole while the job waits at batch 3, the
    # stopped worker already done (a CI run saw the coordinator-fed job exit 0)
    dataset = long_epoch
    cfg: dict[str, Any] = dict(dataset=str(dataset.path), seq_len=SEQ_LEN, batch_size=4,
                               out=str(tmp_path / "r.jsonl"), num_workers=2, timeout=2.0,
                               pause_at=[3])  # fmt: skip
    if fed == "coordinator":
        _, cfg["coordinator"] = coordinators.start(
            "--state", str(tmp_path / "state"), "--world", "1", "--seq-len", str(SEQ_LEN),
            "--dataset", str(dataset.path), "--lease-size", "40",
        )  # fmt: skip
    proc = job(cfg)
    victim = 0
    try:
        workers = wait_paused(proc, 3)
        victim = workers[-1]
        os.kill(victim, signal.SIGSTOP)
        go(proc)
        _, stderr = proc.communicate(timeout=120)  # exits: no stopped worker holds it up
    finally:
        if victim and not gone(victim):
            os.kill(victim, signal.SIGKILL)
        reap(proc)
    assert proc.returncode == 3, stderr
    assert f"(pid {victim}) is not responding" in stderr and "2 s" in stderr, stderr
    assert [p for p in workers if not gone(p)] == []


def _deaf_worker(conn: Any) -> None:
    """A worker that ignores SIGTERM and never reads its pipe."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    conn.send("ready")
    signal.pause()


@pytest.mark.timeout(60)
def test_stopping_workers_escalates_to_sigkill_for_one_deaf_to_sigterm() -> None:
    from stoker.loader.supervise import stop

    ctx = multiprocessing.get_context("fork")
    conns, procs = [], []
    for _ in range(2):
        parent, child = ctx.Pipe(duplex=True)
        proc = ctx.Process(target=_deaf_worker, args=(child,), daemon=True)
        proc.start()
        child.close()
        assert parent.recv() == "ready"  # its SIGTERM handler is in place
        conns.append(parent)
        procs.append(proc)
    os.kill(procs[1].pid, signal.SIGSTOP)  # and one stopped as well
    stop(conns, procs)
    assert [p.exitcode for p in procs] == [-signal.SIGKILL, -signal.SIGKILL]
    assert all(gone(p.pid) for p in procs)


def test_worker_error_lives_in_errors_and_is_still_importable_from_fast() -> None:
    from stoker.errors import StokerError, WorkerError
    from stoker.loader.fast import WorkerError as FromFast

    assert FromFast is WorkerError is stoker.WorkerError
    assert issubclass(WorkerError, StokerError) and issubclass(WorkerError, RuntimeError)


def test_fault_counts_are_what_was_handed_out() -> None:
    from ._faults import tally

    assert tally([[0, 1], [2]], range(4)) == (1, 0)  # 3 lost
    assert tally([[0, 1], [1, 2, 3]], range(4)) == (0, 1)  # 1 twice
    assert tally([[0, 1, 2, 3]], range(4)) == (0, 0)
    assert tally([[0, 1, 2, 3, 9]], range(4)) == (0, 1)  # not of the epoch


@pytest.mark.timeout(300)
def test_the_fault_script_prints_a_cell_and_its_counts() -> None:
    root = Path(__file__).resolve().parents[2]
    run = subprocess.run(
        ["bash", str(root / "scripts" / "faults"), "worker-kill"],
        capture_output=True, text=True, timeout=280, cwd=root,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    row = next(line.split() for line in run.stdout.splitlines() if line.startswith("worker"))
    assert row[:4] == ["worker", "KILL", "0", "0"], run.stdout
    bad = subprocess.run(["bash", str(root / "scripts" / "faults"), "nothing-such"],
                         capture_output=True, text=True, timeout=60, cwd=root)  # fmt: skip
    assert bad.returncode == 2 and "unknown cells" in bad.stderr
