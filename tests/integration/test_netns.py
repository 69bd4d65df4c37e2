"""Five machines in Linux network namespaces: an HTTP origin (nginx), the standalone
coordinator, and three nodes of two gloo ranks each, every node with its own
cache directory (so its own node agent), one node behind a 4 Mbit/s link.

The job loses its coordinator (SIGKILL, restarted on the same address and
journal) mid-epoch and carries on; rank 0 saves its state; then node n1 dies,
then the rest of the job. It comes back on n0 and n2 (four ranks) from the
saved state, through a coordinator restored from the checkpoint, and runs two
epochs. Every sample of epoch 0 is trained exactly once across the two runs
(what does not divide by four carries into epoch 1), and the coordinator's
journal replays exactly the batches the ranks recorded.

Needs root (``ip netns``, veth, a bridge, ``tc``) and nginx; skips without them,
except that under ``CI`` a root run fails instead of skipping.
"""

from __future__ import annotations

import json
import os
import secrets
import select
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import pytest
from servers import NginxOrigin

from stoker.cache.paths import MARKER, AgentPaths
from stoker.coordinator import replay

from ._netns import Topology, tc_qdiscs, topology
from .helpers import Written, write_dataset

HERE = Path(__file__).parent
SEQ_LEN = 32
B = 4
LEASE = 32
PAUSE, SAVE, STOP = 3, 6, 8  # rank 0's steps: coordinator restart, saved state, crash
COORD_PORT = 7070
NODES = ("n0", "n1", "n2")
ROLES = {"origin": 2, "coord": 3, "n0": 10, "n1": 11, "n2": 12}
THROTTLE = ["tbf", "rate", "4mbit", "burst", "32kbit", "latency", "400ms"]


# --------------------------------------------------------------------------- fixtures


@pytest.fixture
def net() -> Iterator[Topology]:
    with topology(ROLES) as topo:
        yield topo


@pytest.fixture
def caches(net: Topology, tmp_path: Path) -> Iterator[dict[str, Path]]:
    """Each node's cache directory; their agents' memory tiers go at teardown."""
    dirs = {node: tmp_path / f"cache-{node}" for node in NODES}
    yield dirs
    net.kill_all()  # the agents first: they outlive the ranks that started them
    for d in dirs.values():
        shutil.rmtree(AgentPaths(d).shm, ignore_errors=True)


@pytest.fixture
def dataset(tmp_path: Path) -> Written:
    return write_dataset(
        tmp_path / "www" / "ds", num_docs=300, seed=23, block_tokens=512, blocks_per_file=4
    )


# --------------------------------------------------------------------------- processes


def tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError as exc:
        return f"<{exc}>"


