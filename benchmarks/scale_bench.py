"""The coordinator at the size it is for: 1,024 nodes x 8 ranks x 2 workers, one coordinator.

    .venv/bin/python benchmarks/scale_bench.py [--quick]

A `stoker coordinator` process on 127.0.0.1 (journal on local disk, leases of 64
positions, an epoch too long to end) and 16,384 consumers (1,024 nodes x 8 ranks x 2
loader workers) registered by two load processes. Each load process plays 512 nodes
as their agents' relays send (`stoker.coordinator.relay`): per node one `Batch` message
in flight, at most one begun per tick, carrying every call its consumers have due: a
`Lease` for each consumer whose lease ran out, and the rank's `ConfirmBatch` of each
lease granted in the message before (8 batches of 8 rows as one call, as a rank's
confirmer merges a run). The coordinator runs as `stoker coordinator` does: its tables
imaged every 70,000 events or so, its collector kept off them. Each consumer asks for a lease every 16,384 / R seconds, so
the job asks for R leases a second (the offered rate); a lease refused with WAIT is asked
for again at the next tick. A message refused while the coordinator is away is sent
again unchanged (every call is idempotent).

Reported per tick: lease requests answered per second, messages per second and calls
per message, the message's round trip (p50 / p99), and a lease's wait from the moment
it was due to its answer (the tick's wait included). Journal bytes per lease (its
Lease and its ConfirmBatch). *Restart*: at the end of a phase at full load the
coordinator is SIGKILLed and started again on its journal; reported: the time from
the new process's start to it serving, and to the first message answered, and whether
every confirm answered before the kill is in the restarted coordinator's count (the
count after the run equals the positions the load processes saw confirmed).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as _dt
import json
import multiprocessing as mp
import os
import random
import secrets
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path.insert(0, str(BENCH))
sys.path.insert(0, str(ROOT / "tests"))
from docsection import publish, replace_section  # noqa: E402
from machine import git_info, platform_info, proc_cpu  # noqa: E402
from servers import free_port  # noqa: E402

HEADING = "## Coordinator at 1,024 nodes: the node relay's load, the journal, a restart"
RANKS, WORKERS, LEASE, B = 8, 2, 64, 8
#: The consumers' silence limit: registering 16,384 of them one call each takes longer
#: than the default 30 s, and the first would expire before the clock starts.
TIMEOUT = 600.0


def start(state: Path, port: int, world: int, token: str) -> tuple[subprocess.Popen[str], float]:
    """The coordinator on ``127.0.0.1:port``; (process, seconds from spawn to serving)."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-m", "stoker.cli", "coordinator", "--state", str(state),
         "--bind", f"127.0.0.1:{port}", "--world", str(world), "--num-samples", str(1 << 44),
         "--lease-size", str(LEASE), "--metrics-port", "-1", "--timeout", str(TIMEOUT)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "STOKER_COORDINATOR_TOKEN": token},
    )  # fmt: skip
    assert proc.stdout is not None
    for line in proc.stdout:
        if "serving" in line:
            threading.Thread(target=proc.stdout.read, daemon=True).start()  # drain the log
            return proc, time.perf_counter() - t0
    raise RuntimeError("the coordinator did not start")


