"""The coordinator's own cost per call and its restart, without gRPC or load generators.

    .venv/bin/python benchmarks/coordinator_cost.py [--quick]

A `Coordinator` in this process (journal on local disk), 1,024 nodes x 8 ranks x 2
workers registered, then messages as a node's relay sends them (`Batch` called
directly): the Lease calls of 12 consumers and the ConfirmBatch calls of the leases
granted in the message before (8 batches of 8 rows each). Reported: CPU microseconds per
call (the handler, its journal write included, no gRPC), with Python's cyclic collector
as it comes and with the tables frozen out of its way as `stoker coordinator` runs
(`gc_freeze`); then the time a restart takes to be ready on the journal that run left,
from the last image of the tables and, for comparison, replaying the whole journal.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path.insert(0, str(BENCH))
from docsection import publish  # noqa: E402
from machine import git_info, platform_info  # noqa: E402

HEADING = "## Coordinator: CPU per call and restart time (in process)"
NODES, RANKS, WORKERS, LEASE, B, PER = 1024, 8, 2, 64, 8, 12


def drive(state: Path, messages: int, freeze: bool) -> dict[str, Any]:
    from stoker._proto import coordinator_pb2 as pb
    from stoker.coordinator.model import Config
    from stoker.coordinator.service import Coordinator

    c = Coordinator(
        1 << 44, NODES * RANKS, str(state), config=Config(lease_size=LEASE, timeout=600),
        gc_freeze=freeze,
    )  # fmt: skip
    ids = [
        (c.Register(pb.RegisterRequest(rank=n * RANKS + k // WORKERS, worker=k % WORKERS,
                                       node=f"n{n}"), None).consumer, n * RANKS + k // WORKERS)
        for n in range(NODES)
        for k in range(RANKS * WORKERS)
    ]  # type: ignore[arg-type]  # fmt: skip
    seq: dict[int, int] = {}
    pending: list[Any] = []
    calls = 0
    cpu, wall = time.process_time(), time.perf_counter()
    for m in range(messages):
        group = [ids[(m * PER + i) % len(ids)] for i in range(PER)]
        batch = pending + [
            pb.Call(lease=pb.LeaseRequest(consumer=cid, epoch=0)) for cid, _ in group
        ]
        results = c.Batch(pb.BatchRequest(calls=batch), None).results  # type: ignore[arg-type]
        calls += len(batch)
        pending = []
        for (cid, rank), r in zip(group, results[-PER:], strict=True):
            if r.WhichOneof("kind") != "lease" or r.lease.status != pb.LeaseReply.GRANTED:
                continue
            g, s = r.lease, seq.get(rank, 0)
            n = g.end - g.start
            pending.append(pb.Call(confirm_batch=pb.ConfirmBatchRequest(
                consumer=cid, epoch=0, seq=s, batch_size=B, count=n // B,
                segments=[pb.Segment(lease=g.lease, upto=g.end, rows=n)])))  # fmt: skip
            seq[rank] = s + n // B
    out = {
        "calls": calls,
        "us_per_call_cpu": (time.process_time() - cpu) / calls * 1e6,
        "us_per_call_wall": (time.perf_counter() - wall) / calls * 1e6,
        "journal_mb": sum(f.stat().st_size for f in (state / "journal").rglob("*")) / 1e6,
    }
    c.close()
    return out


def restart(state: Path, images: bool) -> float:
    from stoker.coordinator.model import Config
    from stoker.coordinator.service import Coordinator

    if not images:
        for f in (state / "images").rglob("*.json"):
            f.unlink()
    t = time.perf_counter()
    c = Coordinator(
        1 << 44, NODES * RANKS, str(state), config=Config(lease_size=LEASE, timeout=600)
    )
    took = time.perf_counter() - t
    c.close()
    return took


def render(res: dict[str, Any]) -> str:
    a, f = res["collector"], res["frozen"]
    return "\n".join(
        [
            HEADING,
            "",
            f"Command: `python benchmarks/coordinator_cost.py` (with `.venv/bin/python`). Run "
            f"{res['when']}, took {res['took']:.0f} s, at {res['git']}. Machine: "
            f"{res['machine']}.",
            "",
            __doc__.split("\n\n", 2)[2].strip().replace("\n", " "),
            "",
            "| collector | calls | CPU us per call | wall us per call | journal (MB) |",
            "|---|---:|---:|---:|---:|",
            f"| as it comes | {a['calls']:,} | {a['us_per_call_cpu']:.1f} | "
            f"{a['us_per_call_wall']:.1f} | {a['journal_mb']:.1f} |",
            f"| tables frozen (`gc_freeze`, as `stoker coordinator`) | {f['calls']:,} | "
            f"{f['us_per_call_cpu']:.1f} | {f['us_per_call_wall']:.1f} | {f['journal_mb']:.1f} |",
            "",
            f"Restart on the second run's journal ({f['journal_mb']:.1f} MB): ready in "
            f"{res['restart_image']:.2f} s from the last image, {res['restart_full']:.2f} s "
            "replaying the whole journal (images removed). The difference between these CPU "
            "figures and the coordinator's under load (benchmarks/scale_bench.py) is gRPC's "
            "share and the calls' variety.",
            "",
        ]
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="small and short; docs untouched")
    args = ap.parse_args()
    messages = 500 if args.quick else 20_000
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as td:
        collector = drive(Path(td) / "a", messages, freeze=False)
        frozen = drive(Path(td) / "b", messages, freeze=True)
        with_image = restart(Path(td) / "b", images=True)
        full = restart(Path(td) / "b", images=False)
    i = platform_info()
    res = {
        "when": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "took": time.perf_counter() - t0,
        "git": git_info(),
        "machine": f"{i.get('Model name', '?')}, {i['cpus']} cores, Python {i['python']}",
        "collector": collector,
        "frozen": frozen,
        "restart_image": with_image,
        "restart_full": full,
    }
    publish(res, "coordinator-cost", args.quick, HEADING, render)
    return 0


if __name__ == "__main__":
    sys.exit(main())
