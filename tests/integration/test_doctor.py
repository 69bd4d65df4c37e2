"""`stoker doctor` against real jobs with a bottleneck induced for real: a healthy run, a
cache smaller than the working set, decode-bound workers, an expensive transform in torch
DataLoader workers, one slow DataLoader worker, one slowed rank (its storage
through a rate-limited origin) in a gloo job, and a mixture's source behind a
rate-limited origin. Each job is a real process serving its
metrics; the doctor is the real CLI scraping them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from .helpers import Written, reap, write_dataset

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from servers import free_port

JOB = Path(__file__).with_name("_doctor_job.py")


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Written:
    root = tmp_path_factory.mktemp("doctor")
    return write_dataset(root / "ds", num_docs=1500, seed=8, block_tokens=4096, blocks_per_file=8,
                         max_len=600)  # fmt: skip


class Jobs:
    def __init__(self) -> None:
        self.procs: list[subprocess.Popen[str]] = []

    def start(self, *args: str, env: dict[str, str] | None = None) -> tuple[int, subprocess.Popen]:
        port = free_port()
        proc = subprocess.Popen(
            [sys.executable, str(JOB), "--metrics-port", str(port), *args],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            env={**os.environ, **(env or {})},
        )  # fmt: skip
        self.procs.append(proc)
        return port, proc

    @staticmethod
    def ready(proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None
        seen = []
        for line in proc.stdout:
            seen.append(line)
            if line.strip() == "ready":
                return
        raise AssertionError("job did not start:\n" + "".join(seen))

    def close(self) -> None:
        for p in self.procs:
            reap(p)


@pytest.fixture
def jobs() -> Iterator[Jobs]:
    j = Jobs()
    yield j
    j.close()


def doctor(*ports: int, window: float = 3.0) -> dict:
    args = [a for p in ports for a in ("--endpoint", f"127.0.0.1:{p}")]
    out = subprocess.run(
        [sys.executable, "-m", "stoker.cli", "doctor", *args, "--window", str(window), "--json"],
        capture_output=True, text=True, check=True, timeout=120,
    ).stdout  # fmt: skip
    return dict(json.loads(out))


def test_a_healthy_run_is_gpu_bound(dataset: Written, jobs: Jobs) -> None:
    # a 100 ms step, and a worker that produces a batch in a small fraction of that
    port, proc = jobs.start("--dataset", str(dataset.path), "--step", "0.1", "--workers", "1")
    jobs.ready(proc)
    d = doctor(port)
    assert d["bottleneck"] == "none", d
    # `stoker top` shows the same job: its rank, a throughput, a stall share
    top = subprocess.run(
        [sys.executable, "-m", "stoker.cli", "top", "--endpoint", f"127.0.0.1:{port}",
         "--interval", "1", "--iterations", "2"],
        capture_output=True, text=True, check=True, timeout=60,
    ).stdout  # fmt: skip
    frames = top.split("stoker top")
    assert len(frames) == 3  # two screens
    row = [line.split() for line in frames[-1].splitlines() if line.strip().startswith("0 ")]
    assert row and float(row[0][1].replace(",", "")) > 0  # rank 0's tokens/s
    assert "unreachable" not in top


@pytest.fixture(scope="module")
def big_blocks(tmp_path_factory: pytest.TempPathFactory) -> Written:
    """~1.3M tokens in 20 blocks of 2^16 tokens."""
    root = tmp_path_factory.mktemp("doctor-big-blocks")
    return write_dataset(root / "ds", num_docs=4400, seed=9, block_tokens=1 << 16, max_len=600)


def test_decode_bound_workers_are_named(big_blocks: Written, jobs: Jobs) -> None:
    # no compute at all and one worker decoding every block itself: the worker is the limit.
    # By construction, not by timing: the worker holds 2 of the 20 blocks and a batch is 512
    # samples of 17 tokens spread over the whole dataset, so it decodes a 2^16-token block
    # for nearly every sample (tens of ms of CPU a batch) while the main process copies 512 x 17
    # tokens out (well under 1 ms). The worker's time between batches (its send, a wake-up
    # of the main process, a slot back) is then a few percent of its time even when the
    # machine is loaded, against the doctor's 85% busy threshold.
    port, proc = jobs.start(
        "--dataset", str(big_blocks.path), "--workers", "1", "--seq-len", "16", "--batch", "512",
        "--arena-blocks", "2",
    )  # fmt: skip
    jobs.ready(proc)
    d = doctor(port)
    assert d["bottleneck"] == "cpu", d
    assert "worker busy share" in " ".join(d["evidence"])


def test_an_expensive_transform_in_dataloader_workers_is_named(
    dataset: Written, jobs: Jobs
) -> None:
    # torch's DataLoader (through stoker.Metered), one worker whose transform burns 3 ms of
    # CPU per sample: the worker's busy share (reported through its file) names the CPU
    port, proc = jobs.start(
        "--dataset", str(dataset.path), "--torch", "--workers", "1", "--transform-ms", "3",
        "--step", "0.002",
    )  # fmt: skip
    jobs.ready(proc)
    d = doctor(port)
    assert d["bottleneck"] == "cpu", d
    assert "worker busy share" in " ".join(d["evidence"])


def test_one_slow_dataloader_worker_is_named(dataset: Written, jobs: Jobs) -> None:
    # two DataLoader workers; only worker 1's share of the data is costly (5 ms of CPU a
    # sample). The loader takes batches from the workers in turn, so the rank waits for
    # worker 1 while worker 0 idles ahead of it
    port, proc = jobs.start(
        "--dataset", str(dataset.path), "--torch", "--workers", "2", "--transform-ms", "5",
        "--slow-worker", "1", "--step", "0.002",
    )  # fmt: skip
    jobs.ready(proc)
    d = doctor(port)
    assert (d["bottleneck"], d["rank"], d["worker"]) == ("straggler", "0", "1"), d


def test_a_cache_smaller_than_the_working_set_is_named(
    dataset: Written, jobs: Jobs, tmp_path: Path
) -> None:
    # the node agent (run by hand, with its metrics on) may keep 3 decoded blocks in memory
    # and 2 records on disk; the shuffle window spans the whole dataset, so blocks are
    # evicted and fetched again all the time
    block = 4096 * 9  # decoded bytes of a block (tokens, padded, then one flag byte each)
    cache = tmp_path / "cache"
    agent_port = free_port()
    agent = subprocess.Popen(
        [sys.executable, "-m", "stoker.cli", "agent", "--cache-dir", str(cache),
         "--shm-limit", str(3 * block), "--cache-limit", str(2 * block),
         "--metrics-port", str(agent_port)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        assert agent.stdout is not None
        for line in agent.stdout:
            if "metrics on" in line:
                break
        port, proc = jobs.start(
            "--dataset", str(dataset.path), "--cache-dir", str(cache), "--workers", "1",
            "--step", "0.002", "--window-shards", "64", "--seq-len", "512",
        )  # fmt: skip
        jobs.ready(proc)
        d = doctor(port, agent_port)  # the rank's endpoint and its node agent's
        assert d["bottleneck"] == "cache", d
    finally:
        jobs.close()  # first: a reader whose agent is gone would start one of its own
        agent.terminate()  # a clean exit removes its shared memory
        agent.wait(timeout=30)
        reap(agent)


def test_one_slowed_rank_is_named(
    dataset: Written, jobs: Jobs, nginx_origin, tmp_path: Path
) -> None:
    origin = nginx_origin(dataset.path.parent, slow_rate=8 * 1024)
    master = free_port()
    ports = []
    for rank, url in enumerate(
        [str(dataset.path), origin.url_for("ds", via="slow"), str(dataset.path)]
    ):
        env = {"RANK": str(rank), "WORLD_SIZE": "3", "MASTER_ADDR": "127.0.0.1",
               "MASTER_PORT": str(master)}  # fmt: skip
        port, proc = jobs.start("--dataset", url, "--workers", "1", "--step", "0.01", env=env)
        ports.append((port, proc))
    for _, proc in ports:
        jobs.ready(proc)
    d = doctor(*(p for p, _ in ports))
    assert d["bottleneck"] == "straggler", d["evidence"]
    assert d["rank"] == "1"


def test_a_throttled_storage_link_is_named(
    dataset: Written, nginx_bin: str, tmp_path: Path
) -> None:
    """The origin in one network namespace, the rank in another, the rank's link shaped by
    tc tbf to 1 Mbit/s: the rank's workers wait on storage."""
    from servers import NginxOrigin

    from ._netns import NetnsUnavailable, Topology, sh

    if os.geteuid() != 0:
        pytest.skip("needs root: network namespaces (ip netns), veth, a bridge, tc")
    net = Topology({"origin": 2, "node": 10})
    try:
        net.create()
    except NetnsUnavailable as exc:
        if os.environ.get("CI"):
            pytest.fail(f"CI is set and we are root, but {exc}", pytrace=False)
        pytest.skip(f"network namespaces unavailable: {exc}")
    try:
        origin = NginxOrigin(
            dataset.path.parent, nginx=nginx_bin, prefix=tmp_path / "nginx",
            host=net["origin"].address, command_prefix=net["origin"].cmd(),
        ).start()  # fmt: skip
        # traffic to the node leaves the bridge through the node's veth: shape it there
        sh("tc", "qdisc", "add", "dev", net["node"].veth, "root",
           "tbf", "rate", "1mbit", "burst", "16kbit", "latency", "500ms")  # fmt: skip
        port = 9100
        job = net.popen(
            "node",
            [sys.executable, str(JOB), "--metrics-port", str(port), "--dataset",
             origin.url_for("ds"), "--workers", "1", "--step", "0.005"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
        Jobs.ready(job)
        out = subprocess.run(
            net["node"].cmd(sys.executable, "-m", "stoker.cli", "doctor", "--endpoint",
                            f"127.0.0.1:{port}", "--window", "4", "--json"),
            capture_output=True, text=True, check=True, timeout=120,
        ).stdout  # fmt: skip
        d = json.loads(out)
        assert d["bottleneck"] == "storage", d["evidence"]
        origin.stop()
    finally:
        problems = net.destroy()
    assert not problems, problems


def test_a_mixtures_source_on_slow_storage_is_named(
    tmp_path_factory: pytest.TempPathFactory, nginx_bin: str, jobs: Jobs, tmp_path: Path
) -> None:
    """Three sources, two on local disk and one behind a rate-limited HTTP origin (nginx's
    limit_rate): the doctor names that source, not just "storage"."""
    from servers import NginxOrigin

    root = tmp_path_factory.mktemp("mixdoctor")
    local = {n: write_dataset(root / n, num_docs=400, seed=30 + i, block_tokens=4096, max_len=600)
             for i, n in enumerate(("web", "book"))}  # fmt: skip
    write_dataset(root / "code", num_docs=400, seed=40, block_tokens=4096, max_len=600)
    with NginxOrigin(root, nginx=nginx_bin, prefix=tmp_path / "nginx", slow_rate=2048) as o:
        mixture = {
            "web": [str(local["web"].path), 0.5],
            "code": [o.url_for("code", via="slow"), 0.3],
            "book": [str(local["book"].path), 0.2],
        }
        port, proc = jobs.start("--mixture", json.dumps(mixture), "--workers", "1",
                                "--step", "0.005")  # fmt: skip
        Jobs.ready(proc)
        d = doctor(port, window=4.0)
    assert (d["bottleneck"], d["source"]) == ("source", "code"), d
    assert "source code" in d["summary"]