class Lines:
    """A child's stdout, read line by line with deadlines (select on the pipe)."""

    def __init__(self, proc: subprocess.Popen[bytes], what: str, log: Path) -> None:
        assert proc.stdout is not None
        self.proc, self.what, self.log = proc, what, log
        self.fd = proc.stdout.fileno()
        self.buf = b""
        self.seen: list[str] = []

    def expect(self, prefix: str, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        while True:
            while b"\n" in self.buf:
                raw, self.buf = self.buf.split(b"\n", 1)
                line = raw.decode(errors="replace")
                self.seen.append(line)
                if line.startswith(prefix):
                    return line
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(
                    f"{self.what}: no line {prefix!r} within {timeout:.0f} s; stdout "
                    f"{self.seen[-5:]}; log:\n{tail(self.log)}"
                )
            ready, _, _ = select.select([self.fd], [], [], left)
            if ready:
                chunk = os.read(self.fd, 65536)
                if not chunk:
                    raise AssertionError(
                        f"{self.what} exited ({self.proc.wait()}) before {prefix!r}; "
                        f"stdout {self.seen[-5:]}; log:\n{tail(self.log)}"
                    )
                self.buf += chunk


def clean_env(**extra: str) -> dict[str, str]:
    drop = ("http_proxy", "https_proxy", "all_proxy", "no_proxy")
    env = {k: v for k, v in os.environ.items()
           if k.lower() not in drop and not k.startswith(("STOKER_", "TORCHELASTIC_"))}  # fmt: skip
    env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", **extra)
    return env


class Job:
    """The processes of the scenario, all in the topology's namespaces."""

    def __init__(self, net: Topology, tmp: Path, url: str, caches: dict[str, Path]) -> None:
        self.net, self.tmp, self.url, self.caches = net, tmp, url, caches
        self.logs = tmp / "logs"
        self.logs.mkdir()
        self.state_dir = tmp / "coordinator-state"
        self.token = secrets.token_urlsafe(24)
        self.token_file = tmp / "token"
        self.token_file.write_text(self.token + "\n")
        self.address = f"{net['coord'].address}:{COORD_PORT}"
        self.coordinators: list[subprocess.Popen[bytes]] = []

    def _open_log(self, name: str) -> IO[bytes]:
        return open(self.logs / name, "ab")

    def coordinator(self, world: int, restore: str | None = None) -> subprocess.Popen[bytes]:
        """Start the coordinator in "coord"; returns once it serves."""
        name = f"coordinator-{len(self.coordinators)}.log"
        extra = ["--restore", restore] if restore else []
        with self._open_log(name) as log:
            proc = self.net.popen(
                "coord",
                [sys.executable, "-m", "stoker.cli", "coordinator", "--state", str(self.state_dir),
                 "--world", str(world), "--dataset", self.url, "--seq-len", str(SEQ_LEN),
                 "--lease-size", str(LEASE), "--bind", self.address, "--timeout", "10",
                 "--token-file", str(self.token_file), *extra],
                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=log, env=clean_env(),
            )  # fmt: skip
        self.coordinators.append(proc)
        line = Lines(proc, "coordinator", self.logs / name).expect(
            "stoker coordinator: serving", 60
        )
        assert line.split("serving ")[1].split()[0] == self.address, line
        return proc

    def ranks(
        self, run: str, nodes: tuple[str, ...], master_port: int, args: dict[int, list[str]]
    ) -> list[subprocess.Popen[bytes]]:
        """Two ranks per node (rank r on nodes[r // 2]); rank r gets ``args[r]``."""
        world = 2 * len(nodes)
        out = self.tmp / run
        out.mkdir()
        procs = []
        for rank in range(world):
            node = nodes[rank // 2]
            env = clean_env(
                RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank % 2),
                LOCAL_WORLD_SIZE="2", MASTER_ADDR=self.net[nodes[0]].address,
                MASTER_PORT=str(master_port), GLOO_SOCKET_IFNAME="eth0",
                STOKER_COORDINATOR=self.address, STOKER_COORDINATOR_TOKEN=self.token,
            )  # fmt: skip
            argv = [sys.executable, str(HERE / "_train_rank.py"), "--dataset", self.url,
                    "--seq-len", str(SEQ_LEN), "--batch", str(B), "--lease-size", str(LEASE),
                    "--cache-dir", str(self.caches[node]), "--out", str(out / f"r{rank}.jsonl"),
                    *args.get(rank, [])]  # fmt: skip
            with self._open_log(f"{run}-r{rank}.log") as log:
                proc = self.net.popen(node, argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                      stderr=log, env=env)  # fmt: skip
            procs.append(proc)
        return procs


def steps(out: Path, world: int) -> dict[int, list[dict[str, Any]]]:
    return {
        r: [json.loads(line) for line in (out / f"r{r}.jsonl").read_text().splitlines()]
        for r in range(world)
    }


def replayed(state: Path) -> dict[tuple[int, int], list[list[int] | None]]:
    """What ``stoker replay`` prints (called in this process, which saves a Python
    start-up): the journal's batches by (epoch, rank), indexed by step - 1."""
    got: dict[tuple[int, int], list[list[int] | None]] = {}
    for b in replay.batches(str(state)):
        seq = got.setdefault((b.epoch, b.rank), [])
        assert b.step > len(seq), (b.epoch, b.rank, b.step)  # in order, never twice
        assert b.sample_ids is not None
        seq.extend([None] * (b.step - 1 - len(seq)))
        seq.append(b.sample_ids.tolist())
    return got


def kill(procs: list[subprocess.Popen[bytes]]) -> None:
    for p in procs:
        p.send_signal(signal.SIGKILL)
    for p in procs:
        assert p.wait(timeout=30) == -signal.SIGKILL


def sent_bytes(dev: str, netns: str | None = None) -> int:
    return sum(int(q.get("bytes", 0)) for q in tc_qdiscs(dev, netns) if q.get("kind") == "tbf")


# --------------------------------------------------------------------------- the test


def test_three_nodes_lose_the_coordinator_and_a_node_then_resume_on_two(
    net: Topology,
    caches: dict[str, Path],
    dataset: Written,
    nginx_bin: str,
    tmp_path: Path,
) -> None:
    n = dataset.num_samples(SEQ_LEN)
    assert n // 6 // B >= 3 * STOP  # epoch 0 of run 1 is far from over at the crash

    # n2 sits behind a slow link, both ways
    n2 = net["n2"]
    subprocess.run(["tc", "qdisc", "add", "dev", n2.veth, "root", *THROTTLE], check=True)
    subprocess.run(n2.cmd("tc", "qdisc", "add", "dev", "eth0", "root", *THROTTLE), check=True)
    for dev, ns in ((n2.veth, None), ("eth0", n2.netns)):
        (q,) = tc_qdiscs(dev, ns)
        assert q["kind"] == "tbf" and q["options"]["rate"] == 4_000_000 // 8, q

    origin = NginxOrigin(
        dataset.path.parent,
        nginx=nginx_bin,
        prefix=tmp_path / "nginx",
        host=net["origin"].address,
        command_prefix=net["origin"].cmd(),
    ).start()
    try:
        assert origin.pid in net["origin"].pids()  # it serves from its own machine
        run_job(net, caches, dataset, tmp_path, origin.url_for(dataset.path.name).rstrip("/"))
        served = origin.access_log()
        assert served and {r.status for r in served} <= {200, 206}, Counter(
            r.status for r in served
        )
    finally:
        origin.stop()


def run_job(
    net: Topology, caches: dict[str, Path], dataset: Written, tmp_path: Path, url: str
) -> None:
    n = dataset.num_samples(SEQ_LEN)
    job = Job(net, tmp_path, url, caches)
    state = tmp_path / "rank0-state.json"

    # ---- run 1: six ranks on three nodes ------------------------------------------
    first = job.coordinator(world=6)
    ranks = job.ranks(
        "run1", NODES, 29500,
        {r: ["--stop-at", str(STOP)] + (["--pause-at", str(PAUSE), "--save-at", str(SAVE),
                                         "--state", str(state)] if r == 0 else [])
         for r in range(6)},
    )  # fmt: skip
    lines = [Lines(p, f"run 1 rank {r}", job.logs / f"run1-r{r}.log") for r, p in enumerate(ranks)]
    for r, p in enumerate(ranks):
        assert p.pid in net[NODES[r // 2]].pids()  # each rank runs on its node
    assert lines[0].expect("paused", 240) == f"paused {PAUSE}"

    # the coordinator dies mid-epoch; rank 0 goes on into the outage, a new one takes over
    first.send_signal(signal.SIGKILL)
    assert first.wait(timeout=30) == -signal.SIGKILL
    assert net["coord"].pids() == []  # nothing of it is left on its machine
    assert ranks[0].stdin is not None
    ranks[0].stdin.write(b"go\n")
    ranks[0].stdin.flush()
    second = job.coordinator(world=6)

    for r, ln in enumerate(lines):
        assert ln.expect("stopped", 180) == f"stopped {STOP}", f"rank {r}"
    agents = {node: lock_holder(caches[node] / "agent.lock") for node in NODES}
    for node, pid in agents.items():  # each node's readers started its agent, on the node
        assert pid is not None and pid in net[node].pids(), (node, pid)
        assert b"stoker.cache.agent" in cmdline(pid)
        assert (caches[node] / MARKER).is_file()
    saved = json.loads(state.read_text())
    assert saved["mode"] == "coordinator" and saved["epoch"] == 0 and saved["batches"] == SAVE
    name = saved["checkpoint"]
    assert (job.state_dir / "checkpoints" / "job" / f"{name}.json").is_file()

    # node n1 dies, then the rest of the job, then its coordinator
    kill(ranks[2:4])
    kill(ranks[:2] + ranks[4:])
    second.send_signal(signal.SIGTERM)
    assert second.wait(timeout=30) == 0

    # ---- run 2: four ranks on n0 and n2, from rank 0's state ------------------------
    third = job.coordinator(world=4, restore=name)
    ranks2 = job.ranks(
        "run2",
        ("n0", "n2"),
        29501,
        {r: ["--resume", str(state), "--epochs", "2"] for r in range(4)},
    )
    deadline = time.monotonic() + 240
    for r, p in enumerate(ranks2):
        try:
            rc = p.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            rc = None
        assert rc == 0, f"run 2 rank {r}: exit {rc}; log:\n{tail(job.logs / f'run2-r{r}.log')}"

    # ---- what was trained -----------------------------------------------------------
    run1, run2 = steps(tmp_path / "run1", 6), steps(tmp_path / "run2", 4)
    for r in range(6):  # each rank took exactly STOP steps, all of epoch 0
        assert [s["step"] for s in run1[r]] == list(range(1, STOP + 1)), f"rank {r}"
        assert {s["epoch"] for s in run1[r]} == {0}
        assert all(len(s["ids"]) == B for s in run1[r])
    epoch0 = [i for r in run1 for s in run1[r] if s["step"] <= SAVE for i in s["ids"]]
    epoch0 += [i for r in run2 for s in run2[r] if s["epoch"] == 0 for i in s["ids"]]
    epoch1 = [i for r in run2 for s in run2[r] if s["epoch"] == 1 for i in s["ids"]]
    assert {s["epoch"] for r in run2 for s in run2[r]} == {0, 1}
    got = Counter(epoch0)
    assert got.most_common(1)[0][1] == 1, got.most_common(3)  # nothing twice in epoch 0
    assert set(got) <= set(range(n))
    missing = set(range(n)) - set(got)
    assert len(missing) < 4, len(missing)  # only what does not divide by four is left
    assert missing <= set(epoch1)  # and it comes in epoch 1
    again = Counter(epoch1) - Counter(missing)
    assert again.most_common(1)[0][1] == 1, again.most_common(3)  # nothing twice beyond that
    assert set(epoch1) <= set(range(n))
    assert len(set(range(n)) - set(epoch1)) < 4
    for e in (0, 1):  # every rank took the same number of steps in each epoch
        counts = {sum(s["epoch"] == e for s in run2[r]) for r in range(4)}
        assert len(counts) == 1 and counts != {0}, (e, counts)

    # the journal (across the coordinator's crash and the restore) replays those batches
    third.send_signal(signal.SIGTERM)
    assert third.wait(timeout=30) == 0
    want: dict[tuple[int, int], list[list[int] | None]] = {}
    for r in range(6):
        want[(0, r)] = [s["ids"] for s in run1[r] if s["step"] <= SAVE]
    for r in range(4):
        want[(0, r)] += [s["ids"] for s in run2[r] if s["epoch"] == 0]
        want[(1, r)] = [s["ids"] for s in run2[r] if s["epoch"] == 1]
    assert replayed(job.state_dir) == want

    # ---- the machines ---------------------------------------------------------------
    for node in NODES:  # run 2 read through the same agents (n1's idles on)
        assert lock_holder(caches[node] / "agent.lock") == agents[node], node
        assert list((caches[node] / "blocks").rglob("*.rec")), node
    # what n2's agent fetched reached it through the throttled link
    fetched = sum(p.stat().st_size for p in (caches["n2"] / "blocks").rglob("*.rec"))
    assert sent_bytes(net["n2"].veth) >= fetched > 0
    assert sent_bytes("eth0", net["n2"].netns) > 0  # and its requests left through one


def lock_holder(path: Path) -> int | None:
    """The pid holding a lock on ``path`` (from /proc/locks), None if nobody does."""
    st = path.stat()
    dev = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    for line in Path("/proc/locks").read_text().splitlines():
        fields = line.split()
        if "->" not in fields and len(fields) >= 6 and fields[5] == dev:
            return int(fields[4])
    return None


def cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""
