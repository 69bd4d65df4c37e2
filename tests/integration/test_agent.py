"""The node agent with real processes, a real origin (nginx) and SIGKILL."""

from __future__ import annotations

import gc
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
import warnings
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import stoker
from stoker.cache import connection
from stoker.cache.agent import remove_tree
from stoker.cache.client import AgentClient
from stoker.cache.layout import map_block
from stoker.cache.paths import AgentPaths

from .helpers import Written, assert_exactly_once, check_samples, unbatch, write_dataset

SEQ_LEN = 32
READER = Path(__file__).with_name("_agent_reader.py")


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Written:
    """~25k tokens in 48 blocks of 512 (12 data files)."""
    root = tmp_path_factory.mktemp("agent-root")
    return write_dataset(root / "ds", num_docs=160, seed=7, block_tokens=512, blocks_per_file=4)


@pytest.fixture(scope="module")
def second_dataset(tmp_path_factory: pytest.TempPathFactory) -> Written:
    root = tmp_path_factory.mktemp("agent-root-2")
    return write_dataset(root / "ds2", num_docs=60, seed=8, block_tokens=256, blocks_per_file=3)


class Agents:
    """Starts ``stoker agent`` processes and kills every agent of its cache dirs at the end."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen[str]] = []
        self.dirs: list[Path] = []
        self.clients: list[AgentClient] = []

    def client(self, cache_dir: Path, **kwargs: Any) -> AgentClient:
        """An AgentClient (no autostart unless asked), closed at the end."""
        kwargs.setdefault("autostart", False)
        return self.own(AgentClient(cache_dir, **kwargs))

    def own(self, client: AgentClient) -> AgentClient:
        """Close ``client`` at the end."""
        self.clients.append(client)
        return client

    @staticmethod
    def stats(cache_dir: Path) -> dict[str, Any]:
        """The agent's stats, over a connection of their own."""
        client = AgentClient(cache_dir, autostart=False)
        try:
            return client.stats()
        finally:
            client.close()

    def start(
        self, cache_dir: Path, *args: str, expect_ready: bool = True
    ) -> subprocess.Popen[str]:
        self.dirs.append(cache_dir)
        cmd = [sys.executable, "-m", "stoker.cache.agent", "--cache-dir", str(cache_dir)]
        if "--cache-limit" not in args:
            cmd += ["--cache-limit", "1G"]
        proc = subprocess.Popen(
            [*cmd, *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        self.procs.append(proc)
        if expect_ready:
            self.wait_line(proc, "serving")  # the agent prints this once it listens
        return proc

    @staticmethod
    def wait_line(proc: subprocess.Popen[str], text: str) -> str:
        """Read the agent's output up to the first line containing ``text``."""
        assert proc.stdout is not None
        seen = []
        while True:
            line = proc.stdout.readline()
            if not line:  # the agent exited
                raise AssertionError(f"agent never printed {text!r}:\n{''.join(seen)}")
            seen.append(line)
            if text in line:
                return line

    def pid_of(self, cache_dir: Path) -> int:
        return int(AgentPaths(cache_dir).lock.read_text().split()[0])

    def close(self) -> None:
        for client in self.clients:
            client.close()
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
            if proc.stdout is not None:
                proc.stdout.close()
        for d in self.dirs:
            try:
                pid = self.pid_of(d)
                os.kill(pid, signal.SIGKILL)  # one a reader started
            except (OSError, ValueError):
                pass
            else:
                _wait_gone(pid)  # and reap it, if this process started it
            remove_tree(
                AgentPaths(d).shm
            )  # what a killed agent left (its successor would clean it)


def block_requests(origin) -> Counter[tuple[str, str | None]]:
    return Counter((r.path, r.range) for r in origin.access_log() if "/data/" in r.path)


def read_records(out: Path) -> list[dict[str, Any]]:
    """Lines a reader recorded (a line cut short by SIGKILL was never consumed)."""
    records = []
    for line in out.read_text().splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            pass
    return records


def reader(cfg: dict[str, Any], **popen: Any) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(READER), json.dumps(cfg)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **popen,
    )


def finish(proc: subprocess.Popen[str], timeout: float = 120) -> None:
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, f"reader failed ({proc.returncode}):\n{out}\n{err}"
    assert out.strip().endswith("done")


def epoch_set(ds: stoker.TokenDataset) -> list[int]:
    return list(range(ds.num_samples))


def test_four_processes_fetch_each_block_once(
    serve_dir, dataset: Written, tmp_path: Path, agents: Agents
) -> None:
    origin, url = serve_dir(dataset.path)
    cache = tmp_path / "cache"
    agents.start(cache)
    origin.clear_access_log()
    procs = []
    for rank in range(4):
        cfg = dict(url=url, cache_dir=str(cache), out=str(tmp_path / f"r{rank}.jsonl"), rank=rank,
                   world=4, seq_len=SEQ_LEN, batch_size=4)  # fmt: skip
        procs.append(reader(cfg))
    for p in procs:
        finish(p)
    ids = [
        i for r in range(4) for rec in read_records(tmp_path / f"r{r}.jsonl") for i in rec["ids"]
    ]
    n = dataset.num_samples(SEQ_LEN)
    assert len(ids) == len(set(ids)) == n // 4 * 4  # the n % 4 left over carry to epoch 1
    assert set(ids) <= set(range(n))

    requests = block_requests(origin)
    needed = dataset.blocks_needed(SEQ_LEN)
    assert len(requests) == needed, f"{len(requests)} distinct block reads, {needed} blocks"
    assert set(requests.values()) == {1}, "a block was fetched more than once"
    stats = agents.stats(cache)
    assert stats["remote_requests"] == needed
    assert stats["decodes"] == needed  # decoded once for all four readers
    assert stats["memory_hits"] > 0
    assert stats["pinned_blocks"] == 0  # every reader released or exited


def test_tokens_through_the_agent_are_exact(
    serve_dir, dataset: Written, tmp_path: Path, agents: Agents
) -> None:
    _, url = serve_dir(dataset.path)
    cache = tmp_path / "cache"
    agents.start(cache)
    client = agents.client(cache)
    ds = stoker.TokenDataset(url, SEQ_LEN, batch_size=4, seed=3, agent=client, arena_blocks=4)
    for num_workers in (0, 2):
        samples = unbatch(stoker.TokenLoader(ds, num_workers))
        assert_exactly_once(check_samples(dataset, SEQ_LEN, samples), ds.num_samples)
    assert client.stats()["memory_evictions"] == 0  # small arena: the agent still holds them all
    # two connections get the same shared-memory file, mapped read-only
    other = agents.client(cache)
    other.open(url, None, ds.manifest.dataset_id)
    a, b = client.get(ds.manifest.dataset_id, 2), other.get(ds.manifest.dataset_id, 2)
    assert a.path == b.path and a.pinned and b.pinned
    toks, starts = map_block(a.path, int(a.tokens), ds.manifest.np_dtype)
    assert not toks.flags.writeable and not starts.flags.writeable
    assert a.path in Path("/proc/self/maps").read_text()
    lo, hi = dataset.block_range(2)
    np.testing.assert_array_equal(toks, dataset.stream[lo:hi])
    np.testing.assert_array_equal(starts, np.flatnonzero(dataset.starts[lo:hi]))


def opened(
    serve_dir, dataset: Written, tmp_path: Path, agents: Agents
) -> tuple[AgentClient, str, str]:
    """``dataset`` served, an agent started and a client that opened it on that agent:
    ``(client, url, dataset id)``."""
    _, url = serve_dir(dataset.path)
    cache = tmp_path / "cache"
    agents.start(cache)
    client = agents.client(cache)
    key = dataset.manifest.dataset_id
    client.open(url, None, key)
    return client, url, key


def test_a_release_goes_with_the_next_get_or_on_its_own_when_flushed(
    serve_dir, dataset: Written, tmp_path: Path, agents: Agents
) -> None:
    client, _, ds = opened(serve_dir, dataset, tmp_path, agents)
    assert client.get(ds, 0).pinned and client.get(ds, 1).pinned
    client.release(ds, [0])
    assert client.stats()["pinned_blocks"] == 2  # waits for the next get
    assert client.get(ds, 2).pinned
    assert client.stats()["pinned_blocks"] == 2  # 0 went with it: 1 and 2 are held
    client.release(ds, [1, 2])
    client.flush_releases()
    assert client.stats()["pinned_blocks"] == 0
    # past UNPIN_BATCH waiting, they go on their own
    for b in range(3):
        assert client.get(ds, b).pinned
    client.UNPIN_BATCH = 3
    client.release(ds, [0, 1])
    assert client.stats()["pinned_blocks"] == 3
    client.release(ds, [2])
    assert client.stats()["pinned_blocks"] == 0
    client.close()


def test_a_forked_child_closes_its_copy_of_the_connection_and_makes_its_own(
    serve_dir, dataset: Written, tmp_path: Path, agents: Agents
) -> None:
    client, _, ds = opened(serve_dir, dataset, tmp_path, agents)
    assert client.get(ds, 0).pinned
    pid = os.fork()
    if pid == 0:  # the child: its calls go over a connection of its own
        code = 1
        try:
            left: list[object] = []
            sys.unraisablehook = left.append  # an unclosed socket's warning lands here
            got = client.get(ds, 1).pinned
            gc.collect()
            code = 0 if got and not left else 2 if left else 3
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, "the child left its copy unclosed (2) or failed"
    # the parent's own connection was not closed by the child
    assert client.get(ds, 2).pinned
    assert client.stats()["pinned_blocks"] == 2  # 0 and 2: the child's pin went with it
    client.close()


def test_a_sample_is_held_when_every_block_it_spans_is(
    serve_dir, dataset: Written, tmp_path: Path, agents: Agents
) -> None:
    # seq_len 1100 over blocks of 512 tokens: sample 0 (tokens 0-1100) spans blocks 0-2
    client, url, key = opened(serve_dir, dataset, tmp_path, agents)
    ds = stoker.TokenDataset(url, 1100, agent=client)
    holds = ds.holds()
    assert holds is not None and not holds(np.array([0, 1])).any()
    for b in (0, 2):
        assert client.get(key, b).pinned
    holds = ds.holds()  # (what the agent holds now)
    assert holds is not None and holds(np.array([0])).tolist() == [False]  # block 1 missing
    assert client.get(key, 1).pinned
    holds = ds.holds()
    assert holds is not None and holds(np.array([0, 1])).tolist() == [True, False]  # 1: 1100-2200
    client.close()


def test_reader_started_agent_and_warm_restart(
    serve_dir, dataset: Written, tmp_path: Path, agents: Agents
) -> None:
    origin, url = serve_dir(dataset.path)
    cache = tmp_path / "cache"
    agents.dirs.append(cache)
    cfg = dict(url=url, cache_dir=str(cache), out=str(tmp_path / "a.jsonl"), rank=0, world=1,
               seq_len=SEQ_LEN, batch_size=8, autostart=True)  # fmt: skip
    finish(reader(cfg))  # no agent ran: the reader starts one
    pid = agents.pid_of(cache)
    shm = AgentPaths(cache).shm
    assert any(shm.glob("*.tok"))
    os.kill(pid, signal.SIGTERM)
    _wait_gone(pid)
    assert not shm.exists()  # a clean stop leaves nothing in shared memory
    origin.clear_access_log()
    agents.start(cache)  # same directory: the disk tier is adopted
    cfg["out"] = str(tmp_path / "b.jsonl")
    finish(reader(cfg))
    assert block_requests(origin) == Counter()
    stats = agents.stats(cache)
    assert stats["disk_hits"] == dataset.blocks_needed(SEQ_LEN) and stats["remote_requests"] == 0
    for out in ("a.jsonl", "b.jsonl"):
        ids = [i for rec in read_records(tmp_path / out) for i in rec["ids"]]
        assert_exactly_once(ids, dataset.num_samples(SEQ_LEN))


def test_a_reader_reads_storage_itself_while_the_agent_it_started_starts(
    serve_dir, dataset: Written, tmp_path: Path, agents: Agents
) -> None:
    _, url = serve_dir(dataset.path)
    cache = tmp_path / "cache"
    agents.dirs.append(cache)
    client = agents.client(cache, autostart=True)
    ds = dataset.manifest.dataset_id
    client.open(url, None, ds)  # starts the agent and does not wait for it
    got = client.get(ds, 0)
    assert not got.pinned and not got.record  # read it yourself: the agent is starting
    client.plan(ds, [1, 2])
    client.hand_over(ds)  # waits for the agent, which loads block 0 for the node
    assert 0 in client.holdings(ds)
    assert client.get(ds, 1).pinned
    client.release(ds, [1])
    assert client.stats()["decodes"] >= 2 and not client.falling_back
    # hand_over loads what was read meanwhile and lets each go again, the last one too
    client._skipped[ds] = {3, 4}
    client.flush_releases()
    client.hand_over(ds)
    assert client.stats()["pinned_blocks"] == 0
    client.close()


def test_a_closing_reader_starts_no_agent_when_its_agent_died(
    serve_dir, dataset: Written, tmp_path: Path, agents: Agents
) -> None:
    _, url = serve_dir(dataset.path)
    cache = tmp_path / "cache"
    agents.dirs.append(cache)
    client = agents.client(cache, autostart=True)
    ds = dataset.manifest.dataset_id
    client.open(url, None, ds)  # starts the agent
    client.get(ds, 0)  # (read here while it starts)
    client.plan(ds, [1, 2, 3])
    client.hand_over(ds)  # waits for it
    assert client.get(ds, 1).pinned
    client.release(ds, [1])  # (waits for the next get, or a flush)
    pid = agents.pid_of(cache)
    os.kill(pid, signal.SIGKILL)
    _wait_gone(pid)
    client._skipped[ds] = {2}  # as a reader that read while an agent started
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        client.flush_releases()  # a reader's close: releases, then what it read itself
        client.hand_over(ds)
    assert agents.pid_of(cache) == pid  # no agent started for them (the dead one's lock)
    with pytest.raises(OSError):
        connection.connect(AgentPaths(cache), 1.0, 1.0)
    assert not caught and not client.falling_back  # no warning, no fall-back to storage
    # reading again starts one, as after any agent's death
    client.get(ds, 2)
    client.holdings(ds)  # (waits for the agent it started)
    assert agents.pid_of(cache) != pid


def _wait_gone(pid: int, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        try:
            os.waitpid(pid, os.WNOHANG)  # reap it if it is our child
        except ChildProcessError:
            pass
        time.sleep(0.02)
    raise AssertionError(f"process {pid} still alive after {timeout} s")


def test_agent_killed_mid_epoch(
    serve_dir, dataset: Written, tmp_path: Path, agents: Agents
) -> None:
    _, url = serve_dir(dataset.path)
    cache = tmp_path / "cache"
    agent = agents.start(cache)
    out = tmp_path / "r.jsonl"
    cfg = dict(url=url, cache_dir=str(cache), out=str(out), rank=0, world=1, seq_len=SEQ_LEN,
               batch_size=4, arena_blocks=3, autostart=True, pause_after=20)  # fmt: skip
    proc = reader(cfg)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "paused"
    agent.send_signal(signal.SIGKILL)
    agent.wait()
    assert AgentPaths(cache).socket.exists()  # stale socket left behind
    proc.stdin.write("go\n")  # type: ignore[union-attr]
    proc.stdin.flush()  # type: ignore[union-attr]
    finish(proc)
    records = read_records(out)
    ids = [i for rec in records for i in rec["ids"]]
    assert_exactly_once(ids, dataset.num_samples(SEQ_LEN))
    new_pid = agents.pid_of(cache)
    assert new_pid != agent.pid  # the reader started a fresh agent and went on
    assert agents.stats(cache)["memory_misses"] > 0


def test_reader_killed_mid_epoch_releases_pins_and_resumes(
    serve_dir, dataset: Written, tmp_path: Path, agents: Agents
) -> None:
    _, url = serve_dir(dataset.path)
    cache = tmp_path / "cache"
    agents.start(cache)
    out = tmp_path / "r.jsonl"
    cfg = dict(url=url, cache_dir=str(cache), out=str(out), rank=0, world=1, seq_len=SEQ_LEN,
               batch_size=4, arena_blocks=6, pause_after=15)  # fmt: skip
    proc = reader(cfg)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "paused"
    client = agents.client(cache)
    assert client.stats()["pinned_blocks"] > 0
    proc.kill()
    proc.communicate()  # reaps it and closes its pipes
    _wait_for(lambda: client.stats()["clients"] == 1, "the killed reader's connection to close")
    stats = client.stats()
    assert stats["pinned_blocks"] == 0 and stats["pins_released_on_disconnect"] > 0
    records = read_records(out)
    assert len(records) == 15
    cfg.update(state=records[-1]["state"], pause_after=None)
    finish(reader(cfg))
    ids = [i for rec in read_records(out) for i in rec["ids"]]
    assert_exactly_once(ids, dataset.num_samples(SEQ_LEN))


def _wait_for(cond, what: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def test_corrupt_cached_record_is_refetched(
    serve_dir, dataset: Written, tmp_path: Path, agents: Agents
) -> None:
    origin, url = serve_dir(dataset.path)
    cache = tmp_path / "cache"
    agent = agents.start(cache)
    ds = stoker.TokenDataset(url, SEQ_LEN, batch_size=4, agent=agents.client(cache))
    list(stoker.TokenLoader(ds))
    agent.terminate()
    agent.wait()
    records = sorted((AgentPaths(cache).blocks / dataset.manifest.dataset_id).glob("*.rec"))
    victim = records[3]
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0xFF
    victim.write_bytes(bytes(data))
    origin.clear_access_log()
    agents.start(cache)
    client = agents.client(cache)
    ds = stoker.TokenDataset(url, SEQ_LEN, batch_size=4, seed=5, agent=client)
    samples = unbatch(stoker.TokenLoader(ds))
    assert_exactly_once(check_samples(dataset, SEQ_LEN, samples), ds.num_samples)
    requests = block_requests(origin)
    assert sum(requests.values()) == 1  # only the corrupt block, refetched once
    assert client.stats()["checksum_refetches"] == 1


def test_two_datasets_through_one_agent(
    serve_dir, dataset: Written, second_dataset: Written, tmp_path: Path, agents: Agents
) -> None:
    _, url1 = serve_dir(dataset.path)
    _, url2 = serve_dir(second_dataset.path)
    cache = tmp_path / "cache"
    agents.start(cache)
    client = agents.client(cache)
    ds1 = stoker.TokenDataset(url1, SEQ_LEN, batch_size=4, agent=client)
    ds2 = stoker.TokenDataset(url2, SEQ_LEN, batch_size=4, agent=client)
    it1, it2 = iter(stoker.TokenLoader(ds1)), iter(stoker.TokenLoader(ds2))
    got: dict[int, list[dict]] = {1: [], 2: []}
    live = {1: it1, 2: it2}
    while live:  # interleaved, so both are open on the agent at once
        for k in list(live):
            b = next(live[k], None)
            if b is None:
                del live[k]
                continue
            got[k] += unbatch([b])
    assert_exactly_once(check_samples(dataset, SEQ_LEN, got[1]), ds1.num_samples)
    assert_exactly_once(check_samples(second_dataset, SEQ_LEN, got[2]), ds2.num_samples)
    stats = client.stats()
    assert stats["decodes"] == dataset.blocks_needed(SEQ_LEN) + second_dataset.blocks_needed(
        SEQ_LEN
    )


def test_memory_tier_too_small_falls_back_inline(
    serve_dir, dataset: Written, tmp_path: Path, agents: Agents
) -> None:
    _, url = serve_dir(dataset.path)
    cache = tmp_path / "cache"
    agents.start(cache, "--shm-limit", "64")  # smaller than one decoded block
    client = agents.client(cache)
    ds = stoker.TokenDataset(url, SEQ_LEN, batch_size=4, agent=client)
    with pytest.warns(UserWarning, match="no room in shared memory") as caught:
        samples = unbatch(stoker.TokenLoader(ds))
    assert len([w for w in caught if "no room" in str(w.message)]) == 1  # once, not per block
    assert_exactly_once(check_samples(dataset, SEQ_LEN, samples), ds.num_samples)
    stats = client.stats()
    assert stats["inline_fallbacks"] >= dataset.blocks_needed(SEQ_LEN)
    assert stats["memory_blocks"] == 0


@pytest.mark.skipif(os.geteuid() != 0, reason="mounts a tmpfs (needs root)")
@pytest.mark.parametrize("full", ["shm", "disk"])
def test_full_filesystems_degrade_with_a_warning(
    serve_dir, dataset: Written, tmp_path: Path, agents: Agents, full: str
) -> None:
    """A real ENOSPC: the tier lives on a tmpfs far smaller than its configured limit."""
    _, url = serve_dir(dataset.path)
    mnt = tmp_path / "tiny"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mnt)], check=True)
    try:
        if full == "shm":
            cache, args = tmp_path / "cache", ["--shm-root", str(mnt), "--shm-limit", "1G"]
        else:
            cache, args = mnt / "cache", ["--cache-limit", "1G"]
        proc = agents.start(cache, *args)
        client = agents.client(cache)
        ds = stoker.TokenDataset(url, SEQ_LEN, batch_size=4, agent=client)
        if full == "shm":  # the reader is told, once, and decodes those blocks itself
            with pytest.warns(UserWarning, match="no room in shared memory"):
                samples = unbatch(stoker.TokenLoader(ds))
        else:
            samples = unbatch(stoker.TokenLoader(ds))
        assert_exactly_once(check_samples(dataset, SEQ_LEN, samples), ds.num_samples)
        proc.terminate()
        log, _ = proc.communicate(timeout=30)
        assert log.count("WARNING") == 1, log  # one warning, not one per block
        assert ("memory tier" if full == "shm" else "disk tier") in log
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_second_agent_refuses_and_stale_lock_is_harmless(tmp_path: Path, agents: Agents) -> None:
    cache = tmp_path / "cache"
    first = agents.start(cache)
    second = agents.start(cache, expect_ready=False)
    out, _ = second.communicate(timeout=30)
    assert second.returncode == 3 and "already owns" in out and str(first.pid) in out
    first.kill()
    first.wait()  # SIGKILL: lock file and socket stay behind
    third = agents.start(cache)
    assert third.poll() is None and agents.pid_of(cache) == third.pid


