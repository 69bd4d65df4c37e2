"""Preprocessing pool: a trainer's images/s reading a records dataset with 0 to 3 remote
preprocessing workers (``stoker preprocess-worker``), each on a core of its own.

The corpus is benchmarks/image_corpus.py's records dataset (built first when missing).
A measurement reads ``--images`` images after a warm-up batch through
``stoker.TokenLoader(ds, 0)``, ``ds = RecordDataset(records, image_size=224,
batch_size=64, augment="train", preprocess=...)``, in a fresh process pinned to the
first core (``taskset -c``); with ``k`` workers each is a fresh ``stoker
preprocess-worker`` pinned to a core of its own (the 2nd to the (k+1)-th), started for
the measurement and stopped with SIGTERM after it. A count of workers that needs more
cores than this process may use is skipped and said so; on a larger machine the same
command measures it. The configurations are interleaved round by round.

Each configuration is read twice: as fast as the trainer takes batches, and with a
training step after each batch (``--step-ms``, a sleep: a GPU's step takes no CPU
here). Each measurement also gives: the time the trainer's ``fill()`` blocks per batch
and the time each chunk request to a worker takes (timed around the request, on the
trainer's request threads); the rows' bytes received per image; the trainer's and each
worker's CPU seconds and bytes read from the block files per image (/proc). Each round
with a worker also has a latency probe (a fresh process again): chunks of the same rows
made one at a time, in turn here and by one idle worker.

    python benchmarks/preprocess_bench.py [--quick] [--rounds 3] [--images 8192]
                                          [--step-ms 100]

writes ``benchmarks/.work/preprocess/results[-quick].json`` and docs/benchmarks.md's
"Preprocessing pool" section (not with ``--quick``).
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import resource
import signal
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
WORK = BENCH / ".work" / "preprocess"
HEADING = "## Preprocessing pool: trainer images/s with 0-3 remote workers"
SIZE, BATCH = 224, 64
COUNTS = (0, 1, 2, 3)  # remote workers per configuration
TARGET = 0.8  # speed-up over k workers / k, at least
STEP_IMAGES_S = 2500.0  # a ResNet-50 training step's images/s on one GPU
FIELD_CORES, FIELD_TRAINERS = 16, 50  # "one 16-core preprocessing node feeds ~50 trainers"
PROBE_CHUNKS = 40  # chunks of the latency probe, after 4 of warm-up
# the stepped reads' training step, ms a batch of 64 (640 images/s: about one worker's rate
# on a 2-core EPYC, so there the step and a worker are matched)
STEP_MS = 100.0
sys.path.insert(0, str(BENCH))


# -- the parent: cores, workers, children ---------------------------------------------------
def usable_cores() -> list[int]:
    """The CPUs this process may run on, in order (the first is the trainer's)."""
    return sorted(os.sched_getaffinity(0))


@dataclass
class Worker:
    """A running worker and, every 0.1 s from when it serves, its (wall time, CPU
    seconds, bytes read)."""

    proc: subprocess.Popen[str]
    address: str
    samples: list[tuple[float, float, int]] = field(default_factory=list)
    done: threading.Event = field(default_factory=threading.Event)
    sampler: threading.Thread | None = None

    def sample(self) -> None:
        """Samples until :attr:`done`, the last one after it is set."""
        from machine import proc_cpu

        while True:
            pid = self.proc.pid
            self.samples.append((time.time(), proc_cpu(pid) or 0.0, read_bytes(pid)))
            if self.done.is_set():
                return
            self.done.wait(0.1)

    def between(self, since: float, until: float) -> tuple[float, int]:
        """CPU seconds and bytes read from the first sample at ``since`` or after to the
        last at ``until`` or before."""
        got = [s for s in self.samples if since <= s[0] <= until] or self.samples[-1:]
        return got[-1][1] - got[0][1], got[-1][2] - got[0][2]


def start_worker(core: int, log: Path) -> Worker:
    """A ``stoker preprocess-worker`` on loopback pinned to ``core``, once it serves."""
    cmd = ["taskset", "-c", str(core), sys.executable, "-m", "stoker", "preprocess-worker",
           "--metrics-port", "-1"]  # fmt: skip
    err = log.open("w")
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True)
    err.close()
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=_drain, args=(proc, lines), daemon=True).start()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            line = lines.get(timeout=max(0.1, deadline - time.monotonic()))
        except queue.Empty:
            break
        if "serving" in line:
            w = Worker(proc, line.split("serving ")[1].split()[0])
            w.sampler = threading.Thread(target=w.sample, daemon=True)
            w.sampler.start()
            return w
    proc.kill()
    raise RuntimeError(f"worker on core {core} did not serve in 60 s: {log.read_text()[-2000:]}")


