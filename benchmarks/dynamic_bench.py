"""TokenLoader fed by the coordinator's leases against the static plan: tokens/s, first batch.

    .venv/bin/python benchmarks/dynamic_bench.py [--quick] [--synthetic] [--rounds R] [--profile]

One process reads whole epochs of one token dataset with ``TokenLoader``
(batches of (8, 2049), shuffle on, seed 0, one rank) for num_workers 0 and 2,
in three configurations:

* *static*: the static plan (no coordinator);
* *coordinator*: ``coordinator=CoordinatorClient(address)`` of a ``stoker
  coordinator`` subprocess on 127.0.0.1 (journal in a temporary directory,
  default lease settings), started fresh for each epoch before the clock starts;
* *rank0*: ``coordinator="rank0"``: the loader starts its own coordinator
  subprocess on its first iteration (that start is inside the time to the
  first batch).

Measured per epoch: time to the first batch (from constructing the dataset
and the loader), tokens/s after the first batch (the steady rate) and over the
whole epoch. The configurations run in R interleaved rounds (their order
rotating from round to round) so that background load on the machine hits all
alike; reported are medians over the rounds, and the dynamic/static ratio as
the median of the per-round ratios. Every epoch must deliver every sample id
exactly once, or the run fails.

The dataset (``benchmarks/.work/dynamic_bench/``, reused when its parameters
match): the documents of the real-text corpus of ``benchmarks/corpus.py`` when
it was built, cycled up to the token count, else synthetic Zipf-distributed
documents (``--synthetic`` forces those). ``--quick`` reads a tiny synthetic
dataset for one round and leaves docs/benchmarks.md alone.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import resource
import shlex
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

import stoker

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
WORK = BENCH / ".work" / "dynamic_bench"
CORPUS = BENCH / ".work"  # where benchmarks/corpus.py writes tokens.u16 and doc_lens.npy
sys.path.insert(0, str(BENCH))
from docsection import replace_section  # noqa: E402
from machine import git_info, platform_info, proc_cpu  # noqa: E402

HEADING = "## Dynamic loader: coordinator leases vs the static plan"
SEQ_LEN, BATCH, SEED = 2048, 8, 0
FULL_TOKENS, QUICK_TOKENS = 100_000_000, 1_000_000
CONFIGS = ("static", "coordinator", "rank0")
WORKERS = (0, 2)


# -- dataset ---------------------------------------------------------------------------
def _corpus_documents(target: int) -> Iterator[np.ndarray] | None:
    """The corpus's documents (EOS stripped; the writer appends it), cycled up to
    ``target`` tokens; None when the corpus was not built."""
    toks_path, lens_path = CORPUS / "tokens.u16", CORPUS / "doc_lens.npy"
    if not (toks_path.exists() and lens_path.exists()):
        return None
    toks = np.memmap(toks_path, dtype="<u2", mode="r")
    lens = np.load(lens_path).astype(np.int64)
    if len(toks) != int(lens.sum()):
        raise RuntimeError(f"{CORPUS}: tokens.u16 and doc_lens.npy disagree (being rebuilt?)")
    starts = np.concatenate([[0], np.cumsum(lens)[:-1]])

    def docs() -> Iterator[np.ndarray]:
        left = target
        while True:
            for s, n in zip(starts, lens, strict=True):
                n = min(int(n), left)
                yield toks[s : s + n - 1]
                left -= n
                if left <= 0:
                    return

    return docs()


def _synthetic_documents(target: int) -> Iterator[np.ndarray]:
    """Zipf-distributed tokens (vocab 32000, 0 is EOS) in documents of ~600 tokens."""
    rng = np.random.default_rng(SEED)
    left = target
    while left > 0:
        lens = np.maximum(rng.geometric(1 / 600, size=4096), 20)
        toks = np.minimum(rng.zipf(1.2, size=int(lens.sum())), 31999).astype(np.uint16)
        start = 0
        for n in lens:
            n = min(int(n), left)
            yield toks[start : start + n - 1]  # the writer appends EOS
            start += n
            left -= n
            if left <= 0:
                return


def ensure_dataset(tokens: int, synthetic: bool) -> tuple[str, dict[str, Any]]:
    """The dataset's URL (written unless an identical one exists) and what it holds."""
    docs = None if synthetic else _corpus_documents(tokens)
    source = "corpus" if docs is not None else "synthetic"
    if docs is None:
        docs = _synthetic_documents(tokens)
    out = WORK / f"{source}-{tokens}"
    stamp = {"source": source, "tokens": tokens, "seed": SEED, "format": 1}
    if source == "corpus":
        stamp["corpus_mtime"] = (CORPUS / "tokens.u16").stat().st_mtime
    stamp_path = out / "stamp.json"
    reused = stamp_path.exists() and json.loads(stamp_path.read_text()) == stamp
    t0 = time.perf_counter()
    if not reused:
        stamp_path.unlink(missing_ok=True)
        stoker.write_tokens(docs, str(out / "data"), vocab_size=32000, eos_id=0, overwrite=True)
        stamp_path.write_text(json.dumps(stamp))
    m = stoker.TokenSource(str(out / "data")).manifest
    info = {
        **stamp,
        "num_tokens": m.num_tokens,
        "blocks": m.num_blocks,
        "block_tokens": m.block_tokens,
        "stored_bytes": sum(p.stat().st_size for p in (out / "data").rglob("*") if p.is_file()),
        "write_s": None if reused else round(time.perf_counter() - t0, 1),
    }
    return str(out / "data"), info


