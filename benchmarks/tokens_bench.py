"""Token loading, side by side: stoker vs the memmap floor vs MosaicML Streaming, LitData, WebDataset.

Every system reads the same token corpus (``benchmarks/corpus.py``) and produces
shuffled packed batches of shape (8, 2049) as int64 torch tensors. Each
measurement runs in a fresh process with the system's own interpreter:
``.venv`` for stoker and the memmap floor, ``.venv-peers`` for the peers (see
``benchmarks/requirements-peers.txt``). The adapters are in ``benchmarks/peers/``.

Usage::

    .venv/bin/python benchmarks/tokens_bench.py            # full run, writes docs/benchmarks.md
    .venv/bin/python benchmarks/tokens_bench.py --quick    # seconds: tiny slice, stoker + memmap

Measured per system (medians over ``--repeats`` fresh processes):

* tokens/s with num_workers 0 and 2, warm (data on local disk, page cache and
  the system's own caches filled), over a fixed number of batches after a warm-up;
* time to the first batch, warm (local) and cold (empty local cache, data served
  by nginx over HTTP on 127.0.0.1: ``tests/servers.py``'s ``NginxOrigin``);
* bytes on storage;
* peak RSS of the consuming process and its children at num_workers=0;
* resume: time from process spawn to the first batch after resuming at 40% of
  an epoch, and whether the next batches equal those of an uninterrupted run.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as _dt
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
WORK = BENCH / ".work" / "tokens_bench"
DOC = ROOT / "docs" / "benchmarks.md"
SECTION = "## Token loading: stoker vs peers"
PY_MAIN = ROOT / ".venv" / "bin" / "python"
if not PY_MAIN.exists():  # e.g. CI with stoker installed elsewhere: use this interpreter
    PY_MAIN = Path(sys.executable)
PY_PEERS = ROOT / ".venv-peers" / "bin" / "python"

sys.path.insert(0, str(BENCH))
from docsection import replace_section  # noqa: E402
from machine import git_info, lscpu  # noqa: E402
from peers import SYSTEMS  # noqa: E402
from peers.common import BATCH, SEQ_LEN, WINDOW, Corpus, dir_bytes  # noqa: E402

PEER_KEYS = ("mosaic_streaming", "litdata_peer", "webdataset_peer")
STOKER_KEYS = ("stoker_dl", "stoker_loader")
# read-only venv metadata for each system (what the adapter module says)
META = {
    "memmap_floor": ("memmap floor", "main"),
    "stoker_dl": ("stoker TokenDataset + DataLoader", "main"),
    "stoker_loader": ("stoker TokenLoader", "main"),
    "mosaic_streaming": ("MosaicML Streaming", "peers"),
    "litdata_peer": ("LitData", "peers"),
    "webdataset_peer": ("WebDataset", "peers"),
}


# ---------------------------------------------------------------------------------------
# corpus snapshot
# ---------------------------------------------------------------------------------------


def _synthetic_corpus(out: Path, num_tokens: int) -> Corpus:
    """A small Zipf-distributed token stream, for --quick where the real corpus is absent."""
    rng = np.random.default_rng(0)
    lens: list[int] = []
    total = 0
    while total < num_tokens:
        n = int(min(max(rng.geometric(1 / 600), 20), num_tokens - total))
        lens.append(n)
        total += n
    toks = np.minimum(rng.zipf(1.2, size=total), 31999).astype("<u2")
    ends = np.cumsum(lens) - 1
    toks[toks == 0] = 1
    toks[ends] = 0
    out.mkdir(parents=True, exist_ok=True)
    toks.tofile(out / "tokens.u16")
    np.save(out / "doc_lens.npy", np.asarray(lens, dtype=np.int64))
    return Corpus(str(out), total, len(lens), 32000, 0)


def snapshot_corpus(max_tokens: int | None, quick: bool) -> tuple[Corpus, dict[str, Any]]:
    """Copy a prefix of whole documents of the corpus to WORK/corpus (stable during the run)."""
    info: dict[str, Any] = {}
    src_dir: Path | None = None
    try:
        import corpus as corpus_mod

        needed = ("tokens.u16", "doc_lens.npy", "meta.json")
        if quick and not all((corpus_mod.WORK_DIR / n).exists() for n in needed):
            raise FileNotFoundError("corpus not built; --quick does not build it")
        src_dir = Path(corpus_mod.ensure_corpus())
    except Exception as exc:
        if not quick:
            raise
        info["synthetic"] = f"real corpus unavailable ({exc}); synthetic Zipf tokens"
        c = _synthetic_corpus(WORK / "corpus-synthetic", max_tokens or 400_000)
        info.update(source="synthetic", tokens=c.num_tokens, docs=c.num_docs)
        return c, info
    meta = json.loads((src_dir / "meta.json").read_text())
    lens = np.load(src_dir / "doc_lens.npy").astype(np.int64)
    ends = np.cumsum(lens)
    if max_tokens is None or max_tokens >= int(ends[-1]):
        ndocs = len(lens)
    else:
        ndocs = max(1, int(np.searchsorted(ends, max_tokens, side="right")))
    ntok = int(ends[ndocs - 1])
    out = WORK / "corpus"
    out.mkdir(parents=True, exist_ok=True)
    stamp = {
        "src_tokens": int(ends[-1]),
        "src_mtime": (src_dir / "tokens.u16").stat().st_mtime,
        "docs": ndocs,
        "tokens": ntok,
    }
    stamp_path = out / "stamp.json"
    if not (stamp_path.exists() and json.loads(stamp_path.read_text()) == stamp):
        src = np.memmap(src_dir / "tokens.u16", dtype="<u2", mode="r")
        if len(src) != int(ends[-1]):
            raise RuntimeError(f"{src_dir}: tokens.u16 and doc_lens.npy disagree (being rebuilt?)")
        np.asarray(src[:ntok]).tofile(out / "tokens.u16")
        np.save(out / "doc_lens.npy", lens[:ndocs])
        stamp_path.write_text(json.dumps(stamp))
    info.update(
        source=str(src_dir),
        corpus_tokens=int(ends[-1]),
        corpus_docs=len(lens),
        tokens=ntok,
        docs=ndocs,
        text_mb=meta.get("text_mb"),
        sources=meta.get("per_source"),
    )
    return Corpus(str(out), ntok, ndocs, int(meta["vocab_size"]), int(meta["eos_id"])), info


# ---------------------------------------------------------------------------------------
# child processes
# ---------------------------------------------------------------------------------------


class Runner:
    def __init__(self, corpus: Corpus, verbose: bool) -> None:
        self.corpus = corpus
        self.verbose = verbose
        self.tmp = Path(tempfile.mkdtemp(prefix="tokens-bench-"))
        self.n = 0

    def python(self, key: str) -> Path:
        return PY_MAIN if META[key][1] == "main" else PY_PEERS

    def call(self, key: str, mode: str, timeout: float = 300, **kw: Any) -> dict[str, Any]:
        self.n += 1
        out = self.tmp / f"out-{self.n}.json"
        scratch = self.tmp / f"scratch-{self.n}"
        scratch.mkdir()
        cmd = [str(self.python(key)), "-m", "peers.worker", "--system", key, "--mode", mode]
        cmd += ["--out", str(out), "--corpus", self.corpus.to_json(), "--scratch", str(scratch)]
        for k, v in kw.items():
            if v is not None:
                cmd += [f"--{k.replace('_', '-')}", str(v)]
        env = dict(os.environ)
        env["PYTHONPATH"] = str(BENCH)
        env["NO_PROXY"] = env["no_proxy"] = "127.0.0.1,localhost"
        env.pop("VIRTUAL_ENV", None)
        env.pop("PYTHONDONTWRITEBYTECODE", None)  # cached bytecode, as users have it
        env.setdefault("TOKENIZERS_PARALLELISM", "false")
        log = self.tmp / f"log-{self.n}.txt"
        t0 = time.time()
        with open(log, "wb") as lf:
            proc = subprocess.Popen(
                [*cmd, "--t0", repr(t0)],
                cwd=str(scratch),
                env=env,
                stdout=lf,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                return {"ok": False, "error": f"timed out after {timeout:.0f} s"}
        # reap anything the child left in its session (DataLoader workers, servers)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        shutil.rmtree(scratch, ignore_errors=True)
        if not out.exists():
            tail = log.read_text(errors="replace")[-3000:]
            return {"ok": False, "error": f"exit {proc.returncode} without a result:\n{tail}"}
        res = json.loads(out.read_text())
        if not res.get("ok") and self.verbose:
            print(f"    ! {key} {mode}: {res.get('error')}", flush=True)
            print(res.get("traceback", ""), flush=True)
        return res

    def close(self) -> None:
        shutil.rmtree(self.tmp, ignore_errors=True)


def median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def _ok(results: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], str | None]:
    good = [r for r in results if r.get("ok")]
    bad = [r.get("error", "?") for r in results if not r.get("ok")]
    return good, (bad[0].splitlines()[0][:300] if bad else None)


# ---------------------------------------------------------------------------------------
# the benchmark
# ---------------------------------------------------------------------------------------


def _summarize(r: dict[str, Any], raw: dict[str, list[dict[str, Any]]]) -> None:
    """Medians of the raw per-process results into ``r``."""

    def good(name: str) -> list[dict[str, Any]]:
        ok, err = _ok(raw.get(name, []))
        if err:
            r["errors"][name] = err
        return ok

    for nw in (0, 2):
        g = good(f"throughput_nw{nw}")
        r[f"tps_nw{nw}"] = median([x["tokens_per_s"] for x in g])
        r[f"tps_nw{nw}_all"] = [round(x["tokens_per_s"]) for x in g]
        if nw == 0 and g:
            r["peak_rss"] = median([max(x["peak_rss_tree"], x["maxrss_self"]) for x in g])
            r["rss_after_import"] = median([x["rss_after_import"] for x in g])
            r["import_s"] = median([x["import_s"] for x in g])
    for name in ("first_warm", "first_cold", "first_cold_local"):
        if name in raw:
            g = good(name)
            r[name] = median([x["first_s"] for x in g])
            r[f"{name}_all"] = [round(x["first_s"], 4) for x in g]
    if "resume" in raw:
        g = good("resume")
        ref = raw["resume_ref"][0]
        r["resume_from_spawn"] = median([x["from_spawn_s"] for x in g])
        r["resume_from_spawn_all"] = [round(x["from_spawn_s"], 3) for x in g]
        r["resume_import_done"] = median([x["spawn_to_import_done_s"] for x in g])
        # what the system itself adds after interpreter start + numpy/torch import
        r["resume_own"] = median([x["import_s"] + x["first_s"] for x in g])
        r["resume_base"] = median([x["spawn_to_base_done_s"] for x in g])
        r["resume_first"] = median([x["first_s"] for x in g])
        r["resume_exact"] = bool(g) and all(x["hashes"] == ref["hashes"] for x in g)


def bench_all(
    run: Runner,
    keys: list[str],
    data_dirs: dict[str, Path],
    origin: Any,
    args: argparse.Namespace,
    epoch_batches: int,
) -> dict[str, dict[str, Any]]:
    """Every measurement, ``args.repeats`` rounds, the systems interleaved within a round.

    Interleaving spreads slow drifts of the machine's background load over all systems
    instead of penalising whichever ran during a busy minute.
    """
    say = (lambda *a: print("   ", *a, flush=True)) if args.verbose else (lambda *a: None)
    raw: dict[str, dict[str, list[dict[str, Any]]]] = {k: {} for k in keys}
    out: dict[str, dict[str, Any]] = {
        k: {"key": k, "label": META[k][0], "errors": {}} for k in keys
    }

    def add(key: str, name: str, res: dict[str, Any]) -> dict[str, Any]:
        raw[key].setdefault(name, []).append(res)
        return res

    def fresh_cache(tag: str) -> Path:
        cache = run.tmp / f"cache-{tag}"
        shutil.rmtree(cache, ignore_errors=True)
        cache.mkdir()
        return cache

    skip = int(epoch_batches * 0.4)
    for key in keys:
        r = out[key]
        http = args.http_support.get(key)
        if http is not True:
            r["cold_note"] = http or "no HTTP path"
        elif origin is None:
            r["cold_note"] = "nginx not available"
        r["resume_at_batch"] = skip
        r["resume_kind"] = args.resume_kind.get(key)

    for rep in range(args.repeats):
        print(f"  round {rep + 1}/{args.repeats}", flush=True)
        for key in keys:
            data = str(data_dirs[key])
            for nw in (0, 2):
                res = add(
                    key,
                    f"throughput_nw{nw}",
                    run.call(
                        key,
                        "throughput",
                        data=data,
                        num_workers=nw,
                        warmup=args.warmup,
                        batches=args.batches,
                    ),
                )
                say(
                    f"{key} nw={nw}: {_mtps(res.get('tokens_per_s'))} M tok/s {res.get('error', '')}"
                )
            res = add(key, "first_warm", run.call(key, "first", data=data))
            say(f"{key} first warm: {_f(res.get('first_s'), '.3f')} s {res.get('error', '')}")
            if args.http_support.get(key) is True and origin is not None:
                cache = fresh_cache(f"{key}-{rep}")
                url = origin.url_for(data_dirs[key].name)
                res = add(
                    key,
                    "first_cold",
                    run.call(key, "first", data=data, remote=url, cache=str(cache)),
                )
                shutil.rmtree(cache, ignore_errors=True)
                say(
                    f"{key} first cold HTTP: {_f(res.get('first_s'), '.3f')} s {res.get('error', '')}"
                )
            if args.cold_local.get(key):
                cache = fresh_cache(f"{key}-{rep}")
                res = add(
                    key,
                    "first_cold_local",
                    run.call(key, "first", data=data, remote=data, cache=str(cache)),
                )
                shutil.rmtree(cache, ignore_errors=True)
                say(
                    f"{key} first cold local: {_f(res.get('first_s'), '.3f')} s {res.get('error', '')}"
                )

    resumable = [k for k in keys if out[k]["resume_kind"] in ("state", "skip")]
    states: dict[str, Path] = {}
    for key in resumable:
        state = run.tmp / f"state-{key}.pkl"
        ref = run.call(
            key, "resume_ref", data=str(data_dirs[key]), skip=skip, state=str(state), timeout=900
        )
        if not ref.get("ok"):
            out[key]["errors"]["resume_ref"] = ref.get("error", "?").splitlines()[0][:300]
            continue
        out[key]["state_bytes"] = ref["state_bytes"]
        raw[key]["resume_ref"] = [ref]
        states[key] = state
    for rep in range(args.resume_repeats):
        print(f"  resume round {rep + 1}/{args.resume_repeats}", flush=True)
        for key in states:
            res = add(
                key,
                "resume",
                run.call(
                    key, "resume", data=str(data_dirs[key]), state=str(states[key]), timeout=900
                ),
            )
            say(f"{key} resume: {_f(res.get('from_spawn_s'), '.2f')} s {res.get('error', '')}")

    for key in keys:
        _summarize(out[key], raw[key])
        out[key]["raw"] = raw[key]
    return out


def bench_smoke(
    run: Runner, key: str, data: Path, origin: Any, args: argparse.Namespace, epoch_batches: int
) -> dict[str, Any]:
    """--quick: every measurement once, all in one process per system (a smoke test)."""
    r: dict[str, Any] = {"key": key, "label": META[key][0], "errors": {}}
    remote = None
    if args.http_support.get(key) is True and origin is not None:
        remote = origin.url_for(data.name)
    cache = run.tmp / f"smoke-cache-{key}"
    cache.mkdir(exist_ok=True)
    skip = int(epoch_batches * 0.4)
    res = run.call(
        key,
        "smoke",
        data=str(data),
        remote=remote,
        cache=str(cache) if remote else None,
        num_workers=0,
        warmup=args.warmup,
        batches=args.batches,
        skip=skip,
        state=str(run.tmp / f"state-{key}.pkl"),
    )
    r["versions"] = res.get("versions")
    if res.get("pending"):
        r["errors"]["pending"] = res["pending"]
        r["pending"] = True
        return r
    if not res.get("ok"):
        r["errors"]["smoke"] = res.get("error", "?").splitlines()[0][:300]
        return r
    t0, t2 = res["throughput_nw0"], res["throughput_nw2"]
    r.update(
        tps_nw0=t0["tokens_per_s"],
        tps_nw2=t2["tokens_per_s"],
        peak_rss=max(t0["peak_rss_tree"], t0["maxrss_self"]),
        rss_after_import=t0["rss_after_import"],
        first_warm=res["first"]["first_s"],
        first_cold=res.get("first_cold", {}).get("first_s"),
        cold_note=None if remote else _cold_note(args.http_support.get(key)),
        resume_kind=args.resume_kind.get(key),
        resume_at_batch=skip,
    )
    if "resume" in res:
        r["resume_first"] = res["resume"]["first_s"]
        r["resume_exact"] = res["resume"]["hashes"] == res["resume_ref"]["hashes"]
    print(
        f"    {key}: nw0 {r['tps_nw0'] / 1e6:.1f}M tok/s, nw2 {r['tps_nw2'] / 1e6:.1f}M tok/s, "
        f"first {r['first_warm']:.3f}s, cold {_f(r['first_cold'], '.3f')}s, "
        f"resume exact {r.get('resume_exact')}",
        flush=True,
    )
    return r


def check_available(run: Runner, keys: list[str]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for key in keys:
        py = run.python(key)
        if not py.exists():
            out[key] = {"ok": False, "error": f"{py} does not exist (peer venv not created)"}
            continue
        res = run.call(key, "versions", timeout=180)
        out[key] = res
    return out


def adapter_facts(keys: list[str]) -> dict[str, dict[str, Any]]:
    """HTTP, COLD_LOCAL and RESUME of each adapter, read from its source (no peer imports here)."""
    import ast

    facts: dict[str, dict[str, Any]] = {"HTTP": {}, "COLD_LOCAL": {}, "RESUME": {}}
    for key in keys:
        tree = ast.parse((BENCH / "peers" / f"{key}.py").read_text())
        for node in tree.body:
            if isinstance(node, ast.Assign) and len(node.targets) == 1:
                name = getattr(node.targets[0], "id", None)
                if name in facts:
                    facts[name][key] = ast.literal_eval(node.value)
    return facts


def machine_info() -> dict[str, Any]:
    info: dict[str, Any] = {"python": platform.python_version(), "kernel": platform.release()}
    info.update(lscpu())
    with contextlib.suppress(OSError, ValueError):
        with open("/proc/meminfo") as f:
            kb = int(f.readline().split()[1])
        info["ram_gib"] = round(kb / 2**20, 1)
    nginx = shutil.which("nginx") or "/usr/sbin/nginx"
    with contextlib.suppress(OSError):
        v = subprocess.run([nginx, "-v"], capture_output=True, text=True)
        info["nginx"] = (v.stderr or v.stdout).strip().replace("nginx version: ", "")
    return info


def start_origin(root: Path) -> tuple[Any, str | None]:
    sys.path.insert(0, str(ROOT / "tests"))
    try:
        from servers import NginxOrigin, find_nginx
    except Exception as exc:
        return None, f"tests/servers.py not importable: {exc}"
    if find_nginx() is None:
        return None, "nginx not installed"
    try:
        return NginxOrigin(root, prefix=WORK / "nginx").start(), None
    except Exception as exc:
        return None, f"nginx did not start: {exc}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="tiny slice, stoker + memmap only")
    ap.add_argument(
        "--systems", default=None, help="comma-separated subset of " + ",".join(SYSTEMS)
    )
    ap.add_argument("--max-tokens", type=int, default=None, help="corpus prefix (whole docs)")
    ap.add_argument("--repeats", type=int, default=None)
    ap.add_argument("--resume-repeats", type=int, default=None)
    ap.add_argument("--warmup", type=int, default=None)
    ap.add_argument("--batches", type=int, default=None)
    ap.add_argument("--no-doc", action="store_true", help="do not update docs/benchmarks.md")
    ap.add_argument("--keep-data", action="store_true", help="reuse written datasets if present")
    ap.add_argument("-q", "--quiet", action="store_true")
    ap.add_argument(
        "--render-only",
        action="store_true",
        help="rewrite the docs section from the last results.json without measuring",
    )
    args = ap.parse_args(argv)
    if args.render_only:
        results = json.loads((WORK / "results.json").read_text())
        section = render(results)
        print(section)
        if not args.no_doc:
            replace_section(DOC, SECTION, section)
        return 0
    args.verbose = not args.quiet
    args.resume_repeats = args.resume_repeats or (args.repeats or 3) + 2
    t_start = time.time()
    load_start = round(os.getloadavg()[0], 2)
    if args.quick:
        args.max_tokens = args.max_tokens or 400_000
        args.repeats = args.repeats or 1
        args.warmup = args.warmup if args.warmup is not None else 2
        args.batches = args.batches or 8
        keys = ["memmap_floor", *STOKER_KEYS]
    else:
        args.repeats = args.repeats or 3
        args.warmup = args.warmup if args.warmup is not None else 50
        keys = list(SYSTEMS)
    if args.systems:
        keys = [k for k in args.systems.split(",") if k]
        unknown = set(keys) - set(SYSTEMS)
        if unknown:
            ap.error(f"unknown systems: {sorted(unknown)}")

    corpus, corpus_info = snapshot_corpus(args.max_tokens, args.quick)
    epoch_batches = corpus.num_samples // BATCH
    if args.batches is None:  # most of an epoch: per-epoch costs amortise as in training
        args.batches = max(10, int(epoch_batches * 0.85) - args.warmup)
    need = args.warmup + args.batches
    if need > epoch_batches:
        ap.error(f"{need} batches per run but an epoch has only {epoch_batches}")
    print(
        f"corpus: {corpus.num_tokens:,} tokens, {corpus.num_docs:,} docs, "
        f"{corpus.num_samples:,} samples of {WINDOW}, {epoch_batches} batches/epoch",
        flush=True,
    )
    run = Runner(corpus, args.verbose)
    data_root = WORK / ("data-quick" if args.quick else "data")
    data_root.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {
        "command": "python benchmarks/tokens_bench.py" + (" --quick" if args.quick else ""),
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "machine": machine_info(),
        "git": git_info(),
        "corpus": corpus_info,
        "params": {
            "seq_len": SEQ_LEN,
            "batch": BATCH,
            "repeats": args.repeats,
            "resume_repeats": args.resume_repeats,
            "warmup": args.warmup,
            "batches": args.batches,
            "epoch_batches": epoch_batches,
            "raw_bytes": corpus.num_tokens * 2,
        },
        "systems": {},
        "unavailable": {},
        "versions": {},
    }
    origin = None
    try:
        # --quick learns versions from its one process per system (saves interpreter starts)
        avail = {k: {"ok": True, "versions": {}} for k in keys} if args.quick else None
        avail = avail or check_available(run, keys)
        facts = adapter_facts(keys)
        args.http_support, args.resume_kind = facts["HTTP"], facts["RESUME"]
        args.cold_local = facts["COLD_LOCAL"]
        present = []
        for key in keys:
            a = avail[key]
            if not a.get("ok"):
                results["unavailable"][key] = a.get("error", "?").splitlines()[0][:400]
                print(f"  {key}: unavailable: {results['unavailable'][key]}", flush=True)
                continue
            results["versions"][key] = a["versions"]
            if a.get("pending"):
                results["unavailable"][key] = a["pending"]
                print(f"  {key}: {a['pending']}", flush=True)
                continue
            present.append(key)

        # write each system's dataset (stoker TokenLoader reads the stoker_dl dataset)
        data_dirs: dict[str, Path] = {}
        prepared: dict[str, dict[str, Any]] = {}
        for key in present:
            writer = "stoker_dl" if key == "stoker_loader" else key
            if writer == "memmap_floor":
                data_dirs[key] = Path(corpus.dir)
                results["systems"][key] = {"bytes": corpus.num_tokens * 2}
                continue
            d = data_root / writer
            if writer not in prepared:
                marker = data_root / f"{writer}.ok"
                if args.keep_data and marker.exists():
                    prep = json.loads(marker.read_text())
                else:
                    marker.unlink(missing_ok=True)
                    print(f"  writing {writer} ...", flush=True)
                    prep = run.call(writer, "prepare", data=str(d), timeout=1200)
                    if prep.get("ok"):
                        marker.write_text(json.dumps(prep))
                prepared[writer] = prep
            prep = prepared[writer]
            if not prep.get("ok"):
                results["unavailable"][key] = "writing failed: " + prep.get("error", "?")[:400]
                continue
            data_dirs[key] = d
            results["systems"][key] = {"bytes": dir_bytes(d), "write_notes": prep.get("notes")}
            if writer == key:
                results["systems"][key]["write_s"] = prep["write_s"]

        origin, why = start_origin(data_root)
        if origin is None:
            print(f"  cold runs skipped: {why}", flush=True)
            results["origin"] = why
        measured = [k for k in keys if k in data_dirs and k not in results["unavailable"]]
        if args.quick:
            for key in measured:
                print(f"  measuring {key} ...", flush=True)
                r = bench_smoke(run, key, data_dirs[key], origin, args, epoch_batches)
                if r.pop("pending", None):
                    results["unavailable"][key] = r["errors"].get("pending", "pending")
                    results["systems"].pop(key, None)
                    continue
                if r.get("versions"):
                    results["versions"][key] = r.pop("versions")
                results["systems"][key].update(r)
        else:
            for key, r in bench_all(run, measured, data_dirs, origin, args, epoch_batches).items():
                results["systems"][key].update(r)
    finally:
        if origin is not None:
            origin.stop()
        run.close()
    results["elapsed_s"] = round(time.time() - t_start, 1)
    results["loadavg"] = {"start": load_start, "end": round(os.getloadavg()[0], 2)}
    name = "results-quick.json" if args.quick else "results.json"
    results["results_file"] = name
    (WORK / name).write_text(json.dumps(results, indent=1))
    section = render(results)
    print()
    print(section)
    if not args.quick and not args.no_doc:
        replace_section(DOC, SECTION, section)
        print(f"wrote {DOC.relative_to(ROOT)}", flush=True)
    # stoker and the floor must work (peers may be missing); resumes must be exact
    bad = [
        f"{k}: {s.get('errors') or 'resume not exact'}"
        for k, s in results["systems"].items()
        if k in ("memmap_floor", *STOKER_KEYS)
        and (s.get("errors") or s.get("resume_exact") is False)
    ]
    for line in bad:
        print(f"FAILED {line}", file=sys.stderr)
    return 1 if bad else 0


# ---------------------------------------------------------------------------------------
# report
# ---------------------------------------------------------------------------------------


def _f(x: Any, fmt: str, none: str = "n/a") -> str:
    return none if x is None else format(x, fmt)


def _mtps(x: float | None) -> str:
    return "n/a" if x is None else f"{x / 1e6:.2f}"


def _mib(x: float | None) -> str:
    return "n/a" if x is None else f"{x / 2**20:.0f}"


def _rss_delta(s: dict[str, Any]) -> float | None:
    if s.get("peak_rss") is None or s.get("rss_after_import") is None:
        return None
    return s["peak_rss"] - s["rss_after_import"]


def _cold_note(http: Any) -> str:
    """Why a reader has no cold figure here: no HTTP path (``http`` says why), or none
    with one (``http`` is True) because no nginx ran."""
    return "nginx not available" if http is True else (http or "no HTTP path")


def _short(s: str | None) -> str:
    if not s:
        return "?"
    return s.split(":")[0].split(";")[0]


def render(res: dict[str, Any]) -> str:
    systems = res["systems"]
    raw = res["params"]["raw_bytes"]
    order = [k for k in SYSTEMS if k in systems and "tps_nw0" in systems[k]]
    lines = [SECTION, ""]
    lines += render_context(res)
    lines += [
        "| system | tok/s nw=0 (M) | tok/s nw=2 (M) | first batch warm (s) | "
        "first batch cold, HTTP (s) | first batch cold, local copy (s) | "
        "resume @40%: spawn to batch (s) | resume exact | storage MB (x raw) | "
        "peak RSS nw=0 MiB (after imports; delta) |",
        "|---|---:|---:|---:|---:|---:|---:|---|---:|---:|",
    ]
    for k in order:
        s = systems[k]
        cold = _f(s.get("first_cold"), ".3f", none=f"n/a ({_short(s.get('cold_note'))})")
        cold_local = _f(s.get("first_cold_local"), ".3f")
        rk = s.get("resume_kind")
        if rk in ("state", "skip"):
            resume = _f(s.get("resume_from_spawn"), ".2f")
            if s.get("resume_first") is not None:
                resume += f" ({s['resume_first']:.3f} after imports)"
            if rk == "skip":
                resume += ", skip-ahead"
            exact = {True: "yes", False: "**no**", None: "n/a"}[s.get("resume_exact")]
        else:
            resume, exact = f"not supported ({rk})", "n/a"
        lines.append(
            f"| {s['label']} | {_mtps(s.get('tps_nw0'))} | {_mtps(s.get('tps_nw2'))} | "
            f"{_f(s.get('first_warm'), '.3f')} | {cold} | {cold_local} | {resume} | {exact} | "
            f"{s['bytes'] / 1e6:.1f} ({s['bytes'] / raw:.2f}x) | "
            f"{_mib(s.get('peak_rss'))} ({_mib(s.get('rss_after_import'))}; "
            f"+{_mib(_rss_delta(s))}) |"
        )
    for k, why in res["unavailable"].items():
        lines.append(f"| {META[k][0]} | {why} |" + " |" * 8)
    lines.append("")
    lines += render_ratios(res)
    lines += render_notes(res)
    lines += render_errors(res)
    return "\n".join(lines).rstrip() + "\n"


def render_context(res: dict[str, Any]) -> list[str]:
    m = res["machine"]
    c = res["corpus"]
    p = res["params"]
    vers = res["versions"]
    main_v = dict(vers.get("memmap_floor", {}))
    main_v.update(vers.get("stoker_dl", {}))
    main_v.update(vers.get("stoker_loader", {}))
    main_v.pop("pending", None)
    peer_v: dict[str, str] = {}
    for k in PEER_KEYS:
        peer_v.update(vers.get(k, {}))
    load = res.get("loadavg") or {}
    out = [
        f"Command: `{res['command']}` (with `.venv/bin/python`). Each measurement is a fresh "
        "process: stoker and the floor in `.venv`, the peers in `.venv-peers` "
        "(`benchmarks/requirements-peers.txt`). Adapters: `benchmarks/peers/`. "
        f"Run {res['date']}, took {res['elapsed_s']:.0f} s; raw results in "
        f"`benchmarks/.work/tokens_bench/{res.get('results_file', 'results.json')}`.",
        "",
        f"Machine: {m.get('Model name', '?')} ({m.get('Architecture', '?')}), "
        f"{m.get('CPU(s)', '?')} cores, {m.get('ram_gib', '?')} GiB RAM, "
        f"{m.get('Hypervisor vendor', 'no')} VM, Linux {m.get('kernel')}, "
        f"Python {m.get('python')}, nginx {m.get('nginx', '?')}. "
        f"1-minute load average {load.get('start', '?')} at the start and "
        f"{load.get('end', '?')} at the end (other work shared the 2 cores).",
        "",
        "Versions: "
        + ", ".join(f"{k} {v}" for k, v in sorted(main_v.items()))
        + (f", stoker at commit {res['git']}" if res.get("git") else "")
        + " (`.venv`); "
        + (", ".join(f"{k} {v}" for k, v in sorted(peer_v.items())) or "none")
        + " (`.venv-peers`).",
        "",
    ]
    if c.get("source") == "synthetic":
        out.append(f"Corpus: {c.get('synthetic')}; {c['tokens']:,} tokens.")
    else:
        prefix = ""
        if c.get("corpus_tokens") and c["corpus_tokens"] != c["tokens"]:
            prefix = f" (the first documents of the {c['corpus_tokens']:,}-token corpus)"
        out.append(
            "Corpus: `benchmarks/corpus.py` (real text: man pages, /usr/share/doc, Python "
            f"docstrings; byte-level BPE, vocab 32000), {c['tokens']:,} tokens in "
            f"{c['docs']:,} documents{prefix}, EOS after each; raw uint16 "
            f"{p['raw_bytes'] / 1e6:.1f} MB. Batches of (8, 2049) int64, shuffle on, "
            f"seed 0; {p['epoch_batches']} batches per epoch."
        )
    out += [
        "",
        f"How: tokens/s over {p['batches']} batches after {p['warmup']} warm-up batches "
        f"({(p['warmup'] + p['batches']) / p['epoch_batches']:.0%} of an epoch in all), data "
        "on local disk and in the page cache (each system's own cache filled by earlier runs). "
        f"Every number is the median of {p['repeats']} fresh processes "
        f"({p.get('resume_repeats', p['repeats'])} for resume), run in rounds with the "
        "systems interleaved so that background load hits all alike. *First batch*: from "
        "constructing the loader to holding the first batch (imports excluded), num_workers=0. "
        "*Cold, HTTP*: an empty local cache and the dataset served by nginx on 127.0.0.1 "
        "(`tests/servers.py` `NginxOrigin`; nginx's page cache is warm, so this is latency, "
        "not disk). *Cold, local copy*: an empty cache directory filled from the dataset "
        "directory as the remote (for systems without an HTTP path this is their cold path "
        "without a network). *Resume*: from spawning the process (interpreter start and "
        "imports included; in brackets from constructing the loader) to holding the first "
        "batch after restoring the state saved after 40% of an epoch, num_workers=0; *exact* "
        "= the next 3 batches are bit-identical to those of the uninterrupted run. *Peak "
        "RSS*: the consuming process and its children, sampled every 50 ms, and the process's VmHWM, "
        "num_workers=0, over a throughput run; in brackets the RSS right after imports "
        "(before the loader exists) and the growth from there.",
        "",
    ]
    return out


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or not b else a / b


def _target(rows: list[str], name: str, value: str, ok: bool | None) -> None:
    mark = {True: "met", False: "**missed**", None: "n/a"}[ok]
    rows.append(f"  * {name}: {value} — {mark}")


def render_ratios(res: dict[str, Any]) -> list[str]:
    systems = res["systems"]
    raw = res["params"]["raw_bytes"]
    floor = systems.get("memmap_floor", {})
    peers = {k: systems[k] for k in PEER_KEYS if k in systems and "tps_nw0" in systems[k]}
    for s in peers.values():
        s["rss_delta"] = _rss_delta(s)

    def best(metric: str, hi: bool) -> tuple[str, float | None]:
        vals = [(k, s.get(metric)) for k, s in peers.items() if s.get(metric) is not None]
        if not vals:
            return "no peer measured", None
        k, v = (max if hi else min)(vals, key=lambda kv: kv[1])
        return META[k][0], v

    out = ["Ratios against the targets:", ""]
    for sk in STOKER_KEYS:
        s = systems.get(sk)
        if not s or "tps_nw0" not in s:
            continue
        rows: list[str] = [f"* **{s['label']}**"]
        r = _ratio(s.get("tps_nw0"), floor.get("tps_nw0"))
        _target(rows, "nw=0 warm vs memmap floor (>= 0.9x)", _f(r, ".2f") + "x", r and r >= 0.9)
        name, v = best("tps_nw0", True)
        r = _ratio(s.get("tps_nw0"), v)
        _target(
            rows, f"nw=0 warm vs fastest peer, {name} (>= 1x)", _f(r, ".2f") + "x", r and r >= 1
        )
        name, v = best("tps_nw2", True)
        r = _ratio(s.get("tps_nw2"), v)
        _target(
            rows, f"nw=2 warm vs fastest peer, {name} (>= 2x)", _f(r, ".2f") + "x", r and r >= 2
        )
        r = _ratio(s.get("tps_nw2"), floor.get("tps_nw2"))
        rows.append(f"  * nw=2 warm vs memmap floor (no target): {_f(r, '.2f')}x")
        fw, fc = s.get("first_warm"), s.get("first_cold")
        _target(rows, "first batch warm (<= 0.1 s)", _f(fw, ".3f") + " s", fw and fw <= 0.1)
        _target(
            rows, "first batch cold over HTTP (<= 0.5 s)", _f(fc, ".3f") + " s", fc and fc <= 0.5
        )
        rs, rf = s.get("resume_from_spawn"), floor.get("resume_from_spawn")
        d = None if rs is None or rf is None else rs - rf
        os_, of = s.get("resume_own"), floor.get("resume_own")
        d_own = None if os_ is None or of is None else os_ - of
        _target(
            rows,
            "resume, spawn to first batch, vs the floor's (within +0.2 s)",
            f"{_f(d, '+.2f')} s ({_f(rs, '.2f')} vs {_f(rf, '.2f')}); own part (system "
            f"import + restore + first batch, without the common interpreter/torch start "
            f"of {_f(s.get('resume_base'), '.2f')} vs {_f(floor.get('resume_base'), '.2f')} s): "
            f"{_f(d_own, '+.3f')} s ({_f(os_, '.3f')} vs {_f(of, '.3f')})",
            None if d is None else d <= 0.2,
        )
        st = s["bytes"] / raw
        _target(rows, "storage vs raw uint16 (<= 0.45x)", f"{st:.3f}x", st <= 0.45)
        name, v = best("bytes", False)
        r = _ratio(s["bytes"], v)
        _target(rows, f"storage vs smallest peer, {name} (<= 1x)", _f(r, ".2f") + "x", r and r <= 1)
        name, v = best("peak_rss", False)
        r = _ratio(s.get("peak_rss"), v)
        _target(
            rows, f"peak RSS nw=0 vs lowest peer, {name} (<= 1x)", _f(r, ".2f") + "x", r and r <= 1
        )
        name, v = best("rss_delta", False)
        d = _rss_delta(s)
        rows.append(
            f"  * RSS growth over imports nw=0 vs lowest peer, {name}: "
            f"+{_mib(d)} MiB vs +{_mib(v)} MiB (the fairer memory comparison; see notes)"
        )
        out += rows
    out.append("")
    return out


NOTES = [
    "Interpreters differ: the peers need torch 2.14.1 (pip resolved the CUDA 13 build, "
    "with torchvision 0.29.1; only CPU code runs) and Streaming imports transformers at "
    "`import streaming`, while stoker and the floor run on torch 2.13.0+cpu. Import time "
    "and the RSS right after imports therefore differ between the two groups; the resume "
    "column (spawn to batch) includes that, the bracketed numbers and the RSS growth do "
    "not. The peer venv did not come from local disk as planned: pip found no local "
    "torch 2.14.1 and downloaded it (and the nvidia-* wheels, 6.4 GiB in all) from PyPI.",
    "What a batch carries: stoker also builds a `doc_start_mask` (bool, like the tokens) "
    "and `sample_id` per batch (its defaults); the floor and the peers return tokens only. "
    "The TokenDataset + DataLoader row pays torch's per-sample collation of those dicts.",
    "Samples: the floor, stoker, Streaming and WebDataset read the same windows "
    "`tokens[i*2048 : i*2048+2049]` (one shared token between neighbours). LitData's "
    "TokensLoader cuts non-overlapping blocks of 2049 tokens per chunk and drops each "
    "chunk's remainder, so it has slightly fewer, different samples. Shuffles differ too: "
    "the floor is a global permutation; stoker shuffles virtual shards then samples within "
    "windows of 16 shards; Streaming uses its default py1e; LitData shuffles chunks then "
    "samples within; WebDataset shuffles shards (100) and a 1000-sample buffer.",
    "Warm means different things: the floor, LitData (memory-mapped chunks) and WebDataset "
    "read files in the page cache; Streaming reads the `.mds` shards it decompressed next "
    "to the `.mds.zstd` ones on the first read (its local dir is its cache, so those "
    "decompressed copies are not counted in its storage); stoker decompresses its zstd "
    "blocks in every process (nothing decoded is kept on disk), which is part of its "
    "numbers. The throughput window is most of an epoch so that this per-epoch decode is "
    "amortised as in training.",
    "Storage: stoker writes zstd blocks (its defaults); Streaming shards are zstd "
    "(`.mds.zstd`); LitData's TokensLoader chunks are uncompressed (its pre-training guide "
    "uses no compression; the loader memory-maps chunks); WebDataset shards are plain tar "
    "(a 512-byte header per sample plus padding).",
    "HTTP: only stoker and WebDataset read from an `http://` origin. Streaming 0.13 and "
    "LitData 0.2.76 have no HTTP downloader (object stores and local paths only), so they "
    "have no HTTP cold number; their cold path without a network (`remote=<dir>` / "
    "`local:<dir>` into an empty cache) is the local-copy column. LitData's local "
    "downloader reads byte ranges of the chunk in place, so its local-copy cold is close "
    "to warm. WebDataset streams each shard through `curl` with no cache.",
    "WebDataset has no resume state: its resume iterates (and discards) the batches already "
    "consumed; exact because the shuffles are seeded, but the cost grows with the position.",
    "The floor at num_workers=2 is slower than at 0 because torch's DataLoader moves every "
    "batch from a worker as a pickled message and a fresh shared-memory segment; stoker's "
    "TokenLoader instead gives each worker a ring of shared-memory batch slots.",
    "Noise: the machine is a 2-core VM that other jobs shared during the run (see the load "
    "average above); single runs of the same configuration varied by up to about ±30% in "
    "tokens/s, so ratios within that band are not significant. Medians of interleaved "
    "rounds are reported; every individual run is in results.json.",
]


def render_notes(res: dict[str, Any]) -> list[str]:
    out = ["Notes on comparability:", ""]
    out += [f"* {n}" for n in NOTES]
    prep = []
    for k, s in res["systems"].items():
        if s.get("write_s") is not None:
            prep.append(f"{META[k][0]} {s['write_s']:.1f} s")
    if prep:
        out.append(
            "* Time to write the dataset (one process, not a target): " + ", ".join(prep) + "."
        )
    out.append("")
    return out


def render_errors(res: dict[str, Any]) -> list[str]:
    out = []
    for k, s in res["systems"].items():
        for what, err in (s.get("errors") or {}).items():
            out.append(f"* {META[k][0]}, {what}: `{err}`")
    if out:
        out = ["Errors during the run:", "", *out, ""]
    return out


if __name__ == "__main__":
    sys.exit(main())
