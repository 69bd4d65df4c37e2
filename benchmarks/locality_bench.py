"""Locality: remote bytes over 3 epochs through the coordinator, with and without cache-aware leases.

    .venv/bin/python benchmarks/locality_bench.py [--quick]

It measures the window order (`ShuffleConfig(order="window")`), whose windows
are whole shards: a node that holds a window's shards holds all it reads. The
spread order's windows draw on the units of the turns before them as well, so a
node's cache covers less of them (not measured here).

Three nodes are simulated on this machine: three cache directories, each with
its own `stoker agent` (disk and memory tiers big enough to hold the whole
dataset), and one rank process per node (world 3). The dataset is served by
nginx on 127.0.0.1 (tests/servers.py). A standalone `stoker coordinator`
feeds the ranks (`TokenLoader(..., coordinator=client)`, num_workers=0) for 3
epochs; with *locality* each consumer reports the windows of the epoch that
its node's cache holds at least half of, and the coordinator grants a node
those positions first; *without* (`--no-locality`) positions go in queue
order. After each epoch a rank reads its agent's `remote_bytes` counter: the
bytes its node fetched from the origin that epoch. Their sum over the nodes,
over the dataset's stored block bytes, is the remote traffic (1.0x = every
block crossed the network once, in all). Every configuration starts from
empty caches and a fresh coordinator; each epoch's sample ids over the 3 ranks
are checked for duplicates and count (exactly once).

The dataset is generated (random tokens, so its size and block layout are
fixed by the parameters below): blocks of 2^15 tokens, samples of 512 tokens,
shards of 128 samples (2 blocks, as the default shard of 1 Mi tokens is 2
default blocks). ``--quick`` uses 48 shards and one-shard windows only, and does not touch the docs.
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
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

import stoker

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
WORK = BENCH / ".work" / "locality"
sys.path.insert(0, str(BENCH))
sys.path.insert(0, str(ROOT / "tests"))
from docsection import replace_section  # noqa: E402
from servers import NginxOrigin  # noqa: E402

HEADING = "## Coordinator: locality over 3 epochs"
SEQ_LEN, BATCH, BLOCK_TOKENS, SHARD = 512, 16, 1 << 15, 128
NODES, EPOCHS = 3, 3

READER = """
import json, sys, time
import numpy as np
import stoker
from stoker import plan
from stoker.cache.client import AgentClient
from stoker.coordinator.holdings import local_ranges
cfg = json.loads(sys.argv[1])
agent = AgentClient(cfg["cache"], autostart=False)
shuffle = stoker.ShuffleConfig(0, True, cfg["shard"], cfg["window_shards"], order="window")
ds = stoker.TokenDataset(cfg["url"], cfg["seq_len"], batch_size=cfg["batch"], rank=cfg["rank"],
                         world_size=cfg["world"], shuffle=shuffle, agent=agent)
loader = stoker.TokenLoader(ds, 0, coordinator=stoker.CoordinatorClient(cfg["coordinator"]))
m = ds.source.manifest
stream = plan.Stream(ds.num_samples, ds.shuffle_config)
out = []
for e in range(cfg["epochs"]):
    # what the consumer reports when it registers for epoch e (only this rank uses the agent)
    held = agent.holdings(m.dataset_id)
    local = local_ranges(ds.num_samples, ds.seq_len, m.block_tokens, ds.shuffle_config, e, held)
    pos = np.concatenate([np.arange(a, b) for a, b in local] or [np.zeros(0, np.int64)])
    local_ids = stream.samples(pos)
    before = agent.stats()
    t0 = time.time()
    ids = [b["sample_id"].numpy() for b in loader]
    t1 = time.time()
    after = agent.stats()
    got = np.concatenate(ids) if ids else np.zeros(0, np.int64)
    out.append({"epoch": loader.last_epoch.epoch, "start": t0, "end": t1,
                "remote_bytes": after["remote_bytes"] - before["remote_bytes"],
                "remote_requests": after["remote_requests"] - before["remote_requests"],
                "held_blocks": len(held), "local_positions": int(pos.size),
                "from_local": int(np.isin(got, local_ids).sum()), "ids": got.tolist()})