def _drain(proc: subprocess.Popen[str], lines: queue.Queue[str]) -> None:
    """Pass the worker's stdout lines on (and keep its pipe from filling)."""
    assert proc.stdout is not None
    for line in proc.stdout:
        lines.put(line)


def stop_worker(w: Worker) -> None:
    """Its last sample, then SIGTERM."""
    w.done.set()
    if w.sampler is not None:
        w.sampler.join()
    w.proc.send_signal(signal.SIGTERM)
    try:
        w.proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        w.proc.kill()
        w.proc.wait()


def read_bytes(pid: int | str = "self") -> int:
    """Bytes process ``pid`` has read with read()/pread() so far (``rchar`` of Linux's
    /proc/PID/io: stoker reads local block files with pread; 0 where it is missing)."""
    try:
        text = Path(f"/proc/{pid}/io").read_text()
    except OSError:
        return 0
    return next((int(ln.split()[1]) for ln in text.splitlines() if ln.startswith("rchar")), 0)


def measure(mode: str, cfg: dict[str, Any], k: int, cores: list[int]) -> dict[str, Any]:
    """One child (``mode``: read or probe) pinned to the first core, with ``k`` fresh
    workers on the next ``k`` cores; the child's answer, with the workers' CPU seconds
    and bytes read."""
    WORK.mkdir(parents=True, exist_ok=True)
    workers: list[Worker] = []
    try:
        for i in range(k):
            workers.append(start_worker(cores[1 + i], WORK / f"worker-{i}.log"))
        cfg = {**cfg, "addresses": [w.address for w in workers]}
        cmd = ["taskset", "-c", str(cores[0]), sys.executable, __file__, "--child", mode]
        out = subprocess.run([*cmd, json.dumps(cfg)], capture_output=True, text=True)
        if out.returncode:
            raise RuntimeError(f"{mode} child with {k} workers: {out.stderr[-3000:]}")
        res = dict(json.loads(out.stdout.strip().splitlines()[-1]))
    finally:
        for w in workers:
            stop_worker(w)
    since, until = res.get("wall_first", 0.0), res.get("wall_end", time.time())
    used = {w.address: w.between(since, until) for w in workers}
    res["worker_cpu_s"] = {a: u[0] for a, u in used.items()}
    res["worker_read_bytes"] = {a: u[1] for a, u in used.items()}
    return res


# -- the children ----------------------------------------------------------------------------
class Timings:
    """What a child's reader saw: each fill's (start, seconds), each request's (start,
    seconds, rows, bytes received, worker), the last rows received."""

    def __init__(self) -> None:
        self.fills: list[tuple[float, float]] = []
        self.requests: list[tuple[float, float, int, int, str]] = []
        self.last_rows: dict[str, Any] | None = None
        self.made_by: dict[str, int] = {}
        self.fell_back = False


class TimedReader:
    """A dataset's reader with its ``fill`` (and a remote reader's requests) timed."""

    def __init__(self, reader: Any, t: Timings) -> None:
        self.reader, self.t = reader, t
        if hasattr(reader, "_get"):  # a RemoteReader: its requests, on its threads
            get = reader._get

            def timed_get(w: Any, req: Any) -> dict[str, Any]:
                start = time.perf_counter()
                rows: dict[str, Any] = get(w, req)
                took = time.perf_counter() - start
                nbytes = sum(int(v.nbytes) for v in rows.values())
                t.requests.append((start, took, len(req.ids), nbytes, w.address))
                t.last_rows = rows
                return rows

            reader._get = timed_get

    def fill(self, ids: Any, out: Any, *args: Any, **kw: Any) -> None:
        start = time.perf_counter()
        self.reader.fill(ids, out, *args, **kw)
        self.t.fills.append((start, time.perf_counter() - start))

    def close(self) -> None:
        made = getattr(self.reader, "made_by", None)
        if made is not None:
            for a, n in made.items():
                self.t.made_by[a] = self.t.made_by.get(a, 0) + n
            self.t.fell_back |= bool(getattr(self.reader, "_warned", False))
        self.reader.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.reader, name)


