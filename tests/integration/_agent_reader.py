"""A reader process for the node-agent tests: reads one rank's epoch through an agent.

    python _agent_reader.py CONFIG_JSON

Config keys: url, cache_dir, out (a JSON-lines file), rank, world, seq_len,
batch_size, arena_blocks, autostart, num_workers, state (a state dict to
resume from, optional), pause_after (optional: after that many batches print
"paused" and wait for a line on stdin before going on).

After each batch the reader appends one line ``{"ids": [...], "state": {...}}``
to ``out`` in one write and fsyncs, so a reader killed with SIGKILL has
recorded exactly what it consumed, with the state to resume from. It prints
"done" when the epoch is over.
"""

from __future__ import annotations

import json
import os
import sys

import stoker
from stoker.cache.client import AgentClient


def main() -> int:
    cfg = json.loads(sys.argv[1])
    client = AgentClient(cfg["cache_dir"], autostart=cfg.get("autostart", False), timeout=60)
    ds = stoker.TokenDataset(
        cfg["url"],
        cfg["seq_len"],
        batch_size=cfg["batch_size"],
        rank=cfg["rank"],
        world_size=cfg["world"],
        agent=client,
        arena_blocks=cfg.get("arena_blocks"),
    )
    if cfg.get("state"):
        ds.load_state_dict(cfg["state"])
    loader = stoker.TokenLoader(ds, cfg.get("num_workers", 0))
    fd = os.open(cfg["out"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    for seen, batch in enumerate(loader, 1):
        line = {"ids": batch["sample_id"].tolist(), "state": loader.state_dict()}
        os.write(fd, (json.dumps(line) + "\n").encode())
        os.fsync(fd)
        if seen == cfg.get("pause_after"):
            print("paused", flush=True)
            sys.stdin.readline()
    os.close(fd)
    print("done", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