json.dump(out, open(cfg["out"], "w"))
"""


def make_dataset(root: Path, num_samples: int) -> Path:
    """Random documents of exactly ``num_samples * SEQ_LEN + 1`` tokens (EOS included)."""
    url = root / f"ds-{num_samples}"
    if (url / "manifest.json").exists():
        return url
    rng = np.random.default_rng(0)
    left = num_samples * SEQ_LEN + 1
    docs = []
    while left > 0:
        n = min(int(rng.integers(100, 4000)), left - 1)  # +1 for the EOS the writer appends
        docs.append(rng.integers(1, 32000, size=n))
        left -= n + 1
    stoker.write_tokens(docs, str(url), vocab_size=32000, eos_id=0, block_tokens=BLOCK_TOKENS)
    return url


def block_bytes(url: Path) -> int:
    idx = stoker.TokenSource(str(url)).index
    return int((idx["token_bytes"].astype(np.int64) + idx["bounds_bytes"]).sum())


def _serving(proc: subprocess.Popen[str], what: str) -> str:
    """Wait for the process's "serving" line; then drain its log in the background."""
    assert proc.stdout is not None
    for line in proc.stdout:
        if "serving" in line:
            threading.Thread(target=proc.stdout.read, daemon=True).start()  # drain the log
            return line
    raise RuntimeError(f"the {what} did not start")