def dataset(cfg: dict[str, Any], remote: bool) -> Any:
    import stoker

    pool = ",".join(cfg["addresses"]) if remote and cfg["addresses"] else None
    return stoker.RecordDataset(
        cfg["url"], image_size=SIZE, batch_size=BATCH, augment="train", preprocess=pool
    )


def child_read(cfg: dict[str, Any]) -> dict[str, Any]:
    """Images/s through ``TokenLoader(ds, 0)``, after a warm-up batch, and what the
    reader saw."""
    from peers.clock import PassClock

    import stoker

    ds, t = dataset(cfg, remote=True), Timings()
    opened = ds.open_reader
    ds.open_reader = lambda *a, **kw: TimedReader(opened(*a, **kw), t)
    clock = PassClock()
    loader = stoker.TokenLoader(ds, 0)
    clock.begin()
    goal = cfg["images"] + BATCH  # the warm-up batch, then ``images``
    cpu0, read0, wall_first = 0.0, 0, 0.0
    while clock.n < goal:
        for batch in loader:
            clock.batch(len(batch["label"]))
            if clock.n == len(batch["label"]):
                cpu0, read0, wall_first = _cpu(), read_bytes(), time.time()
            if clock.n >= goal:
                break
            time.sleep(cfg["step_s"])  # (the training step: the GPU's, no CPU here)
    cpu, read = _cpu() - cpu0, read_bytes() - read0
    wall_end = time.time()
    loader.close()
    res = clock.result()
    steady = [d for s, d in t.fills if s >= clock.at_first]
    reqs = [r for r in t.requests if r[0] >= clock.at_first]
    res.update(
        trainer_cpu_s_per_image=cpu / max(1, clock.n - clock.n_first),
        trainer_read_bytes_per_image=read / max(1, clock.n - clock.n_first),
        fill_s=_spread(steady),
        fill_busy=sum(steady) / max(1e-9, clock.end - clock.at_first),
        request_s=_spread([r[1] for r in reqs]),
        request_rows=sum(r[2] for r in reqs),
        made_by=t.made_by,
        made_after_warmup=_by_worker(reqs),
        wall_first=wall_first,
        wall_end=wall_end,
        fell_back=t.fell_back,
    )
    if reqs:
        rows = sum(r[2] for r in t.requests)
        res["row_bytes_per_image"] = sum(r[3] for r in t.requests) / rows
        res["ipc_bytes_per_image"] = ipc_bytes(t.last_rows or {})
    return res


def child_probe(cfg: dict[str, Any]) -> dict[str, Any]:
    """Chunks of consecutive rows made one at a time, in turn by this process's reader
    (the time its fill takes) and by the one worker (the time its request takes, nothing
    else in flight): the latency a worker adds to a chunk."""
    import numpy as np

    from stoker.preprocess.client import CHUNK

    local_ds, remote_ds, t = dataset(cfg, remote=False), dataset(cfg, remote=True), Timings()
    local, remote = local_ds.open_reader(0), TimedReader(remote_ds.open_reader(0), t)
    chunks = PROBE_CHUNKS + 4
    start = int(np.random.default_rng(1).integers(0, max(1, local_ds.num_samples - CHUNK * chunks)))
    ids = np.arange(start, start + CHUNK * chunks) % local_ds.num_samples
    local.plan(ids)
    remote.plan(ids)
    out = local_ds.layout.allocate(CHUNK)
    made_here = []
    for j in range(chunks):
        c = ids[j * CHUNK : (j + 1) * CHUNK]
        s = time.perf_counter()
        local.fill(c, out)
        made_here.append(time.perf_counter() - s)
        remote.fill(c, out)  # (its request was sent as the last fill ended)
        time.sleep(max(0.05, 3 * (t.requests[-1][1] if t.requests else 0.1)))
    local.close()
    remote.close()
    asked = [r[1] for r in t.requests[4:]]
    return {
        "chunk": CHUNK,
        "local_s": _spread(made_here[4:]),
        "request_s": _spread(asked),
        "fell_back": t.fell_back,
    }