# -- one epoch -------------------------------------------------------------------------
def start_coordinator(state: Path, num_samples: int) -> tuple[subprocess.Popen[str], str]:
    """A ``stoker coordinator`` on loopback; it exits when our end of its stdin closes."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "stoker.cli", "coordinator", "--state", str(state),
         "--world", "1", "--num-samples", str(num_samples), "--metrics-port", "-1",
         "--exit-with-parent"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )  # fmt: skip
    assert proc.stdout is not None
    seen = []
    for line in proc.stdout:
        seen.append(line)
        if "serving " in line:
            threading.Thread(target=proc.stdout.read, daemon=True).start()  # drain its log
            return proc, line.split("serving ")[1].split()[0]
    proc.wait()
    raise RuntimeError(f"the coordinator did not start (exit {proc.returncode}): {''.join(seen)}")


def stop(proc: subprocess.Popen[str]) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def own_cpu() -> tuple[float, float]:
    """CPU seconds of this process (all threads) and of its reaped children."""
    me, kids = (
        resource.getrusage(resource.RUSAGE_SELF),
        resource.getrusage(resource.RUSAGE_CHILDREN),
    )
    return me.ru_utime + me.ru_stime, kids.ru_utime + kids.ru_stime


def check_exactly_once(ids: np.ndarray, num_samples: int, what: str) -> None:
    """Every sample id of the epoch exactly once; raise with what went wrong otherwise."""
    counts = np.bincount(ids, minlength=num_samples) if len(ids) else np.zeros(num_samples)
    if len(counts) == num_samples and (counts == 1).all():
        return
    dup = int((counts[:num_samples] > 1).sum())
    missing = int((counts[:num_samples] == 0).sum())
    raise RuntimeError(
        f"{what}: the epoch delivered {len(ids)} samples of {num_samples}: {dup} ids more than "
        f"once, {missing} missing, {max(0, len(counts) - num_samples)} out of range"
    )


def epoch(url: str, config: str, nw: int, tmp: Path, profile: bool = False) -> dict[str, Any]:
    """Read one whole epoch; times and the exactly-once check."""
    ds = stoker.TokenDataset(url, SEQ_LEN, batch_size=BATCH, seed=SEED)
    num_samples = ds.num_samples
    del ds
    proc = None
    state = Path(tempfile.mkdtemp(prefix="journal-", dir=tmp))
    coordinator: Any = None
    start_s = None
    if config == "coordinator":
        t = time.perf_counter()
        proc, address = start_coordinator(state, num_samples)
        start_s = time.perf_counter() - t
        coordinator = stoker.CoordinatorClient(address)
    elif config == "rank0":
        coordinator = "rank0"
    prof = None
    if profile:
        import cProfile

        prof = cProfile.Profile()
        prof.enable()
    loader = None
    try:
        cpu0, coord0 = own_cpu(), None if proc is None else proc_cpu(proc.pid)
        t0 = time.perf_counter()
        ds = stoker.TokenDataset(url, SEQ_LEN, batch_size=BATCH, seed=SEED)
        loader = stoker.TokenLoader(
            ds,
            nw,
            coordinator=coordinator,
            coordinator_state=str(state) if config == "rank0" else None,
        )
        first = None
        tokens = first_tokens = 0
        # ids in one array filled in place (a small array kept per batch carves glibc's
        # freed batch-sized chunks: the heap can grow by a batch per batch)
        ids = np.empty(num_samples, dtype=np.int64)
        nids = batches = 0
        for batch in loader:
            if first is None:
                first = time.perf_counter()
                first_tokens = int(batch["tokens"].numel())
            tokens += int(batch["tokens"].numel())
            sid = batch["sample_id"].numpy()
            if nids + len(sid) > len(ids):  # more than an epoch: exactly-once says so below
                ids = np.concatenate([ids, np.empty(len(ids), dtype=np.int64)])
            ids[nids : nids + len(sid)] = sid
            nids += len(sid)
            batches += 1
        end = time.perf_counter()
        cpu1, coord1 = own_cpu(), None if proc is None else proc_cpu(proc.pid)
    finally:
        if prof is not None:
            prof.disable()
        if loader is not None:
            loader.close()
        if proc is not None:
            stop(proc)
    assert first is not None
    check_exactly_once(ids[:nids], num_samples, f"{config} num_workers={nw}")
    out = {
        "config": config,
        "num_workers": nw,
        "samples": nids,
        "batches": batches,
        "tokens": tokens,
        "first_s": first - t0,
        "epoch_s": end - t0,
        "tps": (tokens - first_tokens) / (end - first) if end > first else float("nan"),
        "tps_epoch": tokens / (end - t0),
        # CPU seconds over the epoch: this process (all threads), its workers (reaped when
        # the epoch ends), the standalone coordinator (None: none, or not measurable)
        "cpu_main": cpu1[0] - cpu0[0],
        "cpu_workers": cpu1[1] - cpu0[1],
        "coordinator_start_s": start_s,  # spawn to serving, before the clock starts
        "cpu_coordinator": None if coord0 is None or coord1 is None else coord1 - coord0,
    }
    if prof is not None:
        import io
        import pstats

        text = io.StringIO()
        pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(15)
        out["profile"] = text.getvalue()
    return out


# -- run and report --------------------------------------------------------------------
def machine_info() -> dict[str, Any]:
    import grpc

    info = {**platform_info(), "grpcio": grpc.__version__, "stoker": stoker.__version__}
    git = git_info()
    if git:
        info["git"] = git
    return info


def summarize(runs: list[dict[str, Any]], rounds: int) -> dict[str, Any]:
    """Medians per (num_workers, config); per-round dynamic/static ratios and their medians."""
    out: dict[str, Any] = {}
    for nw in WORKERS:
        for config in CONFIGS:
            rs = [r for r in runs if r["num_workers"] == nw and r["config"] == config]
            if not rs:
                continue
            row = {k: statistics.median(r[k] for r in rs) for k in ("tps", "tps_epoch", "first_s")}
            for k in ("cpu_main", "cpu_workers", "cpu_coordinator", "coordinator_start_s"):
                vals = [r[k] for r in rs if r.get(k) is not None]
                row[k] = statistics.median(vals) if vals else None
            out[f"{config}/nw{nw}"] = row
        static = {r["round"]: r for r in runs if r["num_workers"] == nw and r["config"] == "static"}
        for config in CONFIGS[1:]:
            ratios = [
                r["tps"] / static[r["round"]]["tps"]
                for r in runs
                if r["num_workers"] == nw and r["config"] == config and r["round"] in static
            ]
            if ratios:
                out[f"{config}/nw{nw}"]["ratio"] = statistics.median(ratios)
                out[f"{config}/nw{nw}"]["ratios"] = [round(x, 3) for x in ratios]
    return out


def _paragraph(k: int) -> str:
    """Paragraph ``k`` of the module docstring as markdown (bullets one per line), blank after."""
    text = __doc__.split("\n\n")[k].replace("``", "`")
    return "\n* ".join(" ".join(b.split()) for b in ("\n" + text).split("\n* ")).strip() + "\n"


def _cpu(r: dict[str, Any]) -> str:
    coord = r.get("cpu_coordinator")
    return f"{r['cpu_main']:.1f} / {r['cpu_workers']:.1f} / " + (
        "-" if coord is None else f"{coord:.1f}"
    )


def _costs(s: dict[str, Any], batches: int) -> list[str]:
    """Where the dynamic path's time goes, from the CPU columns (coordinator vs static)."""
    from stoker.coordinator.consumer import CONFIRM_WINDOW, GATHER_SECONDS

    out = []
    for nw in WORKERS:
        st, dyn = s.get(f"static/nw{nw}"), s.get(f"coordinator/nw{nw}")
        if st is None or dyn is None:
            continue
        coord = dyn.get("cpu_coordinator") or 0.0
        extra = dyn["cpu_main"] + dyn["cpu_workers"] + coord - st["cpu_main"] - st["cpu_workers"]
        out.append(
            f"num_workers={nw}: the coordinator configuration costs {extra:.1f} CPU seconds "
            f"per epoch more than the static plan ({extra / batches * 1e3:.2f} ms per batch): "
            f"loader process {dyn['cpu_main'] - st['cpu_main']:+.1f} s, workers "
            f"{dyn['cpu_workers'] - st['cpu_workers']:+.1f} s, coordinator {coord:.1f} s."
        )
    if out:
        out = [
            "Where the dynamic path's time goes (medians of the CPU columns; the `rank0` "
            "coordinator's CPU is not measured, it is the loader's private child): the loader "
            "confirms every batch with the coordinator before handing it out (`ConfirmBatch`, "
            f"sent on a thread, up to half the window or {GATHER_SECONDS * 1e3:.0f} ms of them per "
            "`Batch` message while the "
            f"rank does not wait, reading up to {CONFIRM_WINDOW} batches ahead of the confirms, "
            "a run of a consumer's full batches as one call; "
            "`src/stoker/coordinator/consumer.py`, `src/stoker/loader/coordinated.py`), "
            "leases add a call per lease (asked for half way through the one before), and the "
            "coordinator journals each message's calls in one write. Here the consumer does "
            "nothing with a batch, so that per-batch cost is the whole difference, on the same "
            "two cores as the reading.",
            "",
            *(f"* {x}" for x in out),
        ]
    starts = [r["coordinator_start_s"] for r in s.values() if r.get("coordinator_start_s")]
    if starts:
        out += [
            "",
            "Starting the standalone `stoker coordinator` process (spawn to serving, outside "
            f"the clock) took {statistics.median(starts):.2f} s (median); with "
            '`coordinator="rank0"` that start is inside the time to the first batch.',
        ]
    return out


