"""Loader throughput A/B: a git revision of stoker (OLD) against the working tree (NEW).

    .venv/bin/python benchmarks/loader_ab.py [--base REV] [--rounds R] [--steady] [--quick]

Two source trees are measured side by side in one run: OLD, a clone of this
repository checked out at ``--base`` (default ``3a70ba9``, the commit before the
refactor of the loader pipeline), and NEW, a copy of the working tree's
``src/`` taken when the run starts (so that edits made during the run do not
reach half of it). Every measurement is a fresh process of this interpreter
with ``PYTHONPATH=<tree>/src``; the process checks that ``stoker.__file__`` lies
under that tree and reports it. Both trees are byte-compiled before the first
round.

Configurations, each over ``TokenDataset(url, 2048, batch_size=8, seed=0)``
(batches of (8, 2049) int64, shuffle on):

* *A*: ``TokenLoader(ds, num_workers=0)``;
* *B*: ``TokenLoader(ds, num_workers=2)``;
* *C*: ``torch.utils.data.DataLoader(ds, batch_size=8, num_workers=0)``;
* *D*: ``TokenLoader(ds, num_workers=0, device="cpu")``.

Measured per process: tokens/s over a timed window of batches after a warm-up
(A, B, D: 5800 after 200; C: 5900 after 100: nearly one whole epoch of the
100M-token dataset; ``--steady``: two epochs after a whole epoch, the rate past
the readers' read-ahead at an epoch's start; ``--quick``: 40 after 5); the same
from construction (every batch's tokens over the time from constructing the dataset
to the timed window's last batch: decoding read ahead before the window opened
counts too); the time to the first batch (from
constructing the dataset to holding the first batch, imports excluded); CPU
seconds of the process and its workers from constructing the dataset until the
loader is closed (user + system, workers reaped); peak RSS (``VmHWM``) of
the process and of its largest worker. Every timed window must deliver distinct
sample ids, and OLD and NEW must deliver the same id sequence in each
configuration, or the run stops with an error (exit status 1).

The run is R interleaved rounds (default 7): in each round every configuration
runs once per side, OLD first in rounds 1, 3, 5, ... and NEW first in rounds 2,
4, ..., so that background load on the machine hits both alike. Reported are
the medians over the rounds and the NEW/OLD tokens/s ratio as the median of the
per-round ratios (the ratios themselves are listed too).

Dataset: ``benchmarks/.work/dynamic_bench/synthetic-100000000/data``, reused
when present, else written as ``benchmarks/dynamic_bench.py`` writes its
synthetic dataset (``ensure_dataset(100_000_000, synthetic=True)``). The script
prints a Markdown section for docs/benchmarks.md (it does not edit the file)
and writes every run to ``benchmarks/.work/loader_ab/results.json``.
``--quick``: a tiny synthetic dataset in a temporary directory, one round, few
batches; it writes only ``benchmarks/.work/loader_ab/results-quick.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as _dt
import hashlib
import json
import os
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
WORK = BENCH / ".work" / "loader_ab"
HEADING = "## Loader throughput: a base revision vs the working tree"
SEQ_LEN, BATCH, SEED = 2048, 8, 0
FULL_TOKENS, QUICK_TOKENS = 100_000_000, 1_000_000
CONFIGS = ("A", "B", "C", "D")
SIDES = ("OLD", "NEW")
LABEL = {
    "A": "`TokenLoader(ds, num_workers=0)`",
    "B": "`TokenLoader(ds, num_workers=2)`",
    "C": "`DataLoader(ds, batch_size=8, num_workers=0)`",
    "D": '`TokenLoader(ds, num_workers=0, device="cpu")`',
}
# (warm-up batches, timed batches)
WINDOWS = {
    "full": {"A": (200, 5800), "B": (200, 5800), "C": (100, 5900), "D": (200, 5800)},
    "quick": {"A": (5, 40), "B": (5, 40), "C": (5, 40), "D": (5, 40)},
}


def _hwm_kib() -> int:
    """This process's own peak RSS (VmHWM; ru_maxrss carries over a large parent's, 0 without
    /proc)."""
    try:
        with open("/proc/self/status") as f:
            return next((int(x.split()[1]) for x in f if x.startswith("VmHWM:")), 0)
    except OSError:
        return 0


# -- one measurement (runs in a fresh child process) -----------------------------------
def child(
    cfg: str, url: str, warm: int, timed: int, tree: str, out: str, order: str | None = None
) -> int:
    """One configuration of the stoker found on PYTHONPATH; the result as JSON to ``out``."""
    import gc
    import resource

    import numpy as np
    import torch

    import stoker

    src = Path(tree).resolve() / "src"
    where = Path(stoker.__file__).resolve()
    if not where.is_relative_to(src):
        raise SystemExit(f"stoker imported from {where}, not from {src}")

    def cpu() -> float:
        me = resource.getrusage(resource.RUSAGE_SELF)
        kids = resource.getrusage(resource.RUSAGE_CHILDREN)
        return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime

    cpu0 = cpu()
    t0 = time.perf_counter()
    if order:  # the NEW tree's order by name (an OLD tree has only its default)
        shuffle = stoker.ShuffleConfig(seed=SEED, order=order)
        ds = stoker.TokenDataset(url, SEQ_LEN, batch_size=BATCH, shuffle=shuffle)
    else:
        ds = stoker.TokenDataset(url, SEQ_LEN, batch_size=BATCH, seed=SEED)
    loader: Any
    if cfg == "A":
        loader = stoker.TokenLoader(ds, num_workers=0)
    elif cfg == "B":
        loader = stoker.TokenLoader(ds, num_workers=2)
    elif cfg == "C":
        loader = torch.utils.data.DataLoader(ds, batch_size=BATCH, num_workers=0)
    elif cfg == "D":
        loader = stoker.TokenLoader(ds, num_workers=0, device="cpu")
    else:
        raise SystemExit(f"unknown configuration {cfg!r}")
    epoch = [0]  # epochs begun after the first: ids are told apart by it

    def epochs(of: Any) -> Any:  # one epoch after another (--steady times more than one)
        while True:
            yield from of
            epoch[0] += 1

    it = epochs(loader)
    b = next(it)
    first_s = time.perf_counter() - t0
    first_ids = b["sample_id"].tolist()
    warm_tok = b["tokens"].numel()
    for _ in range(warm - 1):
        b = next(it)
        warm_tok += b["tokens"].numel()
    # the timed ids in one array filled in place: keeping a small array per batch carves
    # glibc's freed batch-sized chunks, and the process's heap then grows by about a
    # batch per batch in some runs (measured: 234 -> 619 MiB peak, slower reads)
    ids = np.empty(timed * BATCH, dtype=np.int64)
    nids = 0
    ntok = 0
    c0 = time.process_time()
    ts = time.perf_counter()
    for _ in range(timed):
        b = next(it)
        ntok += b["tokens"].numel()
        sid = b["sample_id"].numpy()
        ids[nids : nids + len(sid)] = sid + (epoch[0] << 40)
        nids += len(sid)
    te = time.perf_counter()
    c1 = time.process_time()
    batch = [str(b["tokens"].device), str(b["tokens"].dtype), list(b["tokens"].shape)]
    # shut down, so that the workers are reaped and RUSAGE_CHILDREN counts them
    close_error = None
    for obj in (it, loader):
        if hasattr(obj, "close"):
            try:
                obj.close()
            except Exception as exc:  # reported, not fatal: the numbers are taken
                close_error = f"{type(obj).__name__}.close: {exc!r}"
    del it, loader, b
    gc.collect()
    cpu1 = cpu()
    all_ids = ids[:nids]
    me = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    res = {
        "cfg": cfg,
        "warm": warm,
        "timed": timed,
        "stoker_file": str(where),
        "tok_s": ntok / (te - ts),
        "timed_s": te - ts,
        # from constructing the dataset to the timed window's last batch: what was read
        # ahead before the window opened counts too
        "whole_tok_s": (warm_tok + ntok) / (te - t0),
        "tokens": int(ntok),
        "first_s": first_s,
        "cpu_s": cpu1 - cpu0,
        "cpu_main_timed_s": c1 - c0,
        "rss_mib": _hwm_kib() / 1024 or me.ru_maxrss / 1024,
        "rss_worker_mib": kids.ru_maxrss / 1024,
        "n_ids": int(all_ids.size),
        "unique_ids": int(np.unique(all_ids).size),
        "ids_hash": hashlib.sha1(all_ids.astype(np.int64).tobytes()).hexdigest()[:16],
        "first_ids": first_ids,
        "batch": batch,
        "close_error": close_error,
    }
    Path(out).write_text(json.dumps(res))
    return 0


# -- the parent: trees, dataset, rounds ------------------------------------------------
def git(*args: str, cwd: Path = ROOT) -> str:
    return subprocess.run(
        ["git", *args], cwd=cwd, capture_output=True, text=True, check=True
    ).stdout.strip()


def _short(text: str, n: int = 80) -> str:
    return text if len(text) <= n else text[:n].rsplit(" ", 1)[0] + " …"


def loadavg() -> str:
    try:
        return Path("/proc/loadavg").read_text().strip()
    except OSError:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())


def src_digest(src: Path) -> str:
    """sha1 over the paths and contents of the .py files under ``src``."""
    h = hashlib.sha1()
    for p in sorted(src.rglob("*.py")):
        h.update(str(p.relative_to(src)).encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()[:12]


def prepare_trees(base: str, tmp: Path) -> dict[str, dict[str, Any]]:
    """OLD: a clone at ``base``; NEW: a copy of the working tree's src/. Both byte-compiled."""
    try:
        rev = git("rev-parse", "--verify", "--quiet", f"{base}^{{commit}}")
    except subprocess.CalledProcessError:
        raise SystemExit(f"--base {base}: not a commit of {ROOT}") from None
    old = tmp / "old"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(old)], check=True)
    subprocess.run(["git", "-C", str(old), "checkout", "-q", rev], check=True)
    new = tmp / "new"
    shutil.copytree(
        ROOT / "src", new / "src", ignore=shutil.ignore_patterns("__pycache__", "*.pyc")
    )
    from machine import git_info

    trees = {
        "OLD": {
            "tree": str(old),
            "rev": git("rev-parse", "--short", rev),
            "subject": _short(git("log", "-1", "--format=%s", rev)),
            "what": f"commit {git('rev-parse', '--short', rev)}",
        },
        "NEW": {
            "tree": str(new),
            "rev": git("rev-parse", "--short", "HEAD"),
            "what": f"working tree at {git_info() or '?'}",
        },
    }
    for t in trees.values():
        t["src_digest"] = src_digest(Path(t["tree"]) / "src")
        subprocess.run(
            [sys.executable, "-m", "compileall", "-q", str(Path(t["tree"]) / "src")], check=True
        )
    return trees