def ipc_bytes(rows: dict[str, Any]) -> float | None:
    """Bytes per row of ``rows`` as the Arrow IPC stream a worker sends (schema and one
    record batch, as :func:`stoker.preprocess.wire.to_batch` makes it)."""
    import pyarrow as pa

    from stoker.preprocess.wire import to_batch

    if not rows:
        return None
    batch = to_batch(rows)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as w:
        w.write_batch(batch)
    return float(sink.getvalue().size / batch.num_rows)


def _by_worker(reqs: list[tuple[float, float, int, int, str]]) -> dict[str, int]:
    """Rows of ``reqs`` by the worker that made them."""
    out: dict[str, int] = {}
    for r in reqs:
        out[r[4]] = out.get(r[4], 0) + r[2]
    return out


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _spread(xs: list[float]) -> dict[str, float] | None:
    """Median, 95th percentile and mean of ``xs`` (None when empty)."""
    if not xs:
        return None
    s = sorted(xs)
    return {
        "median": statistics.median(s),
        "p95": s[min(len(s) - 1, int(0.95 * len(s)))],
        "mean": statistics.fmean(s),
        "n": len(s),
    }


# -- the run ---------------------------------------------------------------------------------
def run_rounds(url: str, rounds: int, images: int, counts: list[int], cores: list[int],
               step: float) -> dict[str, Any]:  # fmt: skip
    """Each round: every count of workers in turn, without and with a training step of
    ``step`` seconds a batch, then the latency probe (one worker)."""
    runs: dict[str, list[dict[str, Any]]] = {str(k): [] for k in counts}
    stepped: dict[str, list[dict[str, Any]]] = {str(k): [] for k in counts}
    probes = []
    for r in range(rounds):
        for k in counts:
            for into, s in ((runs, 0.0), (stepped, step)):
                res = measure("read", {"url": url, "images": images, "step_s": s}, k, cores)
                if res["fell_back"]:
                    raise RuntimeError(f"{k} workers: the trainer made rows itself ({res})")
                into[str(k)].append(res)
                print(f"round {r + 1}, {k} workers, step {s * 1e3:.0f} ms: "
                      f"{res['steady_images_s']:.0f} images/s", flush=True)  # fmt: skip
        if 1 in counts:
            probes.append(measure("probe", {"url": url}, 1, cores))
            p = probes[-1]
            print(f"round {r + 1}, probe: {p['local_s']['median'] * 1e3:.1f} ms here, "
                  f"{p['request_s']['median'] * 1e3:.1f} ms a request", flush=True)  # fmt: skip
    return {"runs": runs, "stepped_runs": stepped, "probe": probes}


def summarize_stepped(res: dict[str, Any], step: float) -> dict[str, Any]:
    """Images/s with a training step, against what they would be were the rows made
    during the step: with workers, the lesser of the step's rate and the rate without
    a step; with none (the rows made between steps), a batch's making plus the step."""
    med = {
        k: statistics.median(r["steady_images_s"] for r in v)
        for k, v in res["stepped_runs"].items()
    }
    ideal = {}
    for k, rate in res["median_images_s"].items():
        if k == "0":
            ideal[k] = BATCH / (step + BATCH / rate)
        else:
            ideal[k] = min(BATCH / step, rate)
    return {"median": med, "overlapped": ideal}


