"""Remote bytes per epoch with 1, 2 and 4 local processes: through the node agent vs without.

    .venv/bin/python benchmarks/agent_remote.py [--quick]

The dataset is served by nginx on 127.0.0.1 (tests/servers.py). N reader
processes on this machine are the N ranks of one job (world size N, shuffle
on) and each reads its share of one epoch with stoker's TokenLoader. The bytes
they pull from the origin are summed from nginx's access log and divided by
the dataset's stored block bytes, so 1.0x means every block crossed the
network once. *With agent*: one `stoker agent` on a fresh cache directory
serves every process; *without*: each process reads and decodes for itself
(no cache), as every rank of a job without a node-level cache does. Each
configuration runs in a fresh cache and origin log; the readers also report
the time their epoch took.

The full run reads the real-text corpus dataset of tokens_bench.py
(benchmarks/.work/tokens_bench/data/stoker_dl; run tokens_bench.py first);
``--quick`` writes a small dataset of its own and does not touch the docs.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

import stoker

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
WORK = BENCH / ".work" / "agent_remote"
sys.path.insert(0, str(BENCH))
sys.path.insert(0, str(ROOT / "tests"))
from docsection import replace_section  # noqa: E402
from servers import NginxOrigin  # noqa: E402

HEADING = "## Node agent: remote bytes per epoch"
SEQ_LEN, BATCH = 2048, 8

READER = """
import json, sys, time
import stoker
from stoker.cache.client import AgentClient
cfg = json.loads(sys.argv[1])
agent = AgentClient(cfg["cache"], autostart=False) if cfg["cache"] else False
ds = stoker.TokenDataset(cfg["url"], cfg["seq_len"], batch_size=cfg["batch"], rank=cfg["rank"],
                         world_size=cfg["world"], seed=0, agent=agent)
