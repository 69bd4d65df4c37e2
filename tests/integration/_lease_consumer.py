"""A consumer process for the coordinator tests: reads one epoch's positions by leases.

    python _lease_consumer.py CONFIG_JSON

Config: address, rank, worker, out (positions delivered, one per line), step
(positions per batch), pause_after (optional: after that many batches print
"paused" and wait for a line on stdin), delay (seconds per batch, to be slow).

Per batch it reports what it read, confirms, and only then "delivers" (appends
the positions to ``out`` and fsyncs): the commit protocol of the coordinator.
Prints "registered CONSUMER EPOCH" once registered and "done N" with the number of
positions delivered at the end.
"""

from __future__ import annotations

import json
import os
import sys
import time

from stoker.coordinator.client import CoordinatorClient


def main() -> int:
    cfg = json.loads(sys.argv[1])
    client = CoordinatorClient(cfg["address"], retry_for=120)
    cid, epoch = client.register(cfg["rank"], cfg["worker"])
    print(f"registered {cid} {epoch}", flush=True)
    held: dict[int, list[int]] = {}  # lease -> [end, horizon, read]
    fd = os.open(cfg["out"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    batches = delivered = 0
    step = cfg.get("step", 10)
    while True:
        r = client.lease(cid, epoch, sorted(held))
        if r.status == "granted":
            held[r.lease] = [r.end, r.horizon, r.start]
        elif not held:
            if r.status == "done":
                break
            time.sleep(0.02)  # WAIT: nothing free right now; the protocol says ask again
            client.heartbeat(cid, epoch)
            continue
        for lease in sorted(held):
            end, horizon, read = held[lease]
            while read < end:
                if read >= horizon:  # ask for more read-ahead
                    limits = client.heartbeat(cid, epoch, lease, read)
                    for k, (e, h) in limits.items():
                        if k in held:
                            held[k][0], held[k][1] = e, h
                    end, horizon = held[lease][0], held[lease][1]
                    continue
                upto = min(read + step, end, horizon)
                limits = client.heartbeat(cid, epoch, lease, upto)
                for k, (e, h) in limits.items():
                    if k in held:
                        held[k][0], held[k][1] = e, h
                end = held[lease][0]
                client.confirm(cid, epoch, lease, upto)
                os.write(fd, "".join(f"{p}\n" for p in range(read, upto)).encode())
                os.fsync(fd)
                delivered += upto - read
                read = held[lease][2] = upto
                batches += 1
                if batches == cfg.get("pause_after"):
                    print("paused", flush=True)
                    sys.stdin.readline()
                if cfg.get("delay"):
                    time.sleep(cfg["delay"])  # a slow consumer
            del held[lease]
    os.close(fd)
    print(f"done {delivered}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