def summarize(runs: dict[str, list[dict[str, Any]]], jpeg_per_image: float) -> dict[str, Any]:
    """Medians per count of workers, speed-ups and fractions of linear, bytes per image,
    per-core rates."""
    med = {k: statistics.median(r["steady_images_s"] for r in v) for k, v in runs.items()}
    base = med.get("0")
    out: dict[str, Any] = {"median_images_s": med, "speedup": {}, "of_linear": {}, "added": {}}
    for k, v in med.items():
        if base and int(k) > 0:
            out["speedup"][k] = v / base
            out["of_linear"][k] = v / base / int(k)
            # the k-th worker's gain in units of 0 workers' rate (the first one's: all of it,
            # the trainer making no rows then); linear scaling adds 1 a worker
            before = med.get(str(int(k) - 1)) if int(k) > 1 else 0.0
            if before is not None:
                out["added"][k] = (v - before) / base
    remote = [r for k, v in runs.items() if int(k) > 0 for r in v]
    if remote:
        row = statistics.median(r["row_bytes_per_image"] for r in remote)
        ipc = statistics.median(r["ipc_bytes_per_image"] for r in remote)
        out["wire"] = {"row_bytes": row, "ipc_bytes": ipc, "jpeg_bytes": jpeg_per_image,
                       "ratio": ipc / jpeg_per_image}  # fmt: skip
        per_core = {k: med[k] / int(k) for k in med if int(k) > 0}
        out["per_worker_core_images_s"] = per_core
        out["worker_cpu_s_per_image"] = statistics.median(
            sum(r["worker_cpu_s"].values()) / sum(r["made_after_warmup"].values()) for r in remote
        )
        out["worker_busy"] = statistics.median(
            sum(r["worker_cpu_s"].values())
            / len(r["worker_cpu_s"])
            / (r["wall_end"] - r["wall_first"])
            for r in remote
        )
        out["worker_read_bytes_per_image"] = statistics.median(
            sum(r["worker_read_bytes"].values()) / sum(r["made_after_warmup"].values())
            for r in remote
        )
    if "0" in runs:
        out["trainer_read_bytes_per_image"] = statistics.median(
            r["trainer_read_bytes_per_image"] for r in runs["0"]
        )
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--quick", action="store_true", help="a small corpus, one round; docs untouched"
    )
    ap.add_argument("--rounds", type=int)
    ap.add_argument("--images", type=int, help="images a measurement reads after its warm-up")
    ap.add_argument(
        "--step-ms",
        type=float,
        default=STEP_MS,
        help=f"the training step of the stepped measurements, ms a batch (default {STEP_MS:g})",
    )
    ap.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        fn = child_read if args.child[0] == "read" else child_probe
        print(json.dumps(fn(json.loads(args.child[1]))))
        return 0
    from docsection import replace_section
    from images_bench import corpus
    from machine import git_info, platform_info

    import stoker

    t_start, commit = time.perf_counter(), git_info()
    rounds = args.rounds or (1 if args.quick else 3)
    images = args.images or (512 if args.quick else 8192)
    _, records = corpus(args.quick)
    m = stoker.RecordSource(str(records)).manifest
    jpeg = m.statistics["image"]["bytes"] / m.num_rows
    stored = m.data_bytes / m.num_rows
    cores = usable_cores()
    counts = [k for k in COUNTS if k + 1 <= len(cores)]
    skipped = [k for k in COUNTS if k not in counts]
    for k in skipped:
        print(f"{k} workers: skipped, needs {k + 1} cores (the trainer's and one a worker); "
              f"this process may use {len(cores)}")  # fmt: skip
    got = run_rounds(str(records), rounds, images, counts, cores, args.step_ms / 1e3)
    out = {
        "machine": platform_info(),
        "commit": _commit(commit, git_info()),
        "command": "python benchmarks/preprocess_bench.py" + _args_said(args),
        "images": images,
        "rounds": rounds,
        "cores": cores,
        "skipped": skipped,
        "corpus": {"rows": m.num_rows, "jpeg_bytes_per_image": jpeg, "stored_per_image": stored},
        "step_s": args.step_ms / 1e3,
        **summarize(got["runs"], jpeg),
        **got,
        "seconds": time.perf_counter() - t_start,
    }
    out["stepped"] = summarize_stepped(out, out["step_s"])
    WORK.mkdir(parents=True, exist_ok=True)
    (WORK / f"results{'-quick' if args.quick else ''}.json").write_text(json.dumps(out, indent=1))
    print(render(out))
    if not args.quick:
        replace_section(ROOT / "docs" / "benchmarks.md", HEADING, render(out))
    return 0


def _commit(start: str | None, end: str | None) -> str | None:
    """The commit measured; both when the checkout changed during the run."""
    return start if start == end else f"{start} at the start, {end} at the end"


def _args_said(args: argparse.Namespace) -> str:
    said = " --quick" if args.quick else ""
    said += f" --rounds {args.rounds}" if args.rounds else ""
    said += f" --step-ms {args.step_ms:g}" if args.step_ms != STEP_MS else ""
    return said + (f" --images {args.images}" if args.images else "")


