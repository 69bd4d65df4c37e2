"""What mapping a whole data epoch costs under the spread order (``SpreadOrder.samples``,
one call for every slot), per sample, for epochs from a few hundred samples (a small
mixture source, whose turns are nearly all irregular) to a million, side by side with
another commit's code (``--against REF``, checked out into a temporary worktree).

Each figure is the fastest of ``--repeat`` calls in a fresh process, interleaved.
Units of 256 samples (a block's worth at seq_len 2048 and the default block size),
mean spread 4 (the defaults).

    python benchmarks/order_bench.py [--against REF] [--repeat 7]

writes docs/benchmarks.md's "Spread order" section.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
HEADING = "## Spread order: mapping a whole epoch, per sample"
SIZES = (450, 4_829, 13_276, 100_000, 1_000_000)
UNIT = 256


def child(repeat: int) -> dict[str, float]:
    """ns per sample of mapping each epoch size whole, with the stoker on sys.path."""
    import numpy as np

    from stoker.plan import ShuffleConfig, SpreadOrder

    out = {}
    for size in SIZES:
        order = SpreadOrder(size, ShuffleConfig(0, True, UNIT, 16, "spread", 4), 0)
        slots = np.arange(size, dtype=np.int64)
        best = float("inf")
        for _ in range(repeat):
            t = time.perf_counter()
            order.samples(slots)
            best = min(best, time.perf_counter() - t)
        out[str(size)] = best / size * 1e9
    return out


def run(src: Path, repeat: int) -> dict[str, float]:
    code = (
        f"import sys, json; sys.path.insert(0, {str(src)!r}); sys.path.insert(1, {str(HERE)!r});"
        f"import order_bench; print(json.dumps(order_bench.child({repeat})))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return {k: float(v) for k, v in json.loads(out.stdout.strip().splitlines()[-1]).items()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--against", help="a commit to compare with (default: none)")
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    from docsection import replace_section
    from machine import git_info, platform_info

    here = HERE.parent / "src"
    trees: dict[str, Path] = {"this": here}
    with tempfile.TemporaryDirectory() as tmp:
        if args.against:
            wt = Path(tmp) / "against"
            subprocess.run(
                ["git", "worktree", "add", "--detach", str(wt), args.against],
                cwd=HERE.parent, check=True, capture_output=True,
            )  # fmt: skip
            trees["against"] = wt / "src"
        try:
            got: dict[str, list[dict[str, float]]] = {k: [] for k in trees}
            for _ in range(args.rounds):
                for name, src in trees.items():
                    got[name].append(run(src, args.repeat))
        finally:
            if args.against:
                subprocess.run(
                    ["git", "worktree", "remove", "--force", str(Path(tmp) / "against")],
                    cwd=HERE.parent, check=False, capture_output=True,
                )  # fmt: skip
    best = {n: {s: min(r[str(s)] for r in rs) for s in SIZES} for n, rs in got.items()}
    res: dict[str, Any] = {"machine": platform_info(), "git": git_info(), "best_ns": best}
    print(json.dumps(best, indent=1))
    replace_section(HERE.parent / "docs" / "benchmarks.md", HEADING, section(res, args))
    return 0


def section(res: dict[str, Any], args: argparse.Namespace) -> str:
    m, best = res["machine"], res["best_ns"]
    against = args.against
    lines = [
        HEADING,
        "",
        f"`python benchmarks/order_bench.py{' --against ' + against if against else ''}` "
        f"(fastest of {args.repeat} calls a process, {args.rounds} interleaved rounds; "
        f"commit {res['git']}; {m.get('Model name')}, {m.get('cpus')} CPUs). One call maps "
        f"every slot of a data epoch (`SpreadOrder.samples`), units of {UNIT} samples, "
        "mean spread 4. An epoch of fewer than about 22 units has no regular turn (a turn "
        "holds a whole unit's worth only once 22 units have arrived, and the last 21 "
        "turns and the short unit's are irregular too): a small mixture source's.",
        "",
        "| samples an epoch | ns a sample |" + (f" at {against} | ratio |" if against else ""),
        "|---|---|" + ("---|---|" if against else ""),
    ]
    for s in SIZES:
        row = f"| {s:,} | {best['this'][s]:.0f} |"
        if against:
            row += f" {best['against'][s]:.0f} | {best['against'][s] / best['this'][s]:.1f}x |"
        lines.append(row)
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
