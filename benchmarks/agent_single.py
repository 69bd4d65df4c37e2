"""One process through the node agent vs reading directly: tokens/s, first batch, CPU.

    .venv/bin/python benchmarks/agent_single.py [--quick] [--rounds R] [--workers 0,2]

One rank reads one epoch of a token dataset served by nginx on 127.0.0.1
(tests/servers.py) with ``TokenLoader(ds, num_workers)`` (batches of (8, 2049),
shuffle on, seed 0), in four configurations, each in a fresh process:

* *direct*: no ``cache_dir``; the reader fetches and decodes blocks itself;
* *agent cold*: ``cache_dir=`` a fresh, empty directory: the first reader starts the
  agent (autostart, inside the clock), which downloads and decodes every block;
* *agent empty*: the same, but the agent was started beforehand (outside the clock, by
  another process that asked it for its stats and read nothing): a cold cache without
  the autostart, i.e. what an epoch costs through an agent that is already up;
* *agent warm*: ``cache_dir=`` the directory of an agent already running with the
  dataset in its memory tier (an epoch read through it beforehand, outside the clock,
  by another process); the measured process is a second reader of the same epoch.

Measured per epoch: time to the first batch (from constructing the dataset to holding
the first batch; torch and stoker are imported and a full garbage collection is run before
the clock), tokens/s after the
first batch (the steady rate), and CPU seconds (user + system) per 100M tokens of the
reader process (with its workers) and of the agent process (for *cold* everything
since it started, for *empty* and *warm* what the measured epoch added; read once the agent is idle
again, so what it does after the last batch counts too). The configurations run in
R interleaved rounds (their order rotating) so that background load hits all alike;
reported are medians over the rounds, and against *direct* the medians of the
per-round ratios (tokens/s) and differences (first batch).

The full run reads the 100M-token synthetic dataset of ``benchmarks/dynamic_bench.py``
(``benchmarks/.work/dynamic_bench/synthetic-100000000``, written if missing);
``--quick`` reads a tiny dataset for one round and leaves docs/benchmarks.md alone.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import gc
import json
import os
import resource
import shlex
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
WORK = BENCH / ".work" / "agent_single"
DATA = BENCH / ".work" / "dynamic_bench" / "synthetic-100000000"
sys.path.insert(0, str(BENCH))
sys.path.insert(0, str(ROOT / "tests"))
from machine import proc_cpu  # noqa: E402

HEADING = "## Node agent: one process, direct vs through the agent"
SEQ_LEN, BATCH, SEED = 2048, 8, 0
CONFIGS = ("direct", "cold", "empty", "warm")
LABEL = {
    "direct": "direct (no `cache_dir`)",
    "cold": "agent cold (autostarted, empty cache)",
    "empty": "agent empty (running, empty cache)",
    "warm": "agent warm (running, dataset in memory)",
}
TARGET_TPS, TARGET_COLD_FIRST, TARGET_WARM_FIRST = 0.9, 0.15, 0.1


# -- the measured process ----------------------------------------------------------------
def agent_pid(cache: Path) -> int | None:
    """The pid the running agent of ``cache`` wrote into its lock file."""
    try:
        return int((cache / "agent.lock").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def child(cfg: dict[str, Any]) -> dict[str, Any]:
    """One epoch in this process (run as ``agent_single.py --child JSON``)."""
    import stoker
    from stoker.loader.dataset import TokenDataset
    from stoker.loader.loader import TokenLoader

    cache = Path(cfg["cache"]) if cfg["cache"] else None
    # a full collection now: the garbage of the imports must not make one due inside one
    # configuration's first batch and not another's (with torch loaded it takes ~0.1 s)
    gc.collect()
    pid0 = agent_pid(cache) if cache is not None and cfg["config"] in ("empty", "warm") else None
    agent0 = proc_cpu(pid0) if pid0 is not None else 0.0
    me0, kids0 = (
        resource.getrusage(resource.RUSAGE_SELF),
        resource.getrusage(resource.RUSAGE_CHILDREN),
    )
    t0 = time.perf_counter()
    ds = TokenDataset(
        cfg["url"], SEQ_LEN, batch_size=BATCH, seed=SEED, cache_dir=str(cache) if cache else None
    )
    t_ds = time.perf_counter()
    loader = TokenLoader(ds, cfg["num_workers"])
    first = None
    tokens = first_tokens = samples = 0
    for batch in loader:
        if first is None:
            first = time.perf_counter()
            first_tokens = int(batch["tokens"].numel())
        tokens += int(batch["tokens"].numel())
        samples += len(batch["sample_id"])
    end = time.perf_counter()
    me1 = resource.getrusage(resource.RUSAGE_SELF)
    agent = None
    if ds.agent is not None:
        st = ds.agent.stats()
        cpu = proc_cpu(int(st["pid"]))
        agent = {
            "pid": int(st["pid"]),
            "cpu": None if cpu is None or agent0 is None else cpu - agent0,
            "decodes": st.get("decodes"),
            "memory_hits": st.get("memory_hits"),
            "memory_misses": st.get("memory_misses"),
            "prefetches": st.get("prefetches"),
            "inline": st.get("inline_fallbacks"),
        }
    loader.close()  # its workers are reaped: their CPU is in RUSAGE_CHILDREN now
    kids1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    assert first is not None
    del stoker
    return {
        "config": cfg["config"],
        "num_workers": cfg["num_workers"],
        "samples": samples,
        "tokens": tokens,
        "first_s": first - t0,
        "dataset_s": t_ds - t0,  # constructing the dataset (and its agent client)
        "epoch_s": end - t0,
        "tps": (tokens - first_tokens) / (end - first) if end > first else float("nan"),
        "cpu_reader": me1.ru_utime + me1.ru_stime - me0.ru_utime - me0.ru_stime,
        "cpu_workers": kids1.ru_utime + kids1.ru_stime - kids0.ru_utime - kids0.ru_stime,
        "agent": agent,
    }


# -- the driver --------------------------------------------------------------------------
def run_child(cfg: dict[str, Any]) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    env.pop("STOKER_CACHE_DIR", None)
    proc = subprocess.run(
        [sys.executable, __file__, "--child", json.dumps(cfg)],
        capture_output=True,
        text=True,
        timeout=1800,
        env=env,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"{cfg['config']} reader exited with {proc.returncode}:\n{proc.stderr}")
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


def stop_agent(cache: Path) -> None:
    """SIGTERM the agent of ``cache`` (started by a reader, so not our child) and wait."""
    pid = agent_pid(cache)
    if pid is not None:
        try:
            os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                os.kill(pid, 0)
                time.sleep(0.02)
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    shutil.rmtree(cache, ignore_errors=True)


def start_agent(cache: Path) -> None:
    """Start the agent of ``cache`` as a reader would (autostart) and wait until it answers,
    in a process of its own that reads nothing."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    env.pop("STOKER_CACHE_DIR", None)
    code = f"from stoker.cache.client import AgentClient; AgentClient({str(cache)!r}).stats()"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120, env=env)


