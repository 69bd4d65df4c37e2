"""Images held by the node agent: epoch 2 against epoch 1, and one copy of the decoded
images for every local process.

The corpus is the first ``--images`` rows of benchmarks/image_corpus.py's records
dataset (written once to ``benchmarks/.work/images/agent-<n>``). Every measurement runs
in a fresh process with a fresh agent (started by the dataset, ``decode_threads`` 2,
its memory tier large enough for the set): RecordDataset(hold="images",
short_side=256), RandomResizedCrop(224) + flip, uint8 batches of 64, stoker's loader
at ``num_workers`` 2, two epochs; beside it the same reader without the agent (the
direct path: each image decoded at a reduced size for its crop), both epochs. Then
the memory of 4 worker processes reading one held epoch through one agent: the bytes
the agent holds in shared memory against the sum of the workers' RSS, their shared
part (RssShmem) and their proportional set sizes (Pss, where a shared page counts
once in all).

    python benchmarks/images_agent.py [--images 6000] [--rounds 3]

writes docs/benchmarks.md's "Images held by the node agent" section and
``benchmarks/.work/images/agent.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
WORK = BENCH / ".work" / "images"
HEADING = "## Images held by the node agent"
SIZE, BATCH, SHORT = 224, 64, 256
sys.path.insert(0, str(BENCH))


def subset(n: int) -> Path:
    """The first ``n`` rows of the benchmark corpus's records dataset, as a dataset."""
    import stoker

    out = WORK / f"agent-{n}"
    if (out / "manifest.json").exists():
        return out
    records = WORK / "records"
    if not (records / "manifest.json").exists():
        subprocess.run([sys.executable, str(BENCH / "image_corpus.py")], check=True)
    src = stoker.RecordSource(str(records))
    with stoker.RecordWriter(str(out), schema=src.schema) as w:
        for start in range(0, n, 1000):
            w.add_batch(src.rows(range(start, min(n, start + 1000))))
    return out


def _children() -> list[int]:
    pids: list[int] = []
    for task in Path("/proc/self/task").iterdir():
        text = (task / "children").read_text().split()
        pids += [int(p) for p in text]
    return pids


def _memory(pid: int) -> dict[str, int]:
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "RssAnon", "RssShmem"):
            out[key] = int(value.split()[0]) * 1024
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        if line.startswith("Pss:"):
            out["Pss"] = int(line.split()[1]) * 1024
    return out


def child(cfg: dict[str, Any]) -> dict[str, Any]:
    import stoker
    from stoker.cache.paths import AgentPaths

    agent = cfg["agent"]
    kw: dict[str, Any] = {"image_size": SIZE, "augment": "train", "batch_size": BATCH}
    if agent:
        kw |= {"hold": "images", "short_side": SHORT}
        kw["cache"] = stoker.AgentConfig(
            cfg["cache"], shm_limit=cfg["shm"], decode_threads=2, metrics_port=None
        )
    ds = stoker.RecordDataset(cfg["url"], **kw)
    loader = stoker.TokenLoader(ds, cfg["num_workers"])
    out: dict[str, Any] = {"epochs": []}
    for _ in range(cfg["epochs"]):
        n, start = 0, time.perf_counter()
        memory = None
        batches = len(loader)
        for i, batch in enumerate(loader):
            n += len(batch["label"])
            if cfg.get("memory") and i == batches // 2:  # the workers as they read the epoch
                agent_pid = int(ds.agent.stats()["pid"])  # type: ignore[union-attr]
                memory = []
                for p in _children():
                    if p != agent_pid:
                        try:
                            memory.append(_memory(p))
                        except OSError:
                            pass  # (a process that was gone: not a worker)
        dt = time.perf_counter() - start
        row: dict[str, Any] = {"images": n, "seconds": dt, "images_s": n / dt}
        if agent:
            s = ds.agent.stats()  # type: ignore[union-attr]
            row |= {"images_decoded": s["images_decoded"], "memory_bytes": s["memory_bytes"]}
            shm = AgentPaths(cfg["cache"]).shm
            row["shm_bytes"] = sum(f.stat().st_size for f in shm.glob("*.arrow"))
        if memory is not None:
            row["workers"] = memory
        out["epochs"].append(row)
    loader.close()
    if agent:
        pid = int(ds.agent.stats()["pid"])  # type: ignore[union-attr]
        ds.agent.close()  # type: ignore[union-attr]
        os.kill(pid, signal.SIGKILL)
    return out