def dataset(quick: bool, tmp: Path) -> tuple[str, dict[str, Any]]:
    """The dataset's URL and what it holds (see the module docstring)."""
    from dynamic_bench import _synthetic_documents, ensure_dataset

    import stoker

    if quick:  # written under tmp: --quick leaves benchmarks/.work/ alone but for its JSON
        url = str(tmp / "quick-data")
        stoker.write_tokens(
            _synthetic_documents(QUICK_TOKENS), url, vocab_size=32000, eos_id=0, overwrite=True
        )
        info: dict[str, Any] = {"source": "synthetic", "tokens": QUICK_TOKENS, "seed": SEED}
        m = stoker.TokenSource(url).manifest
        info.update(num_tokens=m.num_tokens, blocks=m.num_blocks, block_tokens=m.block_tokens)
        info["stored_bytes"] = sum(p.stat().st_size for p in Path(url).rglob("*") if p.is_file())
    else:
        url, info = ensure_dataset(FULL_TOKENS, synthetic=True)
    ds = stoker.TokenDataset(url, SEQ_LEN, batch_size=BATCH, seed=SEED)
    info["samples"] = ds.num_samples
    info["full_batches"] = ds.num_samples // BATCH
    info["url"] = url
    return url, info


def measure(
    side: str, tree: dict[str, Any], cfg: str, url: str, window: tuple[int, int], tmp: Path,
    n: int, timeout: float, order: str | None = None,
) -> dict[str, Any]:  # fmt: skip
    """One measurement in a fresh process (its whole session killed afterwards)."""
    out, log = tmp / f"run-{n}.json", tmp / f"run-{n}.log"
    env = dict(os.environ)
    env["PYTHONPATH"] = str(Path(tree["tree"]) / "src")
    for k in ("STOKER_COORDINATOR", "PYTHONDONTWRITEBYTECODE", "PYTHONSTARTUP"):
        env.pop(k, None)
    # -P: no benchmarks/ on sys.path in the child (only the tree under test and the venv)
    cmd = [sys.executable, "-P", str(Path(__file__).resolve()), "--child", cfg, "--url", url,
           "--warm", str(window[0]), "--timed", str(window[1]), "--tree", tree["tree"],
           "--out", str(out)] + (["--order", order] if order else [])  # fmt: skip
    t = time.perf_counter()
    with open(log, "wb") as lf:
        proc = subprocess.Popen(
            cmd, cwd=str(tmp), env=env, stdout=lf, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)  # anything it left behind (workers)
    text = log.read_text(errors="replace")
    if proc.returncode != 0 or not out.exists():
        raise RuntimeError(
            f"{side} {cfg}: exit {proc.returncode} without a result; its output:\n{text[-3000:]}"
        )
    res: dict[str, Any] = json.loads(out.read_text())
    res.update(side=side, wall_s=time.perf_counter() - t, loadavg=loadavg())
    if text.strip():
        res["output"] = text[-2000:]
    if not Path(res["stoker_file"]).is_relative_to(Path(tree["tree"]).resolve() / "src"):
        raise RuntimeError(f"{side} {cfg}: stoker imported from {res['stoker_file']}")
    return res