def quiet_cpu(pid: int | None, timeout: float = 30.0) -> float | None:
    """CPU seconds of process ``pid`` once it has stopped using any (0.25 s without a
    tick): the agent's work for an epoch includes what it does after the reader's last
    batch (writing the disk tier behind, prefetching the next epoch)."""
    if pid is None:
        return None
    deadline = time.monotonic() + timeout
    last = proc_cpu(pid)
    while last is not None and time.monotonic() < deadline:
        time.sleep(0.25)
        now = proc_cpu(pid)
        if now == last:
            break
        last = now
    return last


def epoch(url: str, config: str, nw: int, tmp: Path) -> dict[str, Any]:
    cache = Path(tempfile.mkdtemp(prefix=f"{config}-", dir=tmp)) if config != "direct" else None
    cfg = {"url": url, "config": config, "num_workers": nw, "cache": str(cache) if cache else None}
    try:
        base = 0.0  # the agent's CPU before the measured epoch (cold: it starts inside it)
        if config == "warm":  # another process reads the epoch first, outside the clock
            run_child({**cfg, "config": "prep"})
            assert cache is not None
            base = quiet_cpu(agent_pid(cache)) or 0.0
        elif config == "empty":  # another process starts the agent, reading nothing
            start_agent(cache)
            assert cache is not None
            base = quiet_cpu(agent_pid(cache)) or 0.0
        r = run_child(cfg)
        if cache is not None and r["agent"] is not None:
            total = quiet_cpu(agent_pid(cache))
            r["agent"]["cpu_at_last_batch"] = r["agent"]["cpu"]
            r["agent"]["cpu"] = None if total is None else total - base
        return r
    finally:
        if cache is not None:
            stop_agent(cache)