def run(cfg: dict[str, Any]) -> dict[str, Any]:
    from stoker.cache.agent import remove_tree
    from stoker.cache.paths import AgentPaths

    cache = tempfile.mkdtemp(prefix="stoker-agent-bench-")
    cfg = {**cfg, "cache": cache}
    try:
        got = subprocess.run(
            [sys.executable, __file__, "--child", json.dumps(cfg)],
            check=True, capture_output=True, text=True,
        )  # fmt: skip
        return dict(json.loads(got.stdout.strip().splitlines()[-1]))
    except subprocess.CalledProcessError as exc:
        sys.stderr.write(exc.stderr)
        raise
    finally:
        time.sleep(0.5)  # (the killed agent's exit; its files are removed below)
        remove_tree(AgentPaths(cache).shm)
        shutil.rmtree(cache, ignore_errors=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--images", type=int, default=6000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(json.loads(args.child))))
        return 0
    from docsection import replace_section
    from machine import git_info, platform_info

    import stoker

    data = subset(args.images)
    m = stoker.RecordSource(str(data)).manifest
    shm = 8 << 30
    t0 = time.perf_counter()
    runs: dict[str, list[dict[str, Any]]] = {"agent": [], "direct": [], "memory": []}
    for _ in range(args.rounds):
        base = {"url": str(data), "num_workers": 2, "epochs": 2, "shm": shm}
        runs["agent"].append(run({**base, "agent": True}))
        runs["direct"].append(run({**base, "agent": False}))
    mem = {"url": str(data), "num_workers": 4, "epochs": 2, "shm": shm, "agent": True}
    runs["memory"].append(run({**mem, "memory": True}))

    def med(kind: str, e: int) -> float:
        return statistics.median(r["epochs"][e]["images_s"] for r in runs[kind])

    out = {
        "machine": platform_info(),
        "commit": git_info(),
        "images": m.num_rows,
        "rounds": args.rounds,
        "agent_epoch1": med("agent", 0),
        "agent_epoch2": med("agent", 1),
        "direct_epoch1": med("direct", 0),
        "direct_epoch2": med("direct", 1),
        "runs": runs,
        "seconds": time.perf_counter() - t0,
    }
    WORK.mkdir(parents=True, exist_ok=True)
    (WORK / "agent.json").write_text(json.dumps(out, indent=1))
    print(json.dumps({k: v for k, v in out.items() if k not in ("runs", "machine")}, indent=1))
    replace_section(ROOT / "docs" / "benchmarks.md", HEADING, render(out))
    return 0


def render(out: dict[str, Any]) -> str:
    mach = out["machine"]
    a1, a2, d1, d2 = (out[k] for k in ("agent_epoch1", "agent_epoch2",
                                       "direct_epoch1", "direct_epoch2"))  # fmt: skip
    agent_runs = out["runs"]["agent"]
    decoded = [r["epochs"][0]["images_decoded"] for r in agent_runs]
    again = [
        r["epochs"][1]["images_decoded"] - r["epochs"][0]["images_decoded"] for r in agent_runs
    ]
    mem = out["runs"]["memory"][0]["epochs"][1]
    workers = mem.get("workers", [])
    gib = 1 << 30
    lines = [
        HEADING,
        "",
        f"Machine: {mach.get('Model name', '?')}, {mach.get('cpus', '?')} cores; commit "
        f"{out['commit']}. Command: `python benchmarks/images_agent.py --images "
        f"{out['images']} --rounds {out['rounds']}` ({out['seconds']:.0f} s). The first "
        f"{out['images']:,} images of benchmarks/image_corpus.py's set; RandomResizedCrop(224) "
        "+ flip, uint8 batches of 64, stoker's loader at num_workers 2, each measurement a "
        "fresh process and a fresh agent (decode_threads 2); medians of the rounds.",
        "",
        "| reader | epoch 1 images/s | epoch 2 images/s | epoch 2 / epoch 1 |",
        "|---|---:|---:|---:|",
        f"| through the agent, hold='images', short_side=256 | {a1:,.0f} | {a2:,.0f} | "
        f"{a2 / a1:.2f}x |",
        f"| without the agent (each image decoded at a reduced size for its crop) | {d1:,.0f} "
        f"| {d2:,.0f} | {d2 / d1:.2f}x |",
        "",
        f"Epoch 2 through the agent: {a2 / d2:.2f}x the reader without it. Images the agent "
        f"decoded in epoch 1: {decoded} (of {out['images']:,}); in epoch 2: {again}. The "
        f"agent's epoch 1 is {a1 / d1:.2f}x the reader without it.",
        "",
        f"Memory, 4 worker processes reading the second (held) epoch through one agent "
        f"(`num_workers` 4; measured halfway through the epoch): the agent holds "
        f"{mem.get('shm_bytes', 0) / gib:.2f} GiB of decoded images in shared memory; the "
        f"workers' RSS sums to {sum(w['VmRSS'] for w in workers) / gib:.2f} GiB, of which "
        f"{sum(w['RssShmem'] for w in workers) / gib:.2f} GiB is pages of that shared memory "
        f"(counted in each process that touched them) and "
        f"{sum(w['RssAnon'] for w in workers) / gib:.2f} GiB private (the interpreter, torch "
        "and the loader's slots, about the same in each; no copy of the images); their Pss (a "
        f"shared page counted once among them) sums to {sum(w['Pss'] for w in workers) / gib:.2f}"
        f" GiB, against {4 * mem.get('shm_bytes', 0) / gib:.2f} GiB for four copies of the "
        "images. The agent's epoch 1 is slower than the reader without it: it decodes every "
        "image whole to a short side of 256 (the direct reader decodes at a reduced size for "
        "its crop where it can), on its two threads, while the workers wait for its blocks.",
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