def test_foreign_directory_is_refused(tmp_path: Path, agents: Agents) -> None:
    cache = tmp_path / "mine"
    cache.mkdir()
    (cache / "thesis.tex").write_text("precious")
    proc = agents.start(cache, expect_ready=False)
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 2 and "not a stoker cache" in out
    assert (cache / "thesis.tex").read_text() == "precious"


def test_metrics_endpoint(serve_dir, dataset: Written, tmp_path: Path, agents: Agents) -> None:
    _, url = serve_dir(dataset.path)
    cache = tmp_path / "cache"
    proc = agents.start(cache, "--metrics-port", "0")
    line = agents.wait_line(proc, "metrics on")
    port = int(line.rsplit(":", 1)[1].split("/")[0])
    ds = stoker.TokenDataset(url, SEQ_LEN, batch_size=4, agent=agents.client(cache))
    list(stoker.TokenLoader(ds))
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    values = {
        line.split(" ")[0]: float(line.split(" ")[1])
        for line in text.splitlines()
        if line and not line.startswith("#")
    }
    m = dataset.manifest
    needed = dataset.blocks_needed(SEQ_LEN)
    spans = [int(e["token_bytes"]) + int(e["bounds_bytes"]) for e in dataset.index()[:needed]]
    assert values["stoker_agent_remote_read_bytes_total"] == sum(spans)
    hits = values['stoker_agent_memory_requests_total{result="hit"}']
    misses = values['stoker_agent_memory_requests_total{result="miss"}']
    # every block was asked for at least once; a block prefetched before it was asked
    # for counts as a hit (timing decides which), so only the sum is fixed
    assert hits + misses >= needed
    assert values["stoker_agent_decodes_total"] == needed
    assert 0 < values["stoker_agent_prefetches_total"] <= needed
    assert values["stoker_agent_remote_latency_seconds_count"] == needed
    assert values["stoker_agent_pinned_bytes"] == 0
    assert m.num_blocks >= needed


