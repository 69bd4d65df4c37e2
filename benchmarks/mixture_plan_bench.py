"""What planning a mixture costs a rank as the world grows: ``MixPlan.take`` (the quota
method's counts, each source's samples of a step, the deal to every rank) and the whole
position map of one rank (``MixStream.samples``, the sources' own shuffles left out:
each maps a position to itself), per global step, at world sizes 1 to 1,000.

Three sources at 0.5 / 0.3 / 0.2 of 10M samples each, ``batch_size`` 8 a rank; weights
constant, and a linear schedule (weights that change every step: each step a stretch
of its own). Every figure is the median of ``--rounds`` runs in this process.

    python benchmarks/mixture_plan_bench.py [--rounds 5] [--steps 4096]

writes docs/benchmarks.md's "Mixture plan" section and
``benchmarks/.work/mixture/plan.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
WORK = HERE / ".work" / "mixture"
HEADING = "## Mixture plan: a rank's cost per step as the world grows"
BATCH = 8
SIZES = [10_000_000] * 3
WORLDS = (1, 8, 100, 1000)
#: Steps timed with a linear schedule (a stretch a step: slower): the stream's own
#: stretch (``MixStream.AHEAD``), so what it maps is what it plans.
LINEAR_STEPS = 512


def schedule(kind: str) -> Any:
    from stoker import WeightSchedule

    if kind == "constant":
        return WeightSchedule.constant({"web": 5, "code": 3, "book": 2})
    return WeightSchedule.of(
        [(0, {"web": 5, "code": 3, "book": 2}), (1_000_000, {"web": 2, "code": 3, "book": 5})],
        linear=True,
    )


def plan(kind: str, world: int) -> Any:
    from stoker.mixture.plan import MixPlan

    return MixPlan(schedule(kind), BATCH, world, lambda i, _e: SIZES[i])


def time_take(kind: str, world: int, steps: int) -> float:
    """Seconds per step of ``take(steps, [0])`` from a fresh plan."""
    p = plan(kind, world)
    t = time.perf_counter()
    p.take(steps, [0])
    return (time.perf_counter() - t) / steps


def time_map(kind: str, world: int, steps: int) -> float:
    """Seconds per step of mapping rank ``world - 1``'s positions of ``steps`` steps."""
    from stoker.mixture.stream import MixStream

    spe = 1 << 20  # an epoch far longer than what is mapped
    s = MixStream(
        lambda: plan(kind, world),
        None,
        spe,
        [lambda q: np.asarray(q, dtype=np.int64)] * 3,
        SIZES,
    )
    rank = world - 1
    positions = rank * spe * BATCH + np.arange(steps * BATCH, dtype=np.int64)
    t = time.perf_counter()
    s.samples(positions)
    return (time.perf_counter() - t) / steps


def time_skip(kind: str, steps: int) -> float:
    """Seconds per step of ``skip_to(steps)`` from a fresh plan at world 8 (counts only:
    what ``set_epoch`` and a pass's base cost)."""
    p = plan(kind, 8)
    t = time.perf_counter()
    p.skip_to(steps)
    return (time.perf_counter() - t) / steps


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=4096)
    ap.add_argument("--no-docs", action="store_true", help="leave docs/benchmarks.md as it is")
    args = ap.parse_args()
    from docsection import replace_section
    from machine import git_info, platform_info

    got: dict[str, dict[str, dict[int, float]]] = {}
    for kind in ("constant", "linear"):
        for what, fn in (("take", time_take), ("map", time_map)):
            per = got.setdefault(kind, {}).setdefault(what, {})
            for world in WORLDS:
                steps = args.steps if kind == "constant" else LINEAR_STEPS
                per[world] = statistics.median(fn(kind, world, steps) for _ in range(args.rounds))
    skip = {
        "constant": statistics.median(time_skip("constant", 1_000_000) for _ in range(args.rounds)),
        "linear": statistics.median(time_skip("linear", 2000) for _ in range(args.rounds)),
    }
    res = {
        "skip_seconds_per_step": skip,
        "machine": platform_info(),
        "git": git_info(),
        "rounds": args.rounds,
        "steps": args.steps,
        "seconds_per_step": got,
        "load_avg": os.getloadavg()[0],
    }
    WORK.mkdir(parents=True, exist_ok=True)
    (WORK / "plan.json").write_text(json.dumps(res, indent=1))
    print(json.dumps(got, indent=1))
    if not args.no_docs:
        replace_section(HERE.parent / "docs" / "benchmarks.md", HEADING, section(res))
    return 0


def section(res: dict[str, Any]) -> str:
    m, got = res["machine"], res["seconds_per_step"]
    head = " | ".join(f"world {w}" for w in WORLDS)
    lines = [
        HEADING,
        "",
        f"`python benchmarks/mixture_plan_bench.py` (median of {res['rounds']} runs; "
        f"{res['steps']} steps with constant weights, {LINEAR_STEPS} with a "
        f"linear schedule; commit {res['git']}; {m.get('Model name')}, {m.get('cpus')} CPUs, "
        f"load average {res['load_avg']:.1f}). Three sources at 0.5 / 0.3 / 0.2, batch "
        f"{BATCH} a rank; microseconds per global step, for one rank (what each rank's "
        "process pays: a step of the rank's batch).",
        "",
        f"| weights | what | {head} |",
        "|---|---|" + "---|" * len(WORLDS),
    ]
    for kind in ("constant", "linear"):
        for what, label in (("take", "`MixPlan.take`"), ("map", "position map, one rank")):
            row = " | ".join(f"{got[kind][what][w] * 1e6:.1f}" for w in WORLDS)
            lines.append(f"| {kind} | {label} | {row} |")
    sk = res["skip_seconds_per_step"]
    lines += [
        "",
        f"`MixPlan.skip_to` (counts only, world 8): {sk['constant'] * 1e6 * 1e6:.0f} us for "
        f"1M steps with constant weights (constant time a stretch), {sk['linear'] * 1e6:.0f} "
        "us a step with the linear schedule (over 2,000 steps: a ramp's steps together).",
        "",
        "The deal to every rank is arithmetic over arrays of steps x 2 slots a source x "
        "world, so take grows with the world; a stretch is capped at a million entries "
        "(at world 1,000, 174 steps a pass). With a schedule whose weights change every "
        "step each step is a stretch of its own, with weights of its own, given out from "
        "zero: a ramp's steps are planned together (`stoker.mixture.apportion.quota_rows`: "
        "the quota method's samples still one at a time, but for up to 4,096 steps in one "
        "array operation each), so a step costs a few array operations per sample of the "
        "global batch, shared among the steps. Given out one by one, step by step (commit "
        "dace7c1 on an AMD EPYC), a ramp's step cost 293 / 369 / 832 / 5,317 us to take at "
        "world 1 / 8 / 100 / 1,000 and 55 us to skip at world 8.",
    ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