t = time.perf_counter()
n = sum(len(b["sample_id"]) for b in stoker.TokenLoader(ds))
print(json.dumps({"samples": n, "seconds": time.perf_counter() - t}))
"""


def quick_dataset(root: Path) -> Path:
    rng = np.random.default_rng(0)
    docs = [rng.integers(1, 32000, size=int(rng.integers(100, 4000))) for _ in range(400)]
    url = root / "quick_ds"
    if not (url / "manifest.json").exists():
        stoker.write_tokens(docs, str(url), vocab_size=32000, eos_id=0, block_tokens=1 << 16)
    return url


def block_bytes(url: Path) -> int:
    src = stoker.TokenSource(str(url))
    idx = src.index
    return int((idx["token_bytes"].astype(np.int64) + idx["bounds_bytes"]).sum())


def start_agent(cache: Path) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "stoker.cache.agent", "--cache-dir", str(cache),
         "--cache-limit", "64G", "--shm-limit", "8G"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    assert proc.stdout is not None
    for line in proc.stdout:
        if "serving" in line:
            return proc
    raise RuntimeError("the agent did not start")


def run_config(origin: Any, url: str, procs: int, agent: bool, tmp: Path) -> dict[str, Any]:
    cache = tmp / f"cache-{procs}-{int(agent)}"
    shutil.rmtree(cache, ignore_errors=True)
    agent_proc = start_agent(cache) if agent else None
    origin.clear_access_log()
    try:
        cfg = {"url": url, "cache": str(cache) if agent else None, "seq_len": SEQ_LEN,
               "batch": BATCH, "world": procs}  # fmt: skip
        readers = [
            subprocess.Popen(
                [sys.executable, "-c", READER, json.dumps({**cfg, "rank": r})],
                stdout=subprocess.PIPE,
                text=True,
            )
            for r in range(procs)
        ]
        outs = []
        for p in readers:
            out, _ = p.communicate(timeout=1800)
            if p.returncode != 0:
                raise RuntimeError(f"reader exited with {p.returncode}")
            outs.append(json.loads(out.strip().splitlines()[-1]))
        stats = None
        if agent_proc is not None:
            from stoker.cache.client import AgentClient

            stats = AgentClient(cache, autostart=False).stats()
    finally:
        if agent_proc is not None:
            agent_proc.send_signal(signal.SIGTERM)
            agent_proc.wait(timeout=60)
        shutil.rmtree(cache, ignore_errors=True)
    log = [r for r in origin.access_log() if "/data/" in r.path]
    return {
        "procs": procs,
        "agent": agent,
        "remote_bytes": sum(r.bytes_sent for r in log),
        "requests": len(log),
        "samples": sum(o["samples"] for o in outs),
        "epoch_seconds": max(o["seconds"] for o in outs),
        "decodes": None if stats is None else stats["decodes"],
    }


def render(res: dict[str, Any]) -> str:
    rows = [
        HEADING,
        "",
        f"Command: `python benchmarks/agent_remote.py` (with `.venv/bin/python`). Run {res['when']}, "
        f"took {res['took']:.0f} s. Machine: {res['machine']}.",
        "",
        f"Dataset: {res['dataset']} ({res['blocks']} blocks, {res['stored'] / 1e6:.1f} MB of "
        f"block records), served by nginx on 127.0.0.1. Batches of ({BATCH}, {SEQ_LEN + 1}), "
        "shuffle on, seed 0. N processes = the N ranks of one job on one machine, each reading "
        "its share of one epoch with `TokenLoader` (num_workers=0). Remote bytes = body bytes of "
        "block requests in nginx's access log, over the stored block bytes.",
        "",
        "| processes | remote bytes, with agent (x dataset) | without agent (x dataset) | "
        "requests with / without | blocks decoded by the agent | epoch wall time with / "
        "without (s) |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    by = {(r["procs"], r["agent"]): r for r in res["runs"]}
    for n in res["procs"]:
        a, b = by[(n, True)], by[(n, False)]
        rows.append(
            f"| {n} | {a['remote_bytes'] / res['stored']:.2f}x | "
            f"{b['remote_bytes'] / res['stored']:.2f}x | {a['requests']} / {b['requests']} | "
            f"{a['decodes']} | {a['epoch_seconds']:.1f} / {b['epoch_seconds']:.1f} |"
        )
    worst = max(by[(n, True)]["remote_bytes"] / res["stored"] for n in res["procs"])
    rows += [
        "",
        f"Target: 1.0x the dataset with any number of local processes. Worst with the agent: "
        f"{worst:.2f}x — {'met' if worst <= 1.0 + 1e-9 else '**missed**'}. Without a node "
        "cache each rank fetches every block its samples touch, and the ranks' blocks overlap "
        "(a shuffle window spans blocks that every rank samples from).",
    ]
    return "\n".join(rows) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="small dataset, 1 and 2 processes")
    args = ap.parse_args()
    WORK.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    if args.quick:
        url = quick_dataset(WORK)
        procs = [1, 2]
    else:
        url = BENCH / ".work" / "tokens_bench" / "data" / "stoker_dl"
        if not (url / "manifest.json").exists():
            print("run benchmarks/tokens_bench.py first (it writes the dataset)", file=sys.stderr)
            return 1
        procs = [1, 2, 4]
    stored = block_bytes(url)
    m = stoker.TokenSource(str(url)).manifest
    with (
        tempfile.TemporaryDirectory(dir=WORK) as td,
        NginxOrigin(url.parent, prefix=WORK / "nginx") as origin,
    ):
        http = origin.url_for(url.name).rstrip("/")
        runs = []
        for n in procs:
            for agent in (True, False):
                r = run_config(origin, http, n, agent, Path(td))
                print(f"  {n} procs, agent={agent}: {r['remote_bytes'] / stored:.2f}x, "
                      f"{r['requests']} requests, {r['epoch_seconds']:.1f} s", flush=True)  # fmt: skip
                runs.append(r)
    res = {
        "when": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "took": time.perf_counter() - t0,
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
        f"Python {platform.python_version()}",
        "dataset": "the quick synthetic dataset"
        if args.quick
        else "the real-text corpus of tokens_bench.py",
        "blocks": m.num_blocks,
        "stored": stored,
        "procs": procs,
        "runs": runs,
    }
    (WORK / f"results{'-quick' if args.quick else ''}.json").write_text(json.dumps(res, indent=1))
    worst = max(r["remote_bytes"] / stored for r in runs if r["agent"])
    if not args.quick:
        replace_section(ROOT / "docs" / "benchmarks.md", HEADING, render(res))
    print(f"worst with agent: {worst:.2f}x")
    return 0 if worst <= 1.0 + 1e-9 else 1


if __name__ == "__main__":
    sys.exit(main())
