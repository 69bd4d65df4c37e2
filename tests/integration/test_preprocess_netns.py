"""Preprocessing workers on machines of their own (network namespaces on a bridge,
each worker bound to its own address, a shared token): a worker behind a throttled
link (tc tbf) is asked for far fewer rows than one on a full link, and the rows are
the trainer's own bit for bit."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import stoker
from stoker.preprocess.client import RemoteReader

from ._netns import topology
from .helpers import one_rank, photo_records  # noqa: F401 (one_rank: a fixture)

pytestmark = [pytest.mark.netns, pytest.mark.usefixtures("one_rank")]

N, SIZE, PORT, TOKEN = 400, 32, 7091, "netns-preprocess-token"
#: The slow link: a request's 16 rows of 3 KiB take about 1.5 s on it, against tens of
#: milliseconds on the other worker's (the slow one's share is its first requests).
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
    assert made[addresses["slow"]] * 5 <= made[addresses["fast"]], made
