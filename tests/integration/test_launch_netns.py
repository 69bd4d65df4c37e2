"""The torchrun recipe as written (deploy/torchrun/train-node.sh running
``python -m stoker.train``) on three "nodes" (network namespaces on a bridge), two
gloo ranks each, the origin (nginx) on a fourth behind a throttled link: the nodes
meet through torchrun's c10d rendezvous, rank 0 starts the coordinator and the others
find it through torchrun's store, each node reads through its own agent. Every sample
of the epoch is trained once (but the few that do not divide among the ranks, which
open the next epoch), every rank takes as many steps, and each node fetches a block
from the origin at most once.

Needs root (``ip netns``, veth, a bridge, ``tc``) and nginx; skips without them,
except that under ``CI`` a root run fails instead of skipping.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from servers import NginxOrigin

from stoker.cache.paths import AgentPaths

from ._netns import topology
from .helpers import write_dataset
from .test_netns import clean_env, tail

pytestmark = [pytest.mark.netns, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
NODES = ("n0", "n1", "n2")
SEQ_LEN, B = 32, 4
THROTTLE = ["tbf", "rate", "16mbit", "burst", "64kbit", "latency", "400ms"]


def test_the_torchrun_recipe_trains_an_epoch_once_on_three_nodes(
    nginx_bin: str, tmp_path: Path
) -> None:
    dataset = write_dataset(
        tmp_path / "www" / "ds", num_docs=120, seed=23, block_tokens=512, blocks_per_file=4
    )
    n = dataset.num_samples(SEQ_LEN)
    caches = {node: tmp_path / f"cache-{node}" for node in NODES}
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
            procs = {}
            for node in NODES:
                env = clean_env(
                    PATH=f"{Path(sys.executable).parent}:/usr/sbin:/usr/bin:/sbin:/bin",
                    NNODES="3", NPROC_PER_NODE="2", RDZV_ENDPOINT=f"{net['n0'].address}:29400",
                    RDZV_ID="netns-recipe", DATASET=url, CACHE_DIR=str(caches[node]),
                    LOCAL_ADDR=net[node].address, GLOO_SOCKET_IFNAME="eth0",
                    # (the namespaces share the host name: n0 is told it hosts the
                    # rendezvous, as a node whose address is on a second network is)
                    RDZV_CONF="is_host=1" if node == "n0" else "is_host=0",
                )  # fmt: skip
                argv = ["bash", str(ROOT / "deploy" / "torchrun" / "train-node.sh"),
                        "--seq-len", str(SEQ_LEN), "--batch-size", str(B), "--num-workers", "0",
                        "--lease-size", "32", "--record", str(tmp_path / "rank-{rank}.jsonl")]  # fmt: skip
                with open(tmp_path / f"{node}.log", "wb") as log:
                    procs[node] = net.popen(node, argv, env=env, stdout=log, stderr=log)
            for node, p in procs.items():
                assert p.wait(timeout=240) == 0, f"{node}:\n{tail(tmp_path / f'{node}.log')}"
            served = origin.access_log()
        finally:
            origin.stop()
            net.kill_all()  # (the agents outlive the ranks that started them)
            for d in caches.values():
                shutil.rmtree(AgentPaths(d).shm, ignore_errors=True)
    steps = {
        r: [json.loads(x) for x in (tmp_path / f"rank-{r}.jsonl").read_text().splitlines()]
        for r in range(6)
    }
    ids = [i for rows in steps.values() for s in rows for i in s["ids"]]
    # every sample of the epoch once, but for what does not divide among the six ranks
    # (it opens the next epoch)
    assert len(set(ids)) == len(ids) and set(ids) <= set(range(n))
    assert len(ids) == n - n % 6
    assert len({len(rows) for rows in steps.values()}) == 1  # as many steps each
    nodes = {net[node].address for node in NODES}
    data = [r for r in served if "/data/" in r.path]
    assert data and {r.client for r in data} <= nodes and {r.status for r in data} <= {200, 206}
    fetched = Counter((r.client, r.path, r.range) for r in data)
    assert max(fetched.values()) == 1, fetched.most_common(3)  # a block once a node at most