# -- the docs section --------------------------------------------------------------------------
def render(res: dict[str, Any]) -> str:
    mach = res["machine"]
    return "\n".join(
        [
            HEADING,
            "",
            f"`{res['command']}` ({res['rounds']} interleaved round"
            f"{'s' * (res['rounds'] > 1)}; commit {res['commit']}; "
            f"{mach.get('Model name', '?')}, {mach['cpus']} CPUs, {len(res['cores'])} usable; "
            f"took {res['seconds']:.0f} s). Each measurement is a fresh trainer process pinned "
            f"to core {res['cores'][0]} (`taskset`), reading {res['images']:,} images after a "
            f"warm-up batch through `stoker.TokenLoader(ds, 0)` from `RecordDataset(records, "
            f"image_size={SIZE}, batch_size={BATCH}, augment=\"train\", preprocess=...)`, with "
            "0 workers (the trainer makes its rows) or k fresh `stoker preprocess-worker`s on "
            "loopback, each pinned to a core of its own and stopped (SIGTERM) after. Corpus: "
            f"benchmarks/image_corpus.py's, {res['corpus']['rows']:,} images. images/s: after "
            "the warm-up batch, median of the rounds.",
            "",
            "| workers | cores | images/s (median) | per round | speed-up vs 0 "
            "| added by the k-th worker | of linear "
            "| trainer CPU per image | fill() blocks per batch (median / p95) "
            "| a chunk request (median / p95) |",
            "|---|---|---|---|---|---|---|---|---|---|",
            *table_rows(res),
            "",
            scaling(res),
            "",
            stepped(res),
            "",
            wire(res),
            "",
            reads(res),
            "",
            latency(res),
            "",
            cores_needed(res),
        ]
    ) + "\n"  # fmt: skip


def table_rows(res: dict[str, Any]) -> list[str]:
    rows = []
    for k in COUNTS:
        if k in res["skipped"]:
            rows.append(f"| {k} | {k + 1} | skipped: needs {k + 1} cores, this machine lets "
                        f"this process use {len(res['cores'])} | | | | | | | |")  # fmt: skip
            continue
        v = res["runs"][str(k)]
        med = res["median_images_s"][str(k)]
        per = ", ".join(f"{r['steady_images_s']:.0f}" for r in v)
        cpu = statistics.median(r["trainer_cpu_s_per_image"] for r in v) * 1e6
        fill = _ms(v, "fill_s", 1)
        req = _ms(v, "request_s", 1) if k else "-"
        rows.append(f"| {k} | {k + 1} | {med:.0f} | {per} | {_ratios(res, str(k))} | "
                    f"{cpu:.0f} µs | {fill} | {req} |")  # fmt: skip
    return rows


def _ratios(res: dict[str, Any], k: str) -> str:
    """The speed-up, the k-th worker's gain and the fraction of linear, as table cells."""
    if k not in res["speedup"]:
        return "1 | - | -"
    added = res["added"].get(k)
    said = "-" if added is None else f"{added:+.2f}x"
    return f"{res['speedup'][k]:.2f}x | {said} | {res['of_linear'][k]:.2f}"


def _ms(v: list[dict[str, Any]], key: str, nd: int) -> str:
    """Median over the rounds of each round's median and p95 of ``key``, in ms."""
    got = [r[key] for r in v if r.get(key)]
    if not got:
        return "-"
    a = statistics.median(g["median"] for g in got) * 1e3
    b = statistics.median(g["p95"] for g in got) * 1e3
    return f"{a:.{nd}f} / {b:.{nd}f} ms"


def scaling(res: dict[str, Any]) -> str:
    text = [
        "Speed-up: images/s with k workers over images/s with none (the trainer making its "
        "rows on its own core); added by the k-th worker: images/s with k workers less "
        "those with k - 1 (none for the first: the trainer makes no rows then), over those "
        "with none (linear adds 1x a worker); of linear: the speed-up over k (target: at least "
        f"{TARGET})."
    ]
    for k, lin in res["of_linear"].items():
        verdict = "met" if lin >= TARGET else "**missed**"
        text.append(f"{k} worker{'s' * (k != '1')}: {lin:.2f} of linear ({verdict}).")
    if res["skipped"]:
        said = ", ".join(str(k) for k in res["skipped"])
        text.append(
            f"Not measured here: {said} workers (each needs a core of its own besides the "
            f"trainer's, {max(res['skipped']) + 1} cores for {max(res['skipped'])}; this "
            f"machine has {len(res['cores'])}). The same command measures them on a larger "
            "machine."
        )
    cpu = [r["trainer_cpu_s_per_image"] for k, v in res["runs"].items() if k != "0" for r in v]
    if cpu:
        top = 1 / statistics.median(cpu)
        text.append(
            f"With workers the trainer spends {statistics.median(cpu) * 1e6:.0f} µs of CPU an "
            f"image (receiving the rows, copying them into the batch, the loader's own work), "
            f"so its one core would take at most about {top:.0f} images/s before it is the "
            "limit: an estimate, not a measurement of more workers."
        )
    return " ".join(text)