def check_ids(runs: list[dict[str, Any]], same_order: bool = True) -> list[str]:
    """What is wrong with the sample ids of ``runs`` (empty: nothing). Without
    ``same_order`` (the sides read different orders) each side's runs must agree."""
    problems = []
    for r in runs:
        if r["unique_ids"] != r["n_ids"]:
            problems.append(
                f"round {r['round'] + 1} {r['side']} {r['cfg']}: {r['n_ids']} timed samples but "
                f"only {r['unique_ids']} distinct ids"
            )
    for cfg, side in [(c, s) for c in CONFIGS for s in ([None] if same_order else SIDES)]:
        of = [r for r in runs if r["cfg"] == cfg and side in (None, r["side"])]
        seqs = {(r["side"], r["ids_hash"]) for r in of}
        if len({h for _, h in seqs}) > 1:
            problems.append(
                f"configuration {cfg}: the id sequences differ between runs: "
                + ", ".join(
                    f"round {r['round'] + 1} {r['side']} {r['ids_hash']} (first ids "
                    f"{r['first_ids']})"
                    for r in of
                )
            )
    return problems


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    med = statistics.median
    out: dict[str, Any] = {}
    for cfg in CONFIGS:
        by = {(r["round"], r["side"]): r for r in runs if r["cfg"] == cfg}
        if not by:
            continue
        rounds = sorted({k[0] for k in by})
        row: dict[str, Any] = {}
        for side in SIDES:
            rs = [by[(i, side)] for i in rounds if (i, side) in by]
            row[side] = {
                k: med(r[k] for r in rs)
                for k in ("tok_s", "first_s", "cpu_s", "cpu_main_timed_s", "rss_mib",
                          "rss_worker_mib", "timed_s")
            }  # fmt: skip
            row[side]["tok_s_all"] = [round(r["tok_s"]) for r in rs]
        ratios = [
            by[(i, "NEW")]["tok_s"] / by[(i, "OLD")]["tok_s"]
            for i in rounds
            if (i, "NEW") in by and (i, "OLD") in by
        ]
        row["ratio"] = med(ratios)
        whole = [
            by[(i, "NEW")]["whole_tok_s"] / by[(i, "OLD")]["whole_tok_s"]
            for i in rounds
            if (i, "NEW") in by and (i, "OLD") in by
        ]
        row["whole_ratio"] = med(whole)
        row["whole_ratios"] = [round(x, 3) for x in whole]
        row["ratios"] = [round(x, 3) for x in ratios]
        row["new_wins"] = sum(x > 1 for x in ratios)
        any_run = next(iter(by.values()))
        row["warm"], row["timed"] = any_run["warm"], any_run["timed"]
        out[cfg] = row
    return out


