"""The run behind test_preprocess_ray.py, in its own process (the test starts it in a
network namespace of loopback only, so that nothing Ray starts can reach beyond it):
a local Ray instance, a coordinator, two preprocessing workers as Ray actors offered
to it, and a trainer reading an epoch's rows through the pool while one actor is
killed and restarted by Ray. Prints what it saw as one JSON line.

    python ray_pool_run.py RECORDS_DIR RAY_TEMP_DIR STATE_DIR
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import ray

import stoker
from stoker.coordinator.client import CoordinatorClient
from stoker.loader.batch import SAMPLE_ID
from stoker.preprocess import client
from stoker.preprocess.ray import start_workers

N, B, SIZE = 96, 8, 32


def until(what: str, test: object) -> None:
    """Wait for ``test()`` (bounded: what never comes fails the run, naming ``what``)."""
    deadline = time.monotonic() + 120
    while not test():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise SystemExit(f"{what}: not within 120 s")
        time.sleep(0.05)


def main() -> None:
    images, temp, state = sys.argv[1:4]
    ray.init(
        address="local",
        num_cpus=2,
        include_dashboard=False,
        _node_ip_address="127.0.0.1",
        _temp_dir=temp,
        log_to_driver=False,
        object_store_memory=128 * 1024**2,  # (a container's /dev/shm may be small)
    )
    coordinator = subprocess.Popen(
        [sys.executable, "-m", "stoker", "coordinator", "--state", state, "--world", "1",
         "--num-samples", str(N), "--metrics-port", "-1"],
        stdout=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    assert coordinator.stdout is not None
    address = next(x for x in coordinator.stdout if "serving" in x).split("serving ")[1].split()[0]
    c = CoordinatorClient(address)
    out: dict[str, object] = {}
    try:
        pool = start_workers(2, coordinator=address, num_cpus=0.5)
        first = pool.addresses
        out["nodes"] = pool.nodes
        out["addresses"] = first
        until("both workers listed", lambda: set(first) <= set(c.pool(0, 0.0)))
        # requests of 4 rows, one at a time, the pool asked at every fill
        client.CHUNK, client.INFLIGHT, client.OFFER_SECONDS = 4, 1, 0.0
        ds = stoker.RecordDataset(
            images, seed=5, batch_size=B, image_size=SIZE,
            preprocess=f"coordinator://{address}",
        )  # fmt: skip
        ids = np.random.default_rng(1).permutation(N)
        got = ds.layout.allocate(N)
        reader = ds.open_reader(0)
        reader.plan(ids)
        reader.fill(ids[:32], {k: v[:32] for k, v in got.items()})
        # the first actor's process killed: Ray starts it again, on a fresh port, and it
        # offers itself anew; the rows it was making are asked of the other
        ray.kill(pool._actors[0][0], no_restart=False)
        until("the killed worker back", lambda: len(set(pool.addresses) - set(first)) == 1)
        (again,) = set(pool.addresses) - set(first)
        until("the restarted worker listed", lambda: again in c.pool(0, 0.0))
        for i in range(32, N, 8):
            reader.fill(ids[i : i + 8], {k: v[i : i + 8] for k, v in got.items()})
        out["made_by"] = dict(reader.made_by)
        out["restarted"] = again
        reader.close()
        mine = stoker.RecordDataset(images, seed=5, batch_size=B, image_size=SIZE)
        local = mine.open_reader(0)
        want = mine.layout.allocate(N)
        local.plan(ids)
        local.fill(ids, want)
        local.close()
        # (the sample ids are the loader's to write, not a reader's)
        out["compared"] = sorted(k for k in want if k != SAMPLE_ID)
        out["differ"] = [k for k in out["compared"] if not np.array_equal(got[k], want[k])]
        out["rows_by_worker"] = [f["rows"] for f in pool.figures()]
        pool.scale(1)  # the one stopped says it is leaving: the coordinator lists one
        out["listed_after_scale"] = sorted(c.pool(0, 0.0))
        out["left"] = pool.addresses
        pool.shutdown()
        out["listed_after_shutdown"] = sorted(c.pool(0, 0.0))
    finally:
        c.close()
        coordinator.send_signal(signal.SIGTERM)
        coordinator.wait(30)
        coordinator.stdout.close()
        ray.shutdown()
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    Path(sys.argv[2]).mkdir(parents=True, exist_ok=True)
    main()