def du(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


# -- a load process: its nodes --------------------------------------------------------
def _load(
    address: str, token: str, first_node: int, nodes: int, rate: float, phase_q: Any, q: Any
) -> None:  # fmt: skip
    """Nodes ``first_node ..`` of the job: registered, then run through the phases that
    come on ``phase_q`` ((begin, end, tick, paced) in wall time; paced: the tick is at
    least the pace the coordinator's answers ask)."""
    import grpc

    from stoker._proto import coordinator_pb2 as pb
    from stoker._proto import coordinator_pb2_grpc as pb_grpc

    md = [("authorization", f"Bearer {token}")]
    per_node = RANKS * WORKERS
    period = nodes * 2 * per_node / rate  # seconds between a consumer's leases (2 processes)
    out: dict[str, Any] = {"phases": [], "confirmed": 0, "answered_at": [], "failed_at": []}

    async def go() -> None:
        async with grpc.aio.insecure_channel(address) as channel:
            stub = pb_grpc.CoordinatorStub(channel)
            ids: list[list[tuple[int, int]]] = []
            sem = asyncio.Semaphore(64)

            async def register(node: int, k: int) -> tuple[int, int]:
                rank = node * RANKS + k // WORKERS
                async with sem:
                    r = await stub.Register(
                        pb.RegisterRequest(rank=rank, worker=k % WORKERS, node=f"n{node}"),
                        metadata=md,
                    )
                return int(r.consumer), rank

            t = time.perf_counter()
            for n in range(first_node, first_node + nodes):
                ids.append(list(await asyncio.gather(*(register(n, k) for k in range(per_node)))))
            q.put(("registered", time.perf_counter() - t))
            phases: list[tuple[float, float, float, bool]] = phase_q.get(timeout=900)
            stats = [dict(leases=0, messages=0, calls=0, rtt=[], wait=[]) for _ in phases]

            def phase_of(t: float) -> int | None:
                for i, (a, b, *_) in enumerate(phases):
                    if a <= t < b:
                        return i
                return None

            async def send(calls: list[Any], sender: str) -> Any:
                delay = 0.05  # as CoordinatorClient retries: doubling to 2 s, spread
                while True:
                    try:
                        r = await stub.Batch(
                            pb.BatchRequest(calls=calls, sender=sender), metadata=md, timeout=10
                        )
                        out["answered_at"].append(time.time())
                        return r
                    except grpc.aio.AioRpcError as exc:
                        if exc.code() not in (
                            grpc.StatusCode.UNAVAILABLE,
                            grpc.StatusCode.DEADLINE_EXCEEDED,
                            grpc.StatusCode.RESOURCE_EXHAUSTED,
                        ):
                            raise
                        out["failed_at"].append(time.time())
                        await asyncio.sleep(delay * (0.5 + random.random()))
                        delay = min(2 * delay, 2.0)

            async def node(name: str, consumers: list[tuple[int, int]]) -> None:
                rng = random.Random(consumers[0][0])
                pace = 0.0
                now = time.time()
                due = [now + rng.random() * period for _ in consumers]
                seq = {rank: 0 for _, rank in consumers}
                confirms: list[Any] = []
                next_tick = now + rng.random() * 0.005
                end = phases[-1][1]
                while True:
                    now = time.time()
                    if now >= end:
                        return
                    k = phase_of(now)
                    tick, paced = phases[k][2:] if k is not None else (0.005, True)
                    if paced:
                        tick = max(tick, pace)
                    wake = max(next_tick, now if confirms else min(due))
                    if wake > now:
                        await asyncio.sleep(min(wake, end) - now)
                        continue
                    asked = [i for i, d in enumerate(due) if d <= now]
                    calls = confirms + [
                        pb.Call(lease=pb.LeaseRequest(consumer=consumers[i][0], epoch=0))
                        for i in asked
                    ]
                    n_confirm, confirms = len(confirms), []
                    sent = time.time()
                    next_tick = sent + tick
                    r = await send(calls, name)
                    back = time.time()
                    pace = r.pace
                    k = phase_of(sent)
                    st = stats[k] if k is not None else None
                    for c, res in zip(calls[:n_confirm], r.results[:n_confirm], strict=True):
                        if res.WhichOneof("kind") == "confirm_batch":
                            out["confirmed"] += c.confirm_batch.segments[0].rows
                    for i, res in zip(asked, r.results[n_confirm:], strict=True):
                        if res.WhichOneof("kind") != "lease":
                            raise RuntimeError(f"lease refused: {res.error.message}")
                        if res.lease.status != pb.LeaseReply.GRANTED:
                            continue  # WAIT: asked again at the next tick
                        if st is not None:
                            st["leases"] += 1
                            st["wait"].append(back - due[i])
                        cid, rank = consumers[i]
                        rows = res.lease.end - res.lease.start
                        confirms.append(pb.Call(confirm_batch=pb.ConfirmBatchRequest(
                            consumer=cid, epoch=0, seq=seq[rank], batch_size=B, count=rows // B,
                            segments=[pb.Segment(lease=res.lease.lease, upto=res.lease.end,
                                                 rows=rows)],
                        )))  # fmt: skip
                        seq[rank] += rows // B
                        due[i] += period
                    if st is not None:
                        st["messages"] += 1
                        st["calls"] += len(calls)
                        st["rtt"].append(back - sent)

            await asyncio.gather(*(node(f"n{first_node + i}", c) for i, c in enumerate(ids)))
            out["phases"] = stats

    asyncio.run(go())
    q.put(("done", out))


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p * len(xs)))] * 1e3 if xs else float("nan")