def _paragraph(k: int) -> str:
    """Paragraph ``k`` of the module docstring as markdown (bullets one per line)."""
    text = __doc__.split("\n\n")[k].replace("``", "`")
    return "\n* ".join(" ".join(b.split()) for b in ("\n" + text).split("\n* ")).strip() + "\n"


def _la(s: str) -> str:
    return "/".join(s.split()[:3])


def render(res: dict[str, Any]) -> str:
    m, d, s, t, p = res["machine"], res["dataset"], res["summary"], res["trees"], res["params"]
    old, new = t["OLD"], t["NEW"]
    lines = [
        HEADING,
        "",
        f"Command: `{res['command']}` (with `.venv/bin/python`). Run {res['when']}, took "
        f"{res['took']:.0f} s; every run in `benchmarks/.work/loader_ab/{res['results_file']}`.",
        "",
        f"Machine: {m.get('Model name', '?')} ({m.get('Architecture', '?')}), {m['cpus']} "
        f"cores, {m.get('Hypervisor vendor', 'no')} VM, Linux {m['kernel']}, Python "
        f"{m['python']}, torch {m['torch']}, numpy {m['numpy']}. Load average (1/5/15 min) "
        f"{_la(res['loadavg'][0])} at the start and {_la(res['loadavg'][1])} at the end. A "
        "shared 2-core sandbox: absolute rates move with other work on it, so read the "
        "per-round ratios of the interleaved rounds rather than the absolute rates.",
        "",
        f'OLD: commit {old["rev"]} ("{old["subject"]}"). NEW: the {new["what"]} (its src/ '
        f"copied at the start of the run, .py digest {new['src_digest']}). Every process "
        f"reported `stoker.__file__` under its own tree (`<clone at {old['rev']}>/src/stoker/"
        "__init__.py` and `<copy of the working tree>/src/stoker/__init__.py`).",
        "",
        *(_paragraph(k) for k in (3, 4, 5, 6)),
        f"Dataset: synthetic Zipf-distributed documents (vocab 32000) of "
        f"{d['num_tokens']:,} tokens ({d['blocks']} blocks of {d['block_tokens']:,} tokens, "
        f"zstd, {d['stored_bytes'] / 1e6:.1f} MB stored: stoker's defaults), "
        f"{d['samples']:,} samples, {d['full_batches']:,} full batches of {BATCH} per epoch.",
        "",
        f"| configuration | batches timed (after warm-up) | OLD tok/s (M, median of "
        f"{p['rounds']}) | NEW tok/s (M) | NEW/OLD (median of per-round ratios) | per-round "
        "NEW/OLD | from construction: NEW/OLD (per round) | CPU s OLD / NEW | peak RSS MiB "
        "OLD / NEW | first batch s OLD / NEW |",
        "|---|---:|---:|---:|---:|---|---|---:|---:|---:|",
    ]
    for cfg in CONFIGS:
        r = s.get(cfg)
        if r is None:
            continue
        o, n = r["OLD"], r["NEW"]

        def rss(x: dict[str, Any]) -> str:
            w = x["rss_worker_mib"]
            return f"{x['rss_mib']:.0f}" + (f" (largest worker {w:.0f})" if w >= 1 else "")

        lines.append(
            f"| {cfg}: {LABEL[cfg]} | {r['timed']:,} ({r['warm']}) | {o['tok_s'] / 1e6:.1f} | "
            f"{n['tok_s'] / 1e6:.1f} | {r['ratio']:.3f}x | "
            + " ".join(f"{x:.2f}" for x in r["ratios"])
            + f" | {r['whole_ratio']:.3f}x ("
            + " ".join(f"{x:.2f}" for x in r["whole_ratios"])
            + f") | {o['cpu_s']:.2f} / {n['cpu_s']:.2f} | {rss(o)} / {rss(n)} | "
            f"{o['first_s']:.3f} / {n['first_s']:.3f} |"
        )
    lines += [
        "",
        "From construction: tokens of every batch (first, warm-up, timed) over the time from "
        "constructing the dataset to the timed window's last batch, so that decoding read "
        "ahead before the window opened counts too; NEW/OLD as the median of the per-round "
        "ratios.",
        "",
        "CPU s: the loader process and its workers, from constructing the dataset to closing "
        "the loader (warm-up, timed window, shutdown). Peak RSS: `VmHWM` of the process "
        "(torch included), and of its largest worker where it has any.",
        "",
        f"Checks: in all {len(res['runs'])} runs the timed window delivered distinct sample "
        + (
            "ids, and OLD and NEW delivered the same id sequence in each configuration (sha1 of "
            "the timed ids: "
            + ", ".join(f"{c} {res['id_hashes'][c]}" for c in CONFIGS if c in res["id_hashes"])
            + ")."
            if res["params"].get("new_order") == "window"
            else "ids, and each side the same id sequence in every round (the sides read "
            f"different orders: OLD its window order, NEW {res['params'].get('new_order')!r})."
        ),
    ]
    slower = [c for c in CONFIGS if c in s and s[c]["ratio"] < 0.97]
    if slower:
        lines += [
            "",
            "NEW is more than 3% slower than OLD (median ratio) in "
            + ", ".join(
                f"{c} ({s[c]['ratio']:.3f}x; NEW faster in {s[c]['new_wins']} of "
                f"{len(s[c]['ratios'])} rounds)"
                for c in slower
            )
            + ".",
        ]
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", default="3a70ba9", help="the OLD revision (default 3a70ba9)")
    ap.add_argument("--rounds", type=int, help="interleaved rounds (default 7; 1 with --quick)")
    ap.add_argument("--quick", action="store_true", help="tiny dataset, one round, few batches")
    ap.add_argument("--timeout", type=float, default=600, help="seconds per process")
    ap.add_argument(
        "--new-order",
        help="the NEW tree's ShuffleConfig(order=...) (default: its own default); with "
        "another order than OLD's, each side's id sequences are checked on their own",
    )
    ap.add_argument(
        "--steady",
        action="store_true",
        help="warm up one whole epoch, then time two (the steady rate, past the readers' "
        "read-ahead at an epoch's start)",
    )
    ap.add_argument("--order", help=argparse.SUPPRESS)
    ap.add_argument("--child", help=argparse.SUPPRESS)
    for a in ("--url", "--tree", "--out"):
        ap.add_argument(a, help=argparse.SUPPRESS)
    for a in ("--warm", "--timed"):
        ap.add_argument(a, type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child(args.child, args.url, args.warm, args.timed, args.tree, args.out, args.order)

    sys.path.insert(0, str(BENCH))
    t0 = time.perf_counter()
    load0 = loadavg()
    print(f"loadavg at the start: {load0}", flush=True)
    rounds = args.rounds or (1 if args.quick else 7)
    windows = WINDOWS["quick" if args.quick else "full"]
    name = "results-quick.json" if args.quick else "results.json"
    argv = " ".join(shlex.quote(a) for a in sys.argv[1:])
    res: dict[str, Any] = {
        "command": f"python benchmarks/loader_ab.py{' ' + argv if argv else ''}",
        "when": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "results_file": name,
    }
    runs: list[dict[str, Any]] = []
    problems: list[str] = []
    with tempfile.TemporaryDirectory(prefix="loader-ab-") as td:
        tmp = Path(td)
        trees = prepare_trees(args.base, tmp)
        for side, t in trees.items():
            print(f"{side}: {t['what']} in {t['tree']} (src digest {t['src_digest']})", flush=True)
        url, info = dataset(args.quick, tmp)
        print(f"dataset {url}: {info}", flush=True)
        if args.steady:
            per = info["full_batches"] + (info["samples"] % BATCH > 0)  # a short last batch
            windows = {cfg: (per, 2 * per) for cfg in windows}
        for cfg, (warm, timed) in windows.items():
            if warm + timed > info["full_batches"] and not args.steady:
                raise SystemExit(
                    f"{cfg}: {warm} + {timed} batches, but an epoch has {info['full_batches']}"
                )
        from machine import platform_info

        res.update(machine=platform_info(), trees=trees, dataset=info)
        res["params"] = {
            "rounds": rounds,
            "windows": windows,
            "base": args.base,
            "new_order": args.new_order or "default",
            "steady": args.steady,
        }
        runs_dir = tmp / "runs"
        runs_dir.mkdir()
        n = 0
        try:
            for rnd in range(rounds):
                order = SIDES if rnd % 2 == 0 else SIDES[::-1]
                for cfg in CONFIGS:
                    for side in order:
                        n += 1
                        r = measure(
                            side, trees[side], cfg, url, windows[cfg], runs_dir, n, args.timeout,
                            args.new_order if side == "NEW" else None,
                        )  # fmt: skip
                        r["round"] = rnd
                        runs.append(r)
                        print(
                            f"round {rnd + 1}/{rounds} {cfg} {side}: {r['tok_s'] / 1e6:7.1f} M "
                            f"tok/s, first batch {r['first_s']:.3f} s, CPU {r['cpu_s']:.2f} s, "
                            f"RSS {r['rss_mib']:.0f} MiB, ids {r['ids_hash']} "
                            f"[{r['stoker_file']}]",
                            flush=True,
                        )
                        if r.get("close_error"):
                            print(f"  ! {r['close_error']}", flush=True)
                    # the base tree has one order, the window order: NEW's default differs
                    problems = check_ids(runs, same_order=args.new_order == "window")
                    if problems:
                        break
                if problems:
                    break
        except RuntimeError as exc:
            problems = [str(exc)]
    res["runs"] = runs
    res["loadavg"] = [load0, loadavg()]
    res["took"] = time.perf_counter() - t0
    print(f"loadavg at the end: {res['loadavg'][1]}", flush=True)
    WORK.mkdir(parents=True, exist_ok=True)
    if problems:
        res["problems"] = problems
        (WORK / name).write_text(json.dumps(res, indent=1))
        bar = "!" * 78
        print(f"\n{bar}\nFAILED (runs so far in {WORK / name}):", file=sys.stderr)
        for pr in problems:
            print(f"  * {pr}", file=sys.stderr)
        print(bar, file=sys.stderr)
        return 1
    res["summary"] = summarize(runs)
    res["id_hashes"] = {c: runs[[r["cfg"] for r in runs].index(c)]["ids_hash"] for c in CONFIGS}
    (WORK / name).write_text(json.dumps(res, indent=1))
    print()
    print(render(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