def spawn_agent(cache: Path) -> subprocess.Popen[str]:
    """A node's agent; caches that hold the whole dataset (4 GB disk, 1 GB memory)."""
    return subprocess.Popen(
        [sys.executable, "-m", "stoker.cache.agent", "--cache-dir", str(cache),
         "--cache-limit", "4G", "--shm-limit", "1G"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip


def spawn_coordinator(state: Path, url: str, lease: int, locality: bool) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "stoker.cli", "coordinator", "--state", str(state),
         "--world", str(NODES), "--dataset", url, "--seq-len", str(SEQ_LEN),
         "--lease-size", str(lease), *([] if locality else ["--no-locality"])],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip


def stop(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def run_config(
    origin: Any, url: str, window_shards: int, lease: int, locality: bool, tmp: Path
) -> dict[str, Any]:
    """One configuration from empty caches and a fresh coordinator: 3 ranks, 3 epochs."""
    from stoker.cache.paths import AgentPaths

    base = tmp / f"ws{window_shards}-lease{lease}-{'on' if locality else 'off'}"
    shutil.rmtree(base, ignore_errors=True)
    caches = [base / f"node{n}" for n in range(NODES)]
    procs: list[subprocess.Popen[str]] = []
    origin.clear_access_log()
    try:
        procs = [spawn_agent(c) for c in caches]  # started together, then waited for
        procs.append(spawn_coordinator(base / "state", url, lease, locality))
        for p in procs[:-1]:
            _serving(p, "agent")
        address = _serving(procs[-1], "coordinator").split("serving ")[1].split()[0]
        cfg = {"url": url, "seq_len": SEQ_LEN, "batch": BATCH, "world": NODES, "shard": SHARD,
               "window_shards": window_shards, "coordinator": address, "epochs": EPOCHS}  # fmt: skip
        t0 = time.time()
        args = [
            {**cfg, "rank": r, "cache": str(caches[r]), "out": str(base / f"rank{r}.json")}
            for r in range(NODES)
        ]
        readers = [subprocess.Popen([sys.executable, "-c", READER, json.dumps(a)]) for a in args]
        for p in readers:
            if p.wait(timeout=1800) != 0:
                raise RuntimeError(f"reader exited with {p.returncode}")
        ranks = [json.loads((base / f"rank{r}.json").read_text()) for r in range(NODES)]
    finally:
        for p in reversed(procs):
            stop(p)
        for c in caches:
            shutil.rmtree(AgentPaths(c).shm, ignore_errors=True)  # left by an agent killed hard
        shutil.rmtree(base, ignore_errors=True)
    log = [r for r in origin.access_log() if "/data/" in r.path]
    epochs = []
    prev_end = t0
    for e in range(EPOCHS):
        rows = [ranks[r][e] for r in range(NODES)]
        ids = np.concatenate([np.asarray(x["ids"], dtype=np.int64) for x in rows])
        end = max(x["end"] for x in rows)
        epochs.append({
            "epoch": [x["epoch"] for x in rows],
            "remote_bytes": [x["remote_bytes"] for x in rows],
            "remote_requests": [x["remote_requests"] for x in rows],
            "held_blocks": [x["held_blocks"] for x in rows],
            "local_positions": [x["local_positions"] for x in rows],
            "samples": [len(x["ids"]) for x in rows],
            "from_local": [x["from_local"] for x in rows],
            "delivered": int(ids.size),
            "distinct": int(np.unique(ids).size),
            "seconds": end - prev_end,
        })  # fmt: skip
        prev_end = end
    return {
        "window_shards": window_shards,
        "lease": lease,
        "locality": locality,
        "epochs": epochs,
        "remote_bytes": sum(sum(e["remote_bytes"]) for e in epochs),
        "origin_bytes": sum(r.bytes_sent for r in log),
        "exactly_once": all(
            e["delivered"] == e["distinct"] == e["samples"][0] * NODES and e["epoch"] == [k] * NODES
            for k, e in enumerate(epochs)
        ),
    }


def _x(n: int, stored: int) -> str:
    return f"{n / stored:.2f}x"


def later(run: dict[str, Any]) -> int:
    """Remote bytes of epochs 1 and 2."""
    return sum(sum(e["remote_bytes"]) for e in run["epochs"][1:])


def render(res: dict[str, Any]) -> str:
    stored = res["stored"]
    rows = [
        HEADING,
        "",
        f"Command: `python benchmarks/locality_bench.py` (with `.venv/bin/python`). Run "
        f"{res['when']}, took {res['took']:.0f} s. Machine: {res['machine']}.",
        "",
        " ".join(__doc__.split("\n\n")[2].split()),
        "",
        f"Dataset: generated, {res['samples']:,} samples of {SEQ_LEN} tokens ({res['blocks']} "
        f"blocks of {BLOCK_TOKENS:,} tokens, {stored / 1e6:.1f} MB of block records), "
        f"{res['shards']} shards of {SHARD} samples; batches of {BATCH}, seed 0. Leases of "
        f"{SHARD} positions (one shard) unless the table says otherwise.",
        "",
        "| window shards (windows/epoch) | lease | locality | remote bytes epoch 0 / 1 / 2 "
        "(x dataset) | epochs 1-2 | total, 3 epochs | samples from windows the node held "
        "at least half of, epoch 1 / 2 | epoch wall time 0 / 1 / 2 (s) | exactly once |",
        "|---:|---:|---|---:|---:|---:|---:|---:|---|",
    ]
    for r in res["runs"]:
        eps = r["epochs"]
        per = " / ".join(_x(sum(e["remote_bytes"]), stored) for e in eps)
        share = " / ".join(f"{sum(e['from_local']) / e['delivered']:.0%}" for e in eps[1:])
        secs = " / ".join(f"{e['seconds']:.1f}" for e in eps)
        nwin = -(-res["shards"] // r["window_shards"])
        rows.append(
            f"| {r['window_shards']} ({nwin}) | {r['lease']} | {'on' if r['locality'] else 'off'} "
            f"| {per} | {_x(later(r), stored)} | {_x(r['remote_bytes'], stored)} | {share} | "
            f"{secs} | {'yes' if r['exactly_once'] else '**no**'} |"
        )
    rows += ["", *reading(res)]
    return "\n".join(rows) + "\n"


def reading(res: dict[str, Any]) -> list[str]:
    """What the numbers say, as bullets (numbers from ``res``, so a rerun keeps them true)."""
    stored, blocks = res["stored"], res["blocks"]
    out = []
    pairs: dict[tuple[int, int], dict[bool, dict[str, Any]]] = {}
    for r in res["runs"]:
        pairs.setdefault((r["window_shards"], r["lease"]), {})[r["locality"]] = r
    for (ws, lease), pair in pairs.items():
        if len(pair) < 2:
            continue
        on, off = pair[True], pair[False]
        a, b = later(on), later(off)
        cmp = f"{a / b:.2f} of it" if b else "nothing to save"
        e0 = [sum(r["epochs"][0]["remote_bytes"]) / stored for r in (on, off)]
        line = (
            f"- Windows of {ws} shard{'s' if ws > 1 else ''}, leases of {lease}: epoch 0 "
            f"fetches {e0[0]:.2f}x with locality vs {e0[1]:.2f}x without; epochs 1-2 "
            f"{_x(a, stored)} vs {_x(b, stored)} ({cmp}); over the "
            f"3 epochs {_x(on['remote_bytes'], stored)} vs {_x(off['remote_bytes'], stored)}."
        )
        ceiling = NODES * stored
        if min(on["remote_bytes"], off["remote_bytes"]) >= 0.98 * ceiling:
            line += (
                f" Both reach the ceiling of {NODES}.00x (every node fetched every block). A "
                f"lease of {lease} positions of a window of {ws} shards draws samples from all "
                f"{ws} shards, so a node that takes a lease in a window fetches almost all of "
                "its blocks: without locality every node takes leases in every window and "
                "fetches nearly everything in epoch 0; with it a node goes on in the windows it "
                "started, so epoch 0 stays near one copy, but the next epoch forms new windows "
                f"of {ws} shards of which each node holds about a third, and the nodes fetch the "
                "rest then."
            )
        elif ws > 1 and b and a / b > 0.8:
            # share of the blocks a node held when it reported
            held = [sum(on["epochs"][e]["held_blocks"]) / (NODES * blocks) for e in (1, 2)]
            loc = [
                sum(on["epochs"][e]["local_positions"]) / (NODES * res["samples"]) for e in (1, 2)
            ]
            line += (
                f" Leases that keep to whole windows keep epoch 0 near one copy, but locality saves "
                f"little: at the start of epoch 1 a node held {held[0]:.0%} of the blocks (with "
                f"locality) and a window counted as local when it held at least half of its "
                f"blocks, i.e. the windows reported local are only a little better than a random "
                f"one (every window mixes shards that all nodes read before); by epoch 2 it held "
                f"{held[1]:.0%} and reported {loc[1]:.0%} of the epoch's positions local, so the "
                "reports no longer tell windows apart."
            )
        out.append(line)
    one = pairs.get((1, SHARD))
    if one and len(one) == 2:
        h_on = one[True]["epochs"][2]["held_blocks"]
        h_off = one[False]["epochs"][2]["held_blocks"]
        loc = [x / res["samples"] for x in one[True]["epochs"][1]["local_positions"]]
        off_local = [1 - sum(e["from_local"]) / e["delivered"] for e in one[True]["epochs"][1:]]
        out.append(
            f"- With windows of one shard a node's cache after epoch 0 makes "
            f"{min(loc):.0%}-{max(loc):.0%} of epoch 1's positions local, more than the third "
            "of a partition: a shard's one-token boundary block (below) counts as a whole block "
            "in the at-least-half rule, so an exact partition of the shards already makes "
            f"{res['partition_local']:.0%} local per node, and a shard split by work stealing is held by two nodes. The "
            "coordinator grants them, and the caches stay nearly partitioned: after epoch 1 the "
            f"nodes hold {min(h_on)}-{max(h_on)} of the {blocks} blocks with locality vs "
            f"{min(h_off)}-{max(h_off)} without. What epochs 1-2 still fetch with locality: "
            f"positions outside the node's local windows ({off_local[0]:.0%} / "
            f"{off_local[1]:.0%} of the samples; local sets overlap, so another node may take "
            "them first, and work stealing ends an epoch), and the blocks a local window lacks "
            "(2 of 3 held is local)."
        )
    e0 = [
        sum(r["epochs"][0]["remote_bytes"]) / stored for r in res["runs"] if r["window_shards"] == 1
    ]
    if e0:
        out.append(
            f"- Epoch 0 (empty caches) costs {min(e0):.2f}x even with one-shard windows and "
            "leases, not 1.0x: a sample is `seq_len + 1` tokens, so the last sample of a shard "
            "reads one token of the next shard's first block, and a node that does not read "
            "that next shard fetches the whole block for it. With shards of 2 blocks (the "
            "default shard of 1 Mi tokens is 2 default blocks of 512 Ki tokens) that is up to "
            "half a block per shard."
        )
    ok = all(r["exactly_once"] for r in res["runs"])
    match = all(r["origin_bytes"] == r["remote_bytes"] for r in res["runs"])
    out.append(
        "- Exactly once: in every epoch of every run the 3 ranks delivered each sample id once "
        f"and the same count each — {'yes' if ok else '**no**'}. The agents' counters "
        f"{'match' if match else '**do not match**'} nginx's access log (body bytes of block "
        "requests)."
    )
    load = max(res["load"])
    shared = (
        f"the machine was shared with other CPU-heavy work (1-minute load average up to "
        f"{load:.1f} on {os.cpu_count()} cores, sampled after each configuration)"
        if load > (os.cpu_count() or 1)
        else f"1-minute load average up to {load:.1f}, sampled after each configuration"
    )
    out.append(
        f"- Wall times are noisy: {shared}, and epoch 0 includes starting the 3 reader "
        "processes. Bytes depend on timing only through which rank takes which lease."
    )
    return out


def partition_local(num_samples: int, block_tokens: int) -> float:
    """Share of epoch 1's positions (one-shard windows) that ``local_ranges`` reports local to
    a node holding exactly a third of the shards (random, with every block they touch)."""
    from stoker import plan
    from stoker.coordinator.holdings import local_ranges

    cfg = plan.ShuffleConfig(0, True, SHARD, 1, order="window").resolve(SEQ_LEN)
    ns = num_samples // SHARD
    mine = np.random.default_rng(0).permutation(ns)[: ns // NODES]
    held = np.unique(np.concatenate([
        np.arange(s * SHARD * SEQ_LEN // block_tokens, (s + 1) * SHARD * SEQ_LEN // block_tokens + 1)
        for s in mine
    ]))  # fmt: skip
    ranges = local_ranges(num_samples, SEQ_LEN, block_tokens, cfg, 1, held.tolist())
    return sum(b - a for a, b in ranges) / num_samples


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="small dataset; does not touch the docs")
    args = ap.parse_args()
    WORK.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    if args.quick:
        shards, configs = 48, [(1, SHARD)]
    else:
        shards, configs = 192, [(1, SHARD), (4, SHARD), (16, SHARD), (16, 16 * SHARD)]
    url = make_dataset(WORK, shards * SHARD)
    stored = block_bytes(url)
    m = stoker.TokenSource(str(url)).manifest
    runs: list[dict[str, Any]] = []
    load: list[float] = []
    with (
        tempfile.TemporaryDirectory(dir=WORK) as td,
        NginxOrigin(url.parent, prefix=WORK / "nginx") as origin,
    ):
        http = origin.url_for(url.name).rstrip("/")
        for ws, lease in configs:
            for locality in (True, False):
                r = run_config(origin, http, ws, lease, locality, Path(td))
                per = ", ".join(_x(sum(e["remote_bytes"]), stored) for e in r["epochs"])
                print(f"  window_shards={ws} lease={lease} locality={locality}: {per} (total "
                      f"{_x(r['remote_bytes'], stored)}), exactly once: {r['exactly_once']}, "
                      f"{sum(e['seconds'] for e in r['epochs']):.0f} s", flush=True)  # fmt: skip
                runs.append(r)
                load.append(os.getloadavg()[0])
    res = {
        "when": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "took": time.perf_counter() - t0,
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
        f"Python {platform.python_version()}",
        "samples": shards * SHARD,
        "shards": shards,
        "blocks": m.num_blocks,
        "stored": stored,
        "runs": runs,
        "load": load,
        "partition_local": partition_local(shards * SHARD, m.block_tokens),
    }
    (WORK / f"results{'-quick' if args.quick else ''}.json").write_text(json.dumps(res, indent=1))
    if not args.quick:
        replace_section(ROOT / "docs" / "benchmarks.md", HEADING, render(res))
    print("\n".join(reading(res)))
    return 0 if all(r["exactly_once"] for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
