"""Run inside a virtualenv holding only stoker's core dependencies.

    python _core_reader.py CONFIG_JSON

Config keys: urls (datasets to read), agent_url (one read through a node agent this
script starts), cache_dir, s3_url, seq_len, batch_size. Prints one JSON object:
``{"reads": {url: [[sample ids], [token sums]]}, "s3_error": [is a ConfigError, message]}``.
"""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from typing import Any

import stoker
from stoker.cache.client import AgentClient


def read(url: str, cfg: dict[str, Any], agent: Any = False) -> list[list[int]]:
    ds = stoker.TokenDataset(url, cfg["seq_len"], batch_size=cfg["batch_size"], seed=5, agent=agent)
    ids: list[int] = []
    sums: list[int] = []
    for batch in stoker.TokenLoader(ds, 0):
        ids += batch["sample_id"].tolist()
        sums += batch["tokens"].sum(dim=1).tolist()
    return [ids, sums]


def main() -> int:
    cfg = json.loads(sys.argv[1])
    out: dict[str, Any] = {"reads": {}}
    for url in cfg["urls"]:
        out["reads"][url] = read(url, cfg)
    agent = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "stoker.cache.agent",
            "--cache-dir",
            cfg["cache_dir"],
            "--cache-limit",
            "64M",
            "--metrics-port",
            "-1",
            "--idle-exit",
            "120",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert agent.stdout is not None
        for line in agent.stdout:  # the agent prints "serving" once it listens
            if "serving" in line:
                break
        client = AgentClient(cfg["cache_dir"], autostart=False, timeout=60)
        out["reads"]["agent:" + cfg["agent_url"]] = read(cfg["agent_url"], cfg, client)
        client.close()
    finally:
        agent.terminate()
        agent.wait(60)
    # the other entry points of the core package import without any extra
    for module in (
        "stoker.coordinator.service",
        "stoker.coordinator.client",
        "stoker.observe.doctor",
    ):
        importlib.import_module(module)
    importlib.import_module("stoker.observe.top")

    try:
        stoker.TokenDataset(cfg["s3_url"], cfg["seq_len"], agent=False)
        out["s3_error"] = None
    except Exception as exc:
        out["s3_error"] = [isinstance(exc, stoker.ConfigError), str(exc)]
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
