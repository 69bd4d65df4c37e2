"""Preprocessing workers on machines of their own (network namespaces on a bridge,
each worker bound to its own address, a shared token): a worker behind a throttled
link (tc tbf) is asked for far fewer rows than one on a full link, and the rows are
the trainer's own bit for bit; two trainer ranks fed by the coordinator's leases share
an epoch exactly once through three worker nodes, one SIGKILLed and one added mid-epoch."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

import stoker
from stoker.coordinator.client import CoordinatorClient
from stoker.preprocess.client import RemoteReader

from ._netns import topology
from .helpers import one_rank, photo_records  # noqa: F401 (one_rank: a fixture)

pytestmark = [pytest.mark.netns, pytest.mark.usefixtures("one_rank")]

N, SIZE, PORT, TOKEN = 800, 32, 7091, "netns-preprocess-token"
#: The slow link: a request's 32 rows of 3 KiB take about 3 s on it, against tens of
#: milliseconds on the other worker's. The slow one's share is bounded by its first
#: requests (INFLIGHT x CHUNK = 128 rows, made one after another: 12 s), whatever the
#: machine's load, so the fast one makes at least 4x as many of the 800.
THROTTLE = ["tbf", "rate", "256kbit", "burst", "16kbit", "latency", "2s"]


def test_a_worker_on_a_throttled_link_is_asked_for_less(tmp_path: Path) -> None:
    images = photo_records(tmp_path / "ds", N, 6, (36, 60), (3, 5), 40_000)
    token = tmp_path / "token"
    token.write_text(TOKEN)
    ds_local = stoker.RecordDataset(str(images), image_size=SIZE, seed=1)
    with topology({"fast": 10, "slow": 11}) as net:
        argv = [sys.executable, "-m", "stoker", "preprocess-worker", "--token-file", str(token)]
        procs = {
            role: net.popen(
                role,
                [*argv, "--bind", f"{net[role].address}:{PORT}"],
                stdout=subprocess.PIPE,
                text=True,
            )
            for role in ("fast", "slow")
        }
        for role, p in procs.items():
            assert p.stdout is not None
            # (any() stops at the first "serving" line: the worker listens from then on)
            assert any("serving" in line for line in p.stdout), f"{role} never served"
        subprocess.run(net["slow"].cmd("tc", "qdisc", "add", "dev", "eth0", "root", *THROTTLE),
                       check=True)  # fmt: skip
        addresses = {role: f"{net[role].address}:{PORT}" for role in procs}
        ds = stoker.RecordDataset(
            str(images),
            image_size=SIZE,
            seed=1,
            preprocess=[f"grpc://{a}" for a in addresses.values()],
            preprocess_token=TOKEN,
        )
        reader = ds.open_reader(0)
        assert isinstance(reader, RemoteReader)
        ids = np.random.default_rng(0).permutation(N)
        reader.plan(ids)
        got = ds.layout.allocate(N)
        for i in range(0, N, 8):
            part = {k: v[i : i + 8] for k, v in got.items()}
            reader.fill(ids[i : i + 8], part)
        made = reader.made_by
        reader.close()
    mine = ds_local.open_reader(0)
    want = ds_local.layout.allocate(N)
    mine.plan(ids)
    mine.fill(ids, want)
    mine.close()
    assert np.array_equal(got["image"], want["image"])
    assert np.array_equal(got["label"], want["label"])
    assert made[addresses["fast"]] + made[addresses["slow"]] == N
    assert made[addresses["slow"]] * 4 <= made[addresses["fast"]], made


TRAINER = Path(__file__).with_name("pool_trainer.py")


def test_two_ranks_share_worker_nodes_through_a_kill_and_an_addition(tmp_path: Path) -> None:
    """Three worker "nodes" (each its own namespace and node agent) offered to the
    job's coordinator; two trainer ranks, fed by its leases, read an epoch through the
    pool while one worker is SIGKILLed and another added mid-epoch: every sample once,
    equal batches per rank, each sample's crop the one local production makes, and the
    worker added mid-epoch used."""
    n = 192
    images = photo_records(tmp_path / "ds", n, 6, (36, 60), (3, 5), 40_000)
    one = stoker.RecordDataset(str(images), image_size=SIZE, seed=3, batch_size=8)
    want = {
        int(i): hashlib.sha256(b["image"][j].numpy().tobytes()).hexdigest()
        for b in stoker.TokenLoader(one, 0)
        for j, i in enumerate(b["sample_id"])
    }
    ptok, ctok = tmp_path / "ptoken", tmp_path / "ctoken"
    ptok.write_text(TOKEN)
    ctok.write_text("netns-coordinator-token")
    env = {**os.environ, "STOKER_COORDINATOR_TOKEN": "netns-coordinator-token"}
    with topology({"w0": 10, "w1": 11, "w2": 12}) as net:
        coordinator = net.track(subprocess.Popen(
            [sys.executable, "-m", "stoker", "coordinator", "--state", str(tmp_path / "state"),
             "--world", "2", "--num-samples", str(n), "--bind", f"{net.gateway}:0",
             "--token-file", str(ctok), "--metrics-port", "-1"],
            stdout=subprocess.PIPE, text=True,
        ))  # fmt: skip
        assert coordinator.stdout is not None
        address = next(x for x in coordinator.stdout if "serving" in x).split("serving ")[1]
        address = address.split()[0]

        def start(role: str) -> tuple[str, subprocess.Popen[str]]:
            at = f"{net[role].address}:{PORT}"
            p = net.popen(
                role,
                [sys.executable, "-m", "stoker", "preprocess-worker", "--token-file", str(ptok),
                 "--bind", at, "--coordinator", address, "--cache-dir", str(tmp_path / role),
                 "--metrics-port", "-1"],
                stdout=subprocess.PIPE, text=True, env=env,
            )  # fmt: skip
            assert p.stdout is not None
            assert any("serving" in line for line in p.stdout), f"{role} never served"
            return at, p

        lister = CoordinatorClient(address, "netns-coordinator-token")

        def listed(at: str) -> None:  # (bounded: a worker that never shows fails)
            deadline = time.monotonic() + 60
            while at not in lister.pool(0, 0.0):
                assert time.monotonic() < deadline, f"{at} never offered itself"
                time.sleep(0.05)

        (a0, p0), (a1, _) = start("w0"), start("w1")
        listed(a0)
        listed(a1)
        argv = [sys.executable, str(TRAINER), str(images), "", "2", address, TOKEN, "4"]
        trainers = []
        for r in ("0", "1"):
            argv[3] = r
            trainers.append(
                net.track(
                    subprocess.Popen(
                        argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env
                    )
                )
            )
        for t in trainers:
            assert t.stdout is not None and t.stdout.readline().strip() == "paused"
        p0.send_signal(signal.SIGKILL)  # mid-epoch: what it was asked goes elsewhere
        p0.wait(30)
        a2, _ = start("w2")
        listed(a2)
        out = []
        for t in trainers:
            assert t.stdin is not None and t.stdout is not None
            t.stdin.write("\n")
            t.stdin.flush()
            out.append(json.loads(t.stdout.readline()))
            assert t.wait(60) == 0
        lister.close()
    ids = [o["ids"] for o in out]
    assert not set(ids[0]) & set(ids[1]) and sorted(ids[0] + ids[1]) == list(range(n))
    assert out[0]["batches"] == out[1]["batches"] == n // 16
    assert all(int(i) in want and d == want[int(i)] for o in out for i, d in o["digests"].items())
    made: Counter[str] = Counter()
    for o in out:
        made.update(o["made_by"])
    assert sum(made.values()) == n  # every row a worker's (none made by the trainers)
    assert made[a0] > 0 and made[a2] > 0, made  # before its kill; added mid-epoch