def stepped(res: dict[str, Any]) -> str:
    """The second table: the same reads with a training step after each batch."""
    st, step = res["stepped"], res["step_s"] * 1e3
    rows = []
    for k, v in res["stepped_runs"].items():
        per = ", ".join(f"{r['steady_images_s']:.0f}" for r in v)
        med, ideal = st["median"][k], st["overlapped"][k]
        rows.append(
            f"| {k} | {med:.0f} | {per} | {ideal:.0f} | {med / ideal:.2f} | {_ms(v, 'fill_s', 1)} |"
        )
    return "\n".join(
        [
            f"With a training step: the same reads, the trainer sleeping {step:.0f} ms after "
            f"each batch (a GPU's step, which takes no CPU here: at most "
            f"{BATCH / res['step_s']:,.0f} images/s). Overlapped: the images/s if the rows were "
            "made during the step (with workers, the lesser of the step's rate and the rate "
            "without a step; with none, TokenLoader(ds, 0) makes a batch between two steps, "
            "so a batch's making plus the step). " + _depth(),
            "",
            f"| workers | images/s with a {step:.0f} ms step (median) | per round | overlapped "
            "| / overlapped | fill() blocks per batch (median / p95) |",
            "|---|---|---|---|---|---|",
            *rows,
        ]
    )


def _depth() -> str:
    """How far ahead a trainer's reader asks its workers (the client's constants)."""
    from stoker.preprocess.client import CHUNK, INFLIGHT

    return (
        f"A trainer's reader asks each worker for at most {INFLIGHT} chunks of {CHUNK} rows "
        "ahead of the rows it has taken (`CHUNK`, `INFLIGHT` in src/stoker/preprocess/"
        f"client.py), {INFLIGHT * CHUNK} rows, and asks again only as fill() takes rows; "
        "TokenLoader(ds, 0) calls fill() in the training loop's thread, so during a step a "
        f"worker makes at most {INFLIGHT * CHUNK} rows of the next batch of {BATCH}."
    )


def wire(res: dict[str, Any]) -> str:
    w = res.get("wire")
    if not w:
        return "Bytes on the wire: no worker was measured."
    return (
        f"Bytes on the wire per image: {w['row_bytes']:,.0f} bytes of row buffers received "
        f"(the image 3x{SIZE}x{SIZE} uint8, its label and sample id as int64), "
        f"{w['ipc_bytes']:,.0f} bytes as the Arrow IPC stream that carries them (a chunk's "
        "schema and record batch, re-encoded from the rows received; gRPC's framing is not "
        f"counted), against {w['jpeg_bytes']:,.0f} bytes of JPEG per image (this corpus's "
        "mean: what forwarding the stored JPEG would send): "
        f"{w['ratio']:.1f}x. At 2,500 images/s that is "
        f"{w['ipc_bytes'] * STEP_IMAGES_S * 8 / 1e9:.1f} Gbit/s into a trainer."
    )


def reads(res: dict[str, Any]) -> str:
    """Bytes read from the block files per image made, here and at the workers."""
    stored = res["corpus"]["stored_per_image"]
    said = []
    if "trainer_read_bytes_per_image" in res:
        here = res["trainer_read_bytes_per_image"]
        said.append(f"the trainer making its own rows {here:,.0f} ({here / stored:.1f}x)")
    if "worker_read_bytes_per_image" in res:
        there = res["worker_read_bytes_per_image"]
        said.append(f"a worker {there:,.0f} ({there / stored:.1f}x)")
    if not said:
        return ""
    return (
        f"Bytes read from the block files per image made (stored: {stored:,.0f} bytes an "
        "image; rchar of /proc/PID/io, as stoker reads local block files with pread, after "
        "the warm-up batch; a worker's sampled every 0.1 s): "
        + " and ".join(said)
        + ". Above 1x, blocks are fetched again within the pass. A worker plans its reader "
        "for a request's rows and the ids the trainer names after them (the request's "
        "`ahead`, `AHEAD` in src/stoker/preprocess/client.py; src/stoker/preprocess/worker.py, "
        "`_Stream.make`): a block is kept while that plan uses it."
    )


