"""One rank of a job for the fault tests (test_faults.py, scripts/faults): reads one epoch
through a TokenLoader and records every batch it hands out.

    python _fault_job.py CONFIG_JSON

Config keys: dataset, seq_len, batch_size, rank, world, num_workers, out (a JSON-lines
file), timeout (the loader's worker timeout), cache_dir and agent (AgentClient keyword
arguments; no agent without cache_dir), coordinator (an address: fed by its leases,
else the static split), token (the coordinator's, optional), lease_size, state (a
state to resume from), pause_at (batch numbers), arena_blocks, crc (record each
sample's tokens as a CRC-32 of their int64 bytes).

After each batch it appends one line ``{"ids": [...], "state": {...}}`` to ``out`` in
one write and fsyncs (``state`` only without a coordinator or with ``checkpoints``), so a rank killed with
SIGKILL has recorded exactly what it handed out, with the state to resume from. At
each batch number in ``pause_at`` it prints ``paused K PID...`` (the pids of the
loader's worker processes) and waits for a line on stdin. It prints ``done N`` (the
batches of this run) at the end; a :class:`~stoker.WorkerError` is printed as
``worker-error: MESSAGE`` on stderr and ends the process with exit code 3.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import sys
import zlib

import stoker
from stoker.cache.client import AgentClient


def main() -> int:
    cfg = json.loads(sys.argv[1])
    agent = None
    if cfg.get("cache_dir"):
        agent = AgentClient(cfg["cache_dir"], **cfg.get("agent", {}))
    ds = stoker.TokenDataset(
        cfg["dataset"],
        cfg["seq_len"],
        batch_size=cfg["batch_size"],
        rank=cfg.get("rank", 0),
        world_size=cfg.get("world", 1),
        agent=agent if agent is not None else False,
        arena_blocks=cfg.get("arena_blocks"),
    )
    coordinator = None
    if cfg.get("coordinator"):
        from stoker.coordinator.client import CoordinatorClient

        coordinator = CoordinatorClient(cfg["coordinator"], cfg.get("token"), retry_for=120)
    loader = stoker.TokenLoader(
        ds, cfg.get("num_workers", 0), timeout=cfg.get("timeout", 300.0), coordinator=coordinator
    )
    if cfg.get("state"):
        loader.load_state_dict(cfg["state"])
    pauses = set(cfg.get("pause_at", []))
    fd = os.open(cfg["out"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    seen = 0
    try:
        for batch in loader:
            seen += 1
            line: dict[str, object] = {"ids": batch["sample_id"].tolist()}
            if cfg.get("crc"):  # each sample's tokens, to check against the dataset
                line["crc"] = [zlib.crc32(row.numpy().tobytes()) for row in batch["tokens"]]
            if coordinator is None or cfg.get("checkpoints"):  # fed: a Checkpoint call
                line["state"] = loader.state_dict()
            os.write(fd, (json.dumps(line) + "\n").encode())
            os.fsync(fd)
            if seen in pauses:
                pids = " ".join(str(p.pid) for p in multiprocessing.active_children())
                print(f"paused {seen} {pids}".strip(), flush=True)
                sys.stdin.readline()
    except stoker.WorkerError as exc:
        print(f"worker-error: {exc}", file=sys.stderr, flush=True)
        return 3
    finally:
        os.close(fd)
    print(f"done {seen}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