LABEL = {
    "static": "static plan",
    "coordinator": "coordinator (`stoker coordinator` process, `CoordinatorClient`)",
    "rank0": '`coordinator="rank0"` (started by the loader)',
}


def render(res: dict[str, Any]) -> str:
    m, d, s, p = res["machine"], res["dataset"], res["summary"], res["params"]
    if d["source"] == "corpus":
        data = (
            "the documents of the real-text corpus of `benchmarks/corpus.py` (man pages, "
            "/usr/share/doc, Python docstrings; byte-level BPE, vocab 32000), cycled up to "
        )
    else:
        data = "synthetic Zipf-distributed documents (vocab 32000) of "
    lines = [
        HEADING,
        "",
        f"Command: `{res['command']}` (with `.venv/bin/python`). Run {res['when']}, took "
        f"{res['took']:.0f} s; raw results in `benchmarks/.work/dynamic_bench/"
        f"{res['results_file']}`.",
        "",
        f"Machine: {m.get('Model name', '?')} ({m.get('Architecture', '?')}), {m['cpus']} "
        f"cores, {m.get('Hypervisor vendor', 'no')} VM, Linux {m['kernel']}, Python "
        f"{m['python']}, torch {m['torch']}, numpy {m['numpy']}, grpcio {m['grpcio']}, "
        f"stoker {m['stoker']}" + (f" at commit {m['git']}" if m.get("git") else "") + ". "
        f"1-minute load average {res['loadavg'][0]:.2f} at the start and "
        f"{res['loadavg'][1]:.2f} at the end. This is a shared 2-core sandbox where other "
        "work may run at the same time: absolute numbers move with that load (and the "
        "loader, its workers and the coordinator all share the two cores), so read the "
        "ratios of the interleaved rounds rather than the absolute rates.",
        "",
        *(_paragraph(k) for k in (2, 3, 4)),
        f"Dataset: {data}{d['num_tokens']:,} tokens ({d['blocks']} blocks of "
        f"{d['block_tokens']:,} tokens, zstd, {d['stored_bytes'] / 1e6:.1f} MB stored: stoker's "
        f"defaults); {p['samples']:,} samples of {SEQ_LEN} "
        f"tokens, {p['batches']:,} batches of {BATCH} per epoch. Coordinator lease settings: "
        f"the defaults (leases of {p['lease_size']} positions, read-ahead "
        f"{p['readahead_s']:g} s of a consumer's rate).",
        "",
        f"| num_workers | configuration | tok/s after the first batch (M, median of "
        f"{p['rounds']}) | tok/s over the whole epoch (M) | first batch (s) | "
        "x static (steady tok/s, median of per-round ratios) | CPU s per epoch: loader "
        "process / its workers / standalone coordinator |",
        "|---:|---|---:|---:|---:|---:|---:|",
    ]
    for nw in WORKERS:
        for config in CONFIGS:
            r = s.get(f"{config}/nw{nw}")
            if r is None:
                continue
            ratio = f"{r['ratio']:.2f}x" if "ratio" in r else "1.00x"
            lines.append(
                f"| {nw} | {LABEL[config]} | {r['tps'] / 1e6:.1f} | {r['tps_epoch'] / 1e6:.1f} | "
                f"{r['first_s']:.3f} | {ratio} | {_cpu(r)} |"
            )
    lines += ["", *_costs(s, p["batches"])]
    lines += [
        "",
        "Every epoch of every configuration delivered each of the "
        f"{p['samples']:,} sample ids exactly once (checked per epoch).",
    ]
    if res.get("notes"):
        lines += ["", *res["notes"]]
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="tiny dataset, one round; docs untouched")
    ap.add_argument("--synthetic", action="store_true", help="synthetic documents, not the corpus")
    ap.add_argument("--rounds", type=int, help="interleaved rounds (default 5; 1 with --quick)")
    ap.add_argument(
        "--profile", action="store_true", help="print cProfile of one coordinator nw=0 epoch"
    )
    args = ap.parse_args()
    os.environ.pop("STOKER_COORDINATOR", None)  # "rank0" must start its own coordinator
    t0 = time.perf_counter()
    load0 = os.getloadavg()[0]
    rounds = args.rounds or (1 if args.quick else 5)
    tokens = QUICK_TOKENS if args.quick else FULL_TOKENS
    url, info = ensure_dataset(tokens, synthetic=args.synthetic or args.quick)
    print(f"dataset {url}: {info}", flush=True)
    ds = stoker.TokenDataset(url, SEQ_LEN, batch_size=BATCH, seed=SEED)
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="dynamic-bench-") as td:
        for rnd in range(rounds):
            order = CONFIGS[rnd % 3 :] + CONFIGS[: rnd % 3]
            for nw in WORKERS:
                for config in order:
                    r = epoch(url, config, nw, Path(td))
                    r["round"] = rnd
                    runs.append(r)
                    print(
                        f"round {rnd + 1}/{rounds} nw={nw} {config:11s} "
                        f"{r['tps'] / 1e6:6.1f} M tok/s (epoch {r['tps_epoch'] / 1e6:5.1f}), "
                        f"first batch {r['first_s']:.3f} s",
                        flush=True,
                    )
        if args.profile:
            print(epoch(url, "coordinator", 0, Path(td), profile=True)["profile"], flush=True)
    from stoker.coordinator.leases import Config

    name = "results-quick.json" if args.quick else "results.json"
    argv = " ".join(shlex.quote(a) for a in sys.argv[1:])
    res = {
        "command": f"python benchmarks/dynamic_bench.py{' ' + argv if argv else ''}",
        "when": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "took": time.perf_counter() - t0,
        "loadavg": [load0, os.getloadavg()[0]],
        "machine": machine_info(),
        "dataset": info,
        "params": {
            "rounds": rounds,
            "seq_len": SEQ_LEN,
            "batch_size": BATCH,
            "samples": ds.num_samples,
            "batches": -(-ds.num_samples // BATCH),
            "lease_size": Config.lease_size,
            "readahead_s": Config.readahead_seconds,
        },
        "summary": summarize(runs, rounds),
        "runs": runs,
        "results_file": name,
    }
    WORK.mkdir(parents=True, exist_ok=True)
    (WORK / name).write_text(json.dumps(res, indent=1))
    text = render(res)
    if not args.quick:
        replace_section(ROOT / "docs" / "benchmarks.md", HEADING, text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
