"""A trainer rank for test_preprocess_netns.py: reads one epoch of a records dataset
through the preprocessing pool its coordinator lists, fed by that coordinator's
leases; after ``PAUSE`` batches it prints "paused" and waits for a line on its stdin
(the test changes the pool meanwhile). Prints one JSON line: the sample ids it got, a
digest of each sample's image, its batch count and the rows each worker made.

    python pool_trainer.py RECORDS RANK WORLD COORDINATOR TOKEN PAUSE
"""

from __future__ import annotations

import hashlib
import json
import sys

import stoker
from stoker.coordinator.client import CoordinatorClient
from stoker.preprocess import client

B, SIZE = 8, 32


def rows_by_worker() -> dict[str, float]:
    """This process's ``stoker_preprocess_rows_total`` by worker (Prometheus' view)."""
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    from stoker.observe.exposition import Collector

    reg = CollectorRegistry()
    reg.register(Collector())
    return {
        x.labels["worker"]: x.value
        for fam in text_string_to_metric_families(generate_latest(reg).decode())
        for x in fam.samples
        if x.name == "stoker_preprocess_rows_total"
    }


def main() -> None:
    records, rank, world, coordinator, token, pause = sys.argv[1:7]
    # requests of 4 rows, one a worker in flight, the pool asked at every fill: the
    # rows after the pause are asked for after the pool changed
    client.CHUNK, client.INFLIGHT, client.OFFER_SECONDS = 4, 1, 0.0
    ds = stoker.RecordDataset(
        records, seed=3, batch_size=B, image_size=SIZE, rank=int(rank), world_size=int(world),
        preprocess=f"coordinator://{coordinator}", preprocess_token=token,
    )  # fmt: skip
    lease = CoordinatorClient(coordinator)  # (its token: $STOKER_COORDINATOR_TOKEN)
    loader = stoker.TokenLoader(ds, 0, coordinator=lease)
    ids: list[int] = []
    digests: dict[int, str] = {}
    batches = 0
    for batch in loader:
        batches += 1
        for j, i in enumerate(batch["sample_id"].tolist()):
            ids.append(i)
            digests[i] = hashlib.sha256(batch["image"][j].numpy().tobytes()).hexdigest()
        if batches == int(pause):
            print("paused", flush=True)
            sys.stdin.readline()
    loader.close()
    lease.close()
    print(json.dumps({"ids": ids, "digests": digests, "batches": batches,
                      "made_by": rows_by_worker()}), flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