def per100m(cpu: float | None, tokens: int) -> float | None:
    return None if cpu is None else cpu * 1e8 / tokens


def summarize(runs: list[dict[str, Any]], workers: list[int]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for nw in workers:
        direct = {r["round"]: r for r in runs if r["num_workers"] == nw and r["config"] == "direct"}
        for config in CONFIGS:
            rs = [r for r in runs if r["num_workers"] == nw and r["config"] == config]
            if not rs:
                continue
            row: dict[str, Any] = {
                "tps": statistics.median(r["tps"] for r in rs),
                "first_s": statistics.median(r["first_s"] for r in rs),
                "cpu_reader": statistics.median(
                    per100m(r["cpu_reader"] + r["cpu_workers"], r["tokens"]) for r in rs
                ),
            }
            agent = [per100m(r["agent"]["cpu"], r["tokens"]) for r in rs if r["agent"]]
            agent = [a for a in agent if a is not None]
            row["cpu_agent"] = statistics.median(agent) if agent else None
            row["cpu_total"] = statistics.median(
                per100m(
                    r["cpu_reader"] + r["cpu_workers"] + ((r["agent"] or {}).get("cpu") or 0.0),
                    r["tokens"],
                )
                for r in rs
            )
            if config != "direct":
                pairs = [(r, direct[r["round"]]) for r in rs if r["round"] in direct]
                row["ratios"] = [round(r["tps"] / d["tps"], 3) for r, d in pairs]
                row["first_deltas"] = [round(r["first_s"] - d["first_s"], 3) for r, d in pairs]
                row["ratio"] = statistics.median(row["ratios"])
                row["first_delta"] = statistics.median(row["first_deltas"])
                row["cpu_extra"] = statistics.median(
                    per100m(
                        r["cpu_reader"] + r["cpu_workers"] + ((r["agent"] or {}).get("cpu") or 0.0)
                        - d["cpu_reader"] - d["cpu_workers"],
                        r["tokens"],
                    )
                    for r, d in pairs
                )  # fmt: skip
            out[f"{config}/nw{nw}"] = row
    return out


def verdicts(s: dict[str, Any], workers: list[int]) -> list[str]:
    out = []
    for nw in workers:
        cold, warm = s.get(f"cold/nw{nw}"), s.get(f"warm/nw{nw}")
        empty = s.get(f"empty/nw{nw}")
        if cold is None or warm is None:
            continue
        checks = [
            ("cold tok/s", cold["ratio"] >= TARGET_TPS, f"{cold['ratio']:.2f}x (>= 0.9x)"),
            *(
                [("cold tok/s with the agent up", empty["ratio"] >= TARGET_TPS,
                  f"{empty['ratio']:.2f}x (>= 0.9x)")]
                if empty is not None else []
            ),
            ("cold first batch", cold["first_delta"] <= TARGET_COLD_FIRST,
             f"{cold['first_delta']:+.3f} s (<= +0.15 s)"),
            ("warm tok/s", warm["ratio"] >= TARGET_TPS, f"{warm['ratio']:.2f}x (>= 0.9x)"),
            ("warm first batch", warm["first_delta"] <= TARGET_WARM_FIRST,
             f"{warm['first_delta']:+.3f} s (<= +0.1 s)"),
        ]  # fmt: skip
        out.append(
            f"num_workers={nw}: "
            + "; ".join(f"{k} {v}, {'met' if ok else '**missed**'}" for k, ok, v in checks)
            + "."
        )
    return out


def _paragraph(k: int) -> str:
    """Paragraph ``k`` of the module docstring as markdown (bullets one per line)."""
    text = __doc__.split("\n\n")[k].replace("``", "`")
    return "\n* ".join(" ".join(b.split()) for b in ("\n" + text).split("\n* ")).strip() + "\n"


def _f(x: float | None, fmt: str = ".2f") -> str:
    return "-" if x is None else format(x, fmt)


def render(res: dict[str, Any]) -> str:
    m, d, s, p = res["machine"], res["dataset"], res["summary"], res["params"]
    lines = [
        HEADING,
        "",
        f"Command: `{res['command']}` (with `.venv/bin/python`). Run {res['when']}, took "
        f"{res['took']:.0f} s; raw results in `benchmarks/.work/agent_single/"
        f"{res['results_file']}`.",
        "",
        f"Machine: {m.get('Model name', '?')} ({m.get('Architecture', '?')}), {m['cpus']} "
        f"cores, {m.get('Hypervisor vendor', 'no')} VM, Linux {m['kernel']}, Python "
        f"{m['python']}, torch {m['torch']}, numpy {m['numpy']}, stoker {m['stoker']}"
        + (f" at commit {m['git']}" if m.get("git") else "")
        + ". "
        f"1-minute load average {res['loadavg'][0]:.2f} at the start and "
        f"{res['loadavg'][1]:.2f} at the end. This is a shared 2-core sandbox where other "
        "work may run at the same time (and the reader, its workers, the agent and nginx "
        "share the two cores), so read the ratios of the interleaved rounds rather than the "
        "absolute rates.",
        "",
        *(_paragraph(k) for k in (2, 3, 4)),
        f"Dataset: synthetic Zipf-distributed documents (vocab 32000), {d['num_tokens']:,} "
        f"tokens ({d['blocks']} blocks of {d['block_tokens']:,} tokens, zstd, "
        f"{d['stored_bytes'] / 1e6:.1f} MB stored), served by nginx on 127.0.0.1; "
        f"{p['samples']:,} samples of {SEQ_LEN} tokens per epoch. Agent settings: the "
        "defaults of an autostarted agent.",
        "",
        f"| num_workers | configuration | tok/s after the first batch (M, median of "
        f"{p['rounds']}) | x direct (median of per-round ratios) | first batch (s) | "
        "vs direct (s, median of per-round differences) | CPU s per 100M tokens: reader / "
        "agent / extra vs direct |",
        "|---:|---|---:|---:|---:|---:|---:|",
    ]
    for nw in p["workers"]:
        for config in CONFIGS:
            r = s.get(f"{config}/nw{nw}")
            if r is None:
                continue
            ratio = f"{r['ratio']:.2f}x" if "ratio" in r else "1.00x"
            delta = f"{r['first_delta']:+.3f}" if "first_delta" in r else "-"
            extra = f"{r['cpu_extra']:+.2f}" if "cpu_extra" in r else "-"
            lines.append(
                f"| {nw} | {LABEL[config]} | {r['tps'] / 1e6:.1f} | {ratio} | "
                f"{r['first_s']:.3f} | {delta} | {_f(r['cpu_reader'])} / "
                f"{_f(r['cpu_agent'])} / {extra} |"
            )
    lines += ["", "Per-round ratios (tok/s vs direct) and first-batch differences (s):", ""]
    for nw in p["workers"]:
        for config in CONFIGS[1:]:
            r = s.get(f"{config}/nw{nw}")
            if r is not None:
                lines.append(
                    f"* num_workers={nw}, {config}: {', '.join(f'{x:.2f}' for x in r['ratios'])}"
                    f"; {', '.join(f'{x:+.3f}' for x in r['first_deltas'])}"
                )
    lines += [
        "",
        "Targets (issue 13): cold and warm at least 0.9x the direct path's tokens/s; the "
        "autostart adds at most 0.15 s to the first batch, a warm agent at most 0.1 s.",
        "",
        *(f"* {v}" for v in verdicts(s, p["workers"])),
    ]
    if res.get("notes"):
        lines += ["", *res["notes"]]
    return "\n".join(lines) + "\n"


def quick_dataset(root: Path) -> Path:
    import numpy as np

    import stoker

    rng = np.random.default_rng(0)
    docs = [rng.integers(1, 32000, size=int(rng.integers(100, 4000))) for _ in range(800)]
    url = root / "quick" / "data"
    if not (url / "manifest.json").exists():
        stoker.write_tokens(docs, str(url), vocab_size=32000, eos_id=0, block_tokens=1 << 16)
    return url


def full_dataset() -> Path:
    url = DATA / "data"
    if not (url / "manifest.json").exists():
        from dynamic_bench import ensure_dataset

        ensure_dataset(100_000_000, synthetic=True)
    return url


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="tiny dataset, one round; docs untouched")
    ap.add_argument("--rounds", type=int, help="interleaved rounds (default 5; 1 with --quick)")
    ap.add_argument("--workers", default="0,2", help="num_workers values (default 0,2)")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(json.loads(args.child))))
        return 0
    from docsection import replace_section
    from machine import git_info, platform_info
    from servers import NginxOrigin

    import stoker

    t0 = time.perf_counter()
    load0 = os.getloadavg()[0]
    rounds = args.rounds or (1 if args.quick else 5)
    workers = [int(x) for x in args.workers.split(",")]
    WORK.mkdir(parents=True, exist_ok=True)
    url = quick_dataset(WORK) if args.quick else full_dataset()
    m = stoker.TokenSource(str(url)).manifest
    info = {
        "num_tokens": m.num_tokens,
        "blocks": m.num_blocks,
        "block_tokens": m.block_tokens,
        "stored_bytes": sum(p.stat().st_size for p in url.rglob("*") if p.is_file()),
    }
    runs: list[dict[str, Any]] = []
    with (
        tempfile.TemporaryDirectory(prefix="agent-single-", dir="/tmp") as td,
        NginxOrigin(url.parent, prefix=Path(td) / "nginx") as origin,
    ):
        http = origin.url_for(url.name).rstrip("/")
        for rnd in range(rounds):
            order = CONFIGS[rnd % len(CONFIGS) :] + CONFIGS[: rnd % len(CONFIGS)]
            for nw in workers:
                for config in order:
                    r = epoch(http, config, nw, Path(td))
                    r["round"] = rnd
                    runs.append(r)
                    a = r["agent"] or {}
                    print(
                        f"round {rnd + 1}/{rounds} nw={nw} {config:6s} "
                        f"{r['tps'] / 1e6:6.1f} M tok/s, first batch {r['first_s']:.3f} s, "
                        f"CPU reader {r['cpu_reader'] + r['cpu_workers']:.2f} s agent "
                        f"{_f(a.get('cpu'))} s, decodes {a.get('decodes', '-')}",
                        flush=True,
                    )
    samples = {r["samples"] for r in runs}
    if len(samples) != 1:
        raise RuntimeError(f"the configurations read different sample counts: {samples}")
    name = "results-quick.json" if args.quick else "results.json"
    argv = " ".join(shlex.quote(a) for a in sys.argv[1:])
    machine = {**platform_info(), "stoker": stoker.__version__}
    git = git_info()
    if git:
        machine["git"] = git
    res = {
        "command": f"python benchmarks/agent_single.py{' ' + argv if argv else ''}",
        "when": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "took": time.perf_counter() - t0,
        "loadavg": [load0, os.getloadavg()[0]],
        "machine": machine,
        "dataset": info,
        "params": {"rounds": rounds, "workers": workers, "samples": samples.pop()},
        "summary": summarize(runs, workers),
        "runs": runs,
        "results_file": name,
    }
    (WORK / name).write_text(json.dumps(res, indent=1))
    text = render(res)
    if not args.quick:
        replace_section(ROOT / "docs" / "benchmarks.md", HEADING, text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