def latency(res: dict[str, Any]) -> str:
    p = res["probe"]
    if not p:
        return "Latency: no worker was measured."
    local = statistics.median(x["local_s"]["median"] for x in p) * 1e3
    asked = statistics.median(x["request_s"]["median"] for x in p) * 1e3
    asked95 = statistics.median(x["request_s"]["p95"] for x in p) * 1e3
    chunk = p[0]["chunk"]
    from stoker.preprocess.client import INFLIGHT as inflight

    return (
        f"Latency a worker adds (the probe: {PROBE_CHUNKS} chunks of {chunk} consecutive rows "
        "a round, made one at a time and in turn by the trainer's own reader, timed around "
        "its fill(), and by one idle worker, timed around the request from the trainer's "
        "request thread: sending the ticket, the worker making the rows, the answer and its "
        f"unpacking): {local:.1f} ms for a chunk made here against {asked:.1f} ms asked of "
        f"the worker (p95 {asked95:.1f} ms), so {asked - local:+.1f} ms a chunk, "
        f"{(asked - local) / chunk * 1e3:+.0f} µs a row. In the table, a chunk request is "
        "timed the same way while reading at full speed (each worker has up to "
        f"{inflight} chunks in flight and makes one trainer's chunks one after the other, so "
        "a request waits for those before it), and fill() blocks is how long the training "
        f"loop waited for each batch of {BATCH}."
    )


def cores_needed(res: dict[str, Any]) -> str:
    per_core = res.get("per_worker_core_images_s")
    if not per_core:
        return "Cores needed: no worker was measured."
    k, rate = max(per_core.items(), key=lambda x: int(x[0]))
    busy = 1 / res["worker_cpu_s_per_image"]
    text = [
        f"Cores needed: with {k} worker{'s' * (k != '1')} a worker core made {rate:.0f} "
        f"images/s (its CPU time per image after the warm-up batch says {busy:.0f} images/s "
        f"a fully busy core; it was busy {res['worker_busy']:.2f} of the time)."
    ]
    text.append(_feeds(rate, "At that rate"))
    local = res["median_images_s"].get("0")
    if local:
        text.append(_feeds(local, f"At the rate a trainer makes its own rows ({local:.0f} a core)"))
    fed = FIELD_CORES * rate / FIELD_TRAINERS
    text.append(
        f"The field figure, one {FIELD_CORES}-core preprocessing node for about "
        f"{FIELD_TRAINERS} training workers, gives each {FIELD_CORES / FIELD_TRAINERS:.2f} "
        f"cores, {fed:.0f} images/s at a worker core's measured rate"
        + (f" ({FIELD_CORES * local / FIELD_TRAINERS:.0f} at the trainer's own)" if local else "")
        + ": it holds for training workers that consume that much, not for one at "
        f"{STEP_IMAGES_S:,.0f} images/s."
    )
    text.append(
        "This corpus's JPEGs are about a quarter of ImageNet's bytes at similar sizes "
        "(benchmarks/image_corpus.py), so an ImageNet image costs a core more than here and "
        "these counts of cores are a floor."
    )
    return " ".join(text)


def _feeds(rate: float, at: str) -> str:
    """What ``rate`` images/s a core comes to for a trainer of :data:`STEP_IMAGES_S`."""
    need = STEP_IMAGES_S / rate
    return (
        f"{at}, a trainer consuming {STEP_IMAGES_S:,.0f} images/s (a ResNet-50 step on one "
        f"GPU) needs {need:.1f} preprocessing cores, and a {FIELD_CORES}-core node feeds "
        f"{FIELD_CORES / need:.1f} such trainers."
    )


if __name__ == "__main__":
    raise SystemExit(main())