def run(
    nodes: int, rate: float, ticks: list[tuple[float, bool]], seconds: float, tmp: Path
) -> dict[str, Any]:
    token = secrets.token_urlsafe(24)
    port = free_port()
    state = tmp / "state"
    world = nodes * RANKS
    proc, first_start = start(state, port, world, token)
    address = f"127.0.0.1:{port}"
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    half = nodes // 2
    settle = 3.0
    t_reg = time.perf_counter()
    # phases begin once everyone registered: their times go to the processes by queue
    phase_q = [ctx.Queue() for _ in range(2)]
    procs = [
        ctx.Process(target=_load, args=(address, token, k * half, half, rate, phase_q[k], q))
        for k in range(2)
    ]
    for p in procs:
        p.start()
    for _ in procs:
        assert q.get(timeout=900)[0] == "registered"
    registered = time.perf_counter() - t_reg  # both processes, registering at once
    t = time.time() + 1.0
    phases = []
    for tick, paced in ticks:
        phases.append((t + settle, t + settle + seconds, tick, paced))  # settle: the rhythm
        t += settle + seconds
    phases.append((t, t + 2 * seconds, *ticks[-1]))  # the restart's phase
    kill_at = t + seconds / 2
    for pq in phase_q:
        pq.put(phases)
    journal = []
    time.sleep(max(0.0, phases[0][0] - time.time()))
    cpu = []
    for a, b, *_ in phases[:-1]:
        time.sleep(max(0.0, a - time.time()))
        before, cpu0 = du(state / "journal"), proc_cpu(proc.pid) or 0.0
        time.sleep(max(0.0, b - time.time()))
        journal.append(du(state / "journal") - before)
        cpu.append(((proc_cpu(proc.pid) or 0.0) - cpu0) / (b - a))
    time.sleep(max(0.0, kill_at - time.time()))
    journal_before_kill = du(state / "journal")
    images_before_kill = du(state / "images") if (state / "images").exists() else 0
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    killed = time.time()
    restart_began = time.time()
    proc, restart_to_serving = start(state, port, world, token)
    outs = [q.get(timeout=900)[1] for _ in procs]
    for p in procs:
        p.join()
    from stoker.coordinator.client import CoordinatorClient

    client = CoordinatorClient(address, token)
    consumed = client.status().consumed
    client.close()
    proc.terminate()
    proc.wait()
    answered_after = min(
        (x for o in outs for x in o["answered_at"] if x > killed), default=float("nan")
    )
    res: dict[str, Any] = {
        "nodes": nodes,
        "consumers": nodes * RANKS * WORKERS,
        "rate": rate,
        "seconds": seconds,
        "register_seconds": registered,
        "first_start_seconds": first_start,
        "journal_bytes_at_kill": journal_before_kill,
        "image_bytes_at_kill": images_before_kill,
        "restart_to_serving_s": restart_to_serving,
        "restart_to_answer_s": answered_after - restart_began,
        "confirmed_by_load": sum(o["confirmed"] for o in outs),
        "consumed_after_restart": int(consumed),
        "phases": [],
    }
    for k, (a, b, tick, paced) in enumerate(phases[:-1]):
        st = [o["phases"][k] for o in outs]
        leases = sum(s["leases"] for s in st)
        msgs = sum(s["messages"] for s in st)
        res["phases"].append(
            {
                "tick": tick,
                "paced": paced,
                "lease_per_s": leases / (b - a),
                "messages_per_s": msgs / (b - a),
                "calls_per_message": sum(s["calls"] for s in st) / max(1, msgs),
                "rtt_p50_ms": pct([x for s in st for x in s["rtt"]], 0.5),
                "rtt_p99_ms": pct([x for s in st for x in s["rtt"]], 0.99),
                "wait_p50_ms": pct([x for s in st for x in s["wait"]], 0.5),
                "wait_p99_ms": pct([x for s in st for x in s["wait"]], 0.99),
                "journal_bytes_per_lease": journal[k] / max(1, leases),
                "coordinator_cores": cpu[k],
            }
        )
    return res