def test_paths_differ_per_user_and_directory(tmp_path: Path, monkeypatch) -> None:
    a = AgentPaths(tmp_path / "a")
    b = AgentPaths(tmp_path / "b")
    assert a.shm != b.shm
    monkeypatch.setattr(os, "getuid", lambda: 4242)
    assert AgentPaths(tmp_path / "a").shm != a.shm and "4242" in AgentPaths(tmp_path / "a").shm.name
    np.testing.assert_equal(str(a.socket).startswith(str(tmp_path)), True)


def test_request_rate_toward_the_origin_is_capped(
    serve_dir, dataset: Written, tmp_path: Path, agents: Agents
) -> None:
    origin, url = serve_dir(dataset.path)
    cache = tmp_path / "cache"
    agents.start(cache, "--max-rate", "20", "--max-remote", "2")
    origin.clear_access_log()
    ds = stoker.TokenDataset(url, SEQ_LEN, batch_size=4, agent=agents.client(cache))
    assert_exactly_once([i for b in stoker.TokenLoader(ds) for i in b["sample_id"].tolist()],
                        ds.num_samples)  # fmt: skip
    log = sorted((r for r in origin.access_log() if "/data/" in r.path), key=lambda r: r.msec)
    assert len(log) == dataset.blocks_needed(SEQ_LEN)
    # a bucket of 20 then 20 per second: request k starts no earlier than (k - 20) / 20 s
    # after the first (nginx logs the end of a request; these requests take ~1 ms)
    for k in range(20, len(log)):
        assert log[k].msec - log[0].msec >= (k - 20) / 20 - 0.05, (k, log[k].msec - log[0].msec)


