"""The torchrun recipe as written (deploy/torchrun/train-node.sh running
``python -m stoker.train``) on three "nodes" (network namespaces on a bridge), two
gloo ranks each, the origin (nginx) on a fourth behind a throttled link: the nodes
meet through torchrun's c10d rendezvous, rank 0 starts the coordinator and the others
find it through torchrun's store, each node reads through its own agent, and rank 0
checkpoints every few steps to a directory all nodes reach.

Past a checkpoint, node n1's torchrun and both its ranks are SIGKILLed; the job fails
on the other nodes. The recipe started again on n0 and n2 alone (four ranks, a new
rendezvous) resumes from that checkpoint and finishes the epoch. Every sample of the
epoch is trained once across the two runs, counting of the first run only the steps its
checkpoint holds (but the few left that do not divide among the four ranks, which open
the next epoch); every rank trained each step the checkpoint holds, a full batch each,
and takes as many steps as the others in the second run; and each node fetches a block
from the origin at most once over both runs (the second reads through the same agents).

Needs root (``ip netns``, veth, a bridge, ``tc``) and nginx; skips without them,
except that under ``CI`` a root run fails instead of skipping.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from servers import NginxOrigin

from stoker.cache.paths import AgentPaths

from ._netns import Topology, kill_pids, topology
from .helpers import write_dataset
from .test_netns import clean_env, cmdline, lock_holder, tail

pytestmark = [pytest.mark.netns, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
NODES = ("n0", "n1", "n2")
SEQ_LEN, B = 32, 4
SAVE = 5  # rank 0 checkpoints every SAVE steps
KILL = SAVE + 1  # n1 dies once every rank has trained this many steps (past the save)
THROTTLE = ["tbf", "rate", "16mbit", "burst", "64kbit", "latency", "400ms"]
Rows = dict[int, list[dict[str, Any]]]


def test_the_torchrun_recipe_survives_a_node_and_resumes_on_two_nodes(
    nginx_bin: str, tmp_path: Path
) -> None:
    dataset = write_dataset(
        tmp_path / "www" / "ds", num_docs=80, seed=23, block_tokens=512, blocks_per_file=4
    )
    n = dataset.num_samples(SEQ_LEN)
    assert n // 6 // B >= 2 * KILL  # the epoch is far from over when n1 dies
    caches = {node: tmp_path / f"cache-{node}" for node in NODES}
    ckpt = tmp_path / "ckpt"
    with topology({"origin": 2, "n0": 10, "n1": 11, "n2": 12}) as net:
        origin_host = net["origin"]
        subprocess.run(["tc", "qdisc", "add", "dev", origin_host.veth, "root", *THROTTLE],
                       check=True)  # fmt: skip
        origin = NginxOrigin(
            dataset.path.parent,
            nginx=nginx_bin,
            prefix=tmp_path / "nginx",
            host=origin_host.address,
            command_prefix=origin_host.cmd(),
        ).start()
        try:
            url = origin.url_for(dataset.path.name).rstrip("/")
            job = Recipe(net, tmp_path, url, caches, ckpt)

            # ---- run 1: six ranks on three nodes, until n1 dies past a checkpoint --
            first = job.start("run1", NODES, 29400)
            job.wait_until(
                "run1",
                f"step-{SAVE:09d} saved and every rank at step {KILL}",
                lambda: (
                    latest(ckpt) == f"step-{SAVE:09d}"
                    and len(steps := job.steps("run1")) == 6
                    and all(len(rows) >= KILL for rows in steps.values())
                ),
                first,
            )
            ranks = children(first["n1"].pid)
            assert len(ranks) == 2, ranks  # n1's torchrun runs its two ranks
            assert all(b"stoker.train" in cmdline(p) for p in ranks), ranks
            os.kill(first["n1"].pid, signal.SIGKILL)  # torchrun first: it restarts nothing
            assert kill_pids(lambda: [p for p in ranks if running(p)]) == []
            assert first["n1"].wait(timeout=30) == -signal.SIGKILL
            for node in ("n0", "n2"):  # the others' torchrun see the job fail and stop
                failed = first[node].wait(timeout=120)
                assert failed != 0, f"{node}: {failed}\n{job.log('run1', node)}"
            agents = {node: lock_holder(caches[node] / "agent.lock") for node in NODES}
            # nothing of run 1 is left but the nodes' agents (which outlive their ranks)
            assert kill_pids(lambda: job.leftovers(agents)) == []

            saved = latest(ckpt)
            assert saved == f"step-{SAVE:09d}"  # (n1 died before rank 0's next save)
            assert sorted(p.name for p in ckpt.iterdir()) == ["LATEST", saved]

            # ---- run 2: four ranks on n0 and n2, from that checkpoint ----------------
            second = job.start("run2", ("n0", "n2"), 29401)
            deadline = time.monotonic() + 240
            for node, p in second.items():
                try:
                    code = p.wait(timeout=max(1.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    code = None
                assert code == 0, f"run 2 {node}: exit {code}\n{job.log('run2', node)}"
            served = origin.access_log()
            for node in NODES:  # run 2 read through run 1's agents (n1's idled on)
                assert agents[node] is not None and agents[node] in net[node].pids(), node
                assert lock_holder(caches[node] / "agent.lock") == agents[node], node
        finally:
            origin.stop()
            net.kill_all()  # (the agents outlive the ranks that started them)
            for d in caches.values():
                shutil.rmtree(AgentPaths(d).shm, ignore_errors=True)

    logs = "".join(
        (tmp_path / f"run2-{node}.log").read_text(errors="replace") for node in ("n0", "n2")
    )
    assert f"stoker.train: resumed at step {SAVE} from {ckpt / saved}" in logs

    # ---- what was trained -----------------------------------------------------------
    run1, run2 = job.steps("run1"), job.steps("run2")
    assert sorted(run1) == list(range(6)) and sorted(run2) == list(range(4))
    on_n1 = [r for r in run1 if job.where["run1"][r] == "n1"]
    assert len(on_n1) == 2, job.where["run1"]
    for r, rows in run1.items():  # every rank trained the steps the checkpoint holds
        assert [s["step"] for s in rows[:SAVE]] == list(range(1, SAVE + 1)), f"rank {r}"
        assert all(len(s["ids"]) == B for s in rows[:SAVE]), f"rank {r}"
    held = [i for rows in run1.values() for s in rows[:SAVE] for i in s["ids"]]
    lost = {i for rows in run1.values() for s in rows[SAVE:] for i in s["ids"]}
    again = [i for rows in run2.values() for s in rows for i in s["ids"]]
    count = {len(rows) for rows in run2.values()}
    assert len(count) == 1 and count != {0}, count  # as many steps each
    for r, rows in run2.items():  # going on from the checkpoint's step
        assert [s["step"] for s in rows] == list(range(SAVE + 1, SAVE + 1 + len(rows))), r
    ids = held + again
    # every sample of the epoch once, but for what of the rest does not divide among
    # the four ranks (it opens the next epoch)
    assert len(set(ids)) == len(ids) and set(ids) <= set(range(n))
    rest = n - len(held)
    assert len(again) == rest - rest % 4
    # the steps trained after the checkpoint were trained again
    assert lost and len(lost - set(again)) <= rest % 4
    # the finished job's checkpoint replaced the one it resumed from
    end = f"step-{SAVE + count.pop():09d}"
    assert sorted(p.name for p in ckpt.iterdir()) == ["LATEST", end]
    assert latest(ckpt) == end

    # ---- the origin -----------------------------------------------------------------
    nodes = {net[node].address for node in NODES}
    data = [r for r in served if "/data/" in r.path]
    assert data and {r.client for r in data} <= nodes and {r.status for r in data} <= {200, 206}
    fetched = Counter((r.client, r.path, r.range) for r in data)
    assert max(fetched.values()) == 1, fetched.most_common(3)  # a block once a node at most


class Recipe:
    """deploy/torchrun/train-node.sh on the nodes of a job: each node's log, and each
    rank's steps (``--record``) in a file that names the node it ran on."""

    def __init__(
        self, net: Topology, tmp: Path, url: str, caches: dict[str, Path], ckpt: Path
    ) -> None:
        self.net, self.tmp, self.url, self.caches, self.ckpt = net, tmp, url, caches, ckpt
        self.rendezvous = net["n0"].address
        self.where: dict[str, dict[int, str]] = {}  # by run: the node of each rank
        (tmp / "tmp").mkdir()

    def start(
        self, run: str, nodes: tuple[str, ...], port: int
    ) -> dict[str, subprocess.Popen[bytes]]:
        procs = {}
        for node in nodes:
            env = clean_env(
                PATH=f"{Path(sys.executable).parent}:/usr/sbin:/usr/bin:/sbin:/bin",
                NNODES=str(len(nodes)), NPROC_PER_NODE="2",
                RDZV_ENDPOINT=f"{self.rendezvous}:{port}", RDZV_ID=f"netns-recipe-{run}",
                DATASET=self.url, CACHE_DIR=str(self.caches[node]), CHECKPOINT=str(self.ckpt),
                LOCAL_ADDR=self.net[node].address, GLOO_SOCKET_IFNAME="eth0",
                # (the namespaces share the host name: n0 is told it hosts the
                # rendezvous, as a node whose address is on a second network is)
                RDZV_CONF="is_host=1" if node == "n0" else "is_host=0",
                # (torchrun's and a killed coordinator's files stay with the test's)
                TMPDIR=str(self.tmp / "tmp"),
            )  # fmt: skip
            argv = ["bash", str(ROOT / "deploy" / "torchrun" / "train-node.sh"),
                    "--seq-len", str(SEQ_LEN), "--batch-size", str(B), "--num-workers", "0",
                    "--lease-size", "32", "--save-every", str(SAVE),
                    "--record", str(self.tmp / f"{run}-{node}-rank-{{rank}}.jsonl")]  # fmt: skip
            with open(self.tmp / f"{run}-{node}.log", "wb") as log:
                procs[node] = self.net.popen(node, argv, env=env, stdout=log, stderr=log)
        return procs

    def log(self, run: str, node: str) -> str:
        return tail(self.tmp / f"{run}-{node}.log")

    def steps(self, run: str) -> Rows:
        """Each rank's steps so far (the lines written whole)."""
        got: Rows = {}
        where = self.where.setdefault(run, {})
        for f in self.tmp.glob(f"{run}-*-rank-*.jsonl"):
            node, rank = f.name[len(run) + 1 : -len(".jsonl")].split("-rank-")
            lines = f.read_text().split("\n")[:-1]
            got[int(rank)] = [json.loads(x) for x in lines]
            where[int(rank)] = node
        return got

    def wait_until(
        self,
        run: str,
        what: str,
        ready: Callable[[], bool],
        procs: dict[str, subprocess.Popen[bytes]],
    ) -> None:
        """Poll ``ready`` until it holds; fails when a node's torchrun exits first, or
        after 240 s."""
        deadline = time.monotonic() + 240
        while not ready():
            for node, p in procs.items():
                assert p.poll() is None, f"{node} exited ({p.returncode}) before {what}:\n" + (
                    self.log(run, node)
                )
            assert time.monotonic() < deadline, f"no {what} within 240 s"
            time.sleep(0.05)

    def leftovers(self, agents: dict[str, int | None]) -> list[int]:
        """The processes running on the nodes but their agents."""
        keep = set(agents.values())
        return [p for node in NODES for p in self.net[node].pids() if p not in keep and running(p)]


def latest(ckpt: Path) -> str | None:
    try:
        return (ckpt / "LATEST").read_text().strip()
    except FileNotFoundError:
        return None


def children(pid: int) -> list[int]:
    """The processes ``pid`` started (whichever of its threads started them)."""
    tasks = Path(f"/proc/{pid}/task").iterdir()
    return sorted(int(x) for t in tasks for x in (t / "children").read_text().split())


def running(pid: int) -> bool:
    """Whether ``pid`` exists and has not exited (a zombie has)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"