def render(res: dict[str, Any]) -> str:
    r = res["run"]
    ok = r["consumed_after_restart"] == r["confirmed_by_load"]
    lines = [
        HEADING,
        "",
        f"Command: `python benchmarks/scale_bench.py` (with `.venv/bin/python`). Run "
        f"{res['when']}, took {res['took']:.0f} s. Machine: {res['machine']}. The two load "
        "processes share the machine's cores with the coordinator.",
        "",
        __doc__.split("\n\n", 2)[2].strip().replace("\n", " "),
        "",
        f"{r['consumers']:,} consumers on {r['nodes']:,} nodes, offered {r['rate']:,.0f} "
        f"lease requests/s, {r['seconds']:.0f} s per tick (registering them took "
        f"{r['register_seconds']:.0f} s, one call each).",
        "",
        "| relay | lease requests/s | messages/s | calls per message | message round "
        "trip p50 / p99 (ms) | lease wait p50 / p99 (ms) | journal bytes per lease | "
        "coordinator CPU (cores) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
        *(
            f"| {p['tick'] * 1e3:.0f} ms tick{', paced' if p['paced'] else ''} | "
            f"{p['lease_per_s']:,.0f} | {p['messages_per_s']:,.0f} | "
            f"{p['calls_per_message']:.1f} | {p['rtt_p50_ms']:.1f} / {p['rtt_p99_ms']:.1f} | "
            f"{p['wait_p50_ms']:.1f} / {p['wait_p99_ms']:.1f} | "
            f"{p['journal_bytes_per_lease']:.0f} | {p['coordinator_cores']:.2f} |"
            for p in r["phases"]
        ),
        "",
        *_reading(r),
        "",
        f"Restart: the coordinator SIGKILLed at load with {r['journal_bytes_at_kill'] / 1e6:.1f} "
        f"MB of journal and {r.get('image_bytes_at_kill', 0) / 1e6:.1f} MB of images (the "
        f"last two); the new process served {r['restart_to_serving_s']:.2f} s after it "
        f"was started (its first start: {r['first_start_seconds']:.2f} s) and answered the "
        f"first message {r['restart_to_answer_s']:.2f} s after. Positions confirmed: "
        f"{r['consumed_after_restart']:,} by the restarted coordinator's count, "
        f"{r['confirmed_by_load']:,} answered to the load "
        f"({'equal: nothing lost' if ok else '**not equal**'}).",
    ]
    return "\n".join(lines) + "\n"


def _reading(r: dict[str, Any]) -> list[str]:
    """What the table says against the targets (>= 5,000 lease requests/s, lease p99 <=
    20 ms, restart <= 5 s), and the coordinator's cost per call."""
    out = []
    for p in r["phases"]:
        calls = p["messages_per_s"] * p["calls_per_message"]
        name = f"{p['tick'] * 1e3:.0f} ms tick{', paced' if p['paced'] else ''}"
        rate = "met" if p["lease_per_s"] >= 5000 else "**missed**"
        p99 = "met" if p["rtt_p99_ms"] <= 20 else "**missed**"
        out.append(
            f"- {name}: {calls:,.0f} calls/s at {p['coordinator_cores']:.2f} cores of "
            f"coordinator CPU, {1e6 * p['coordinator_cores'] / max(1.0, calls):.0f} us per "
            f"call; lease rate {rate}, round trip p99 {p99}."
        )
    out.append(
        "- The phases run one after another on the same consumers: a phase that answers "
        "fewer leases than offered leaves a backlog of due leases to the next (a rate "
        "above the offered one is that backlog drained), and the waits of both include it. "
        "The load processes take most of the remaining CPU of the two cores."
    )
    restart = "met" if r["restart_to_serving_s"] <= 5 else "**missed**"
    out.append(
        f"- Restart within 5 s: {restart} ({r['restart_to_serving_s']:.1f} s for "
        f"{r['journal_bytes_at_kill'] / 1e6:.0f} MB of journal: the restart loads the last "
        "image of the tables and replays the journal written after it)."
    )
    return out


def _machine() -> str:
    i = platform_info()
    return (
        f"{i.get('Model name', '?')} ({i.get('Architecture', '?')}), {i['cpus']} cores, "
        f"{i.get('Hypervisor vendor', 'no')} hypervisor, Linux {i['kernel']}, Python {i['python']}"
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="small and short; docs untouched")
    ap.add_argument("--nodes", type=int, default=None)
    ap.add_argument("--rate", type=float, default=5000.0, help="offered lease requests/s")
    ap.add_argument(
        "--ticks",
        default="0.005,0.005p",
        help="relay ticks (s), comma-separated; a trailing p: at least the coordinator's pace",
    )
    ap.add_argument("--seconds", type=float, default=None, help="measured seconds per tick")
    ap.add_argument("--render", action="store_true", help="rewrite the docs from the last run")
    args = ap.parse_args()
    if args.render:
        res = json.loads((BENCH / ".work" / "scale.json").read_text())
        replace_section(ROOT / "docs" / "benchmarks.md", HEADING, render(res))
        print(render(res))
        return 0
    nodes = args.nodes or (32 if args.quick else 1024)
    seconds = args.seconds or (3.0 if args.quick else 15.0)
    ticks = [(float(t.rstrip("p")), t.endswith("p")) for t in args.ticks.split(",")]
    t0 = time.perf_counter()
    import tempfile

    with tempfile.TemporaryDirectory() as td:
        rate = args.rate if not args.quick else min(args.rate, 500.0)
        r = run(nodes, rate, ticks, seconds, Path(td))
    res = {
        "when": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "took": time.perf_counter() - t0,
        "machine": _machine(),
        "git": git_info(),
        "run": r,
    }
    publish(res, "scale", args.quick, HEADING, render)
    return 0


if __name__ == "__main__":
    sys.exit(main())
