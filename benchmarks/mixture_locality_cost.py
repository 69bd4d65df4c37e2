"""What a mixture's locality report costs a consumer (``stoker.mixture.locality``): the
wall time of one report of epoch 1, the plan walked to it and every rank's first steps
mapped, at a few world sizes and epoch lengths, on the mixture benchmark's three
sources (``mixture_bench.write_sources``; every block counted as held, so the sources'
own holdings cost nothing here). Each figure is the median of ``--rounds`` reports,
each from a fresh mixture.

    python benchmarks/mixture_locality_cost.py [--rounds 3]

prints a table (docs/architecture.md quotes it).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
CASES = ((8, 2_000), (64, 20_000), (1_024, 2_000))


def report_seconds(world: int, spe: int) -> tuple[float, int]:
    """One report's wall time and the positions it found local."""
    import mixture_bench as mb

    import stoker
    from stoker.coordinator.locality import lease_size
    from stoker.mixture.locality import local_ranges

    urls = mb.write_sources(False)
    sources = {
        n: stoker.TokenDataset(urls[n], mb.SEQ_LEN, seed=i) for i, n in enumerate(mb.WEIGHTS)
    }
    mix = stoker.Mixture(
        sources, mb.WEIGHTS, batch_size=mb.BATCH, rank=0, world_size=world, steps_per_epoch=spe
    )

    def every(ids: np.ndarray) -> np.ndarray:
        return np.ones(len(ids), dtype=bool)

    t = time.perf_counter()
    got = local_ranges(
        mix.lease_stream().step_ids, 1, spe, world, mb.BATCH, [every] * len(sources),
        window=lease_size(mix.stream_identity(), 0),
    )  # fmt: skip
    return time.perf_counter() - t, sum(b - a for a, b in got)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    import mixture_bench as mb

    print(
        "| world | steps an epoch | positions an epoch | report (s, median) | positions reported |"
    )
    print("|---|---|---|---|---|")
    for world, spe in CASES:
        runs = [report_seconds(world, spe) for _ in range(args.rounds)]
        secs = statistics.median(r[0] for r in runs)
        n = world * spe * mb.BATCH
        print(f"| {world} | {spe:,} | {n:,} | {secs:.2f} | {runs[0][1]:,} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