@pytest.mark.skipif(os.geteuid() != 0, reason="starts an agent as another user (needs root)")
def test_agents_of_two_users_do_not_collide(tmp_path: Path, agents: Agents) -> None:
    import pwd

    nobody = pwd.getpwnam("nobody")
    real = Path(sys.executable).resolve()
    if any(not (d.stat().st_mode & 0o001) for d in real.parents) or not real.stat().st_mode & 0o001:
        pytest.skip(f"the interpreter {real} is not reachable by other users")
    theirs = Path(tempfile.mkdtemp(prefix="stoker-nobody-"))
    os.chown(theirs, nobody.pw_uid, nobody.pw_gid)
    mine = tmp_path / "cache"
    agents.start(mine)
    other = subprocess.Popen(
        [sys.executable, "-m", "stoker.cache.agent", "--cache-dir", str(theirs / "cache"),
         "--cache-limit", "1G"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        user=nobody.pw_uid, group=nobody.pw_gid, cwd="/",
    )  # fmt: skip
    agents.procs.append(other)
    agents.dirs.append(theirs / "cache")
    try:
        Agents.wait_line(other, "serving")
        p_mine, p_theirs = AgentPaths(mine), AgentPaths(theirs / "cache", uid=nobody.pw_uid)
        assert p_mine.shm != p_theirs.shm and str(nobody.pw_uid) in p_theirs.shm.name
        assert p_theirs.shm.stat().st_uid == nobody.pw_uid
        assert (p_theirs.socket.stat().st_mode & 0o777) == 0o600  # private to its user
        assert (p_theirs.shm.stat().st_mode & 0o777) == 0o700
        assert agents.stats(mine)["pid"] != other.pid
    finally:
        other.kill()
        other.wait()
        remove_tree(AgentPaths(theirs / "cache", uid=nobody.pw_uid).shm)
        shutil.rmtree(theirs, ignore_errors=True)


def test_an_agent_config_as_the_cache_starts_the_agent_with_its_settings(
    dataset: Written, tmp_path: Path, agents: Agents
) -> None:
    cache = tmp_path / "cache"
    agents.dirs.append(cache)  # the agent this dataset starts is killed at the end
    config = stoker.AgentConfig(
        str(cache), cache_limit=1 << 30, shm_limit=64 << 20, idle_exit=120.0, metrics_port=None
    )
    ds = stoker.TokenDataset(str(dataset.path), SEQ_LEN, batch_size=4, cache=config)
    assert ds.agent is not None and ds.agent.config == config
    agents.own(ds.agent)
    ids = [i for b in stoker.TokenLoader(ds) for i in b["sample_id"].tolist()]
    assert sorted(ids) == list(range(ds.num_samples))
    stats = agents.stats(cache)
    assert (stats["memory_limit"], stats["disk_limit"]) == (64 << 20, 1 << 30)  # as configured
