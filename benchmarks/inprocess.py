"""Per-batch time of stoker's in-process loader against the memmap floor, same process.

    .venv/bin/python benchmarks/inprocess.py [--profile]

Reuses the datasets of tokens_bench.py (run it, or `tokens_bench.py --quick`, first):
the raw corpus for the floor and stoker's dataset written from it. Batches of
(8, 2049) int64 with shuffle on; alternating rounds, medians. Nothing is written
to docs: this is the loop to run while working on num_workers=0 speed.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

import stoker

BENCH = Path(__file__).resolve().parent
L, B = 2048, 8


def floor_ms(raw: np.ndarray, batches: int) -> float:
    perm = np.random.default_rng(0).permutation((len(raw) - 1) // L)
    t = time.perf_counter()
    for b in range(batches):
        idx = perm[b * B : (b + 1) * B]
        torch.from_numpy(np.stack([raw[i * L : i * L + L + 1] for i in idx]).astype(np.int64))
    return (time.perf_counter() - t) / batches * 1e3


def stoker_ms(url: str, batches: int, profile: bool) -> float:
    loader = stoker.TokenLoader(stoker.TokenDataset(url, L, batch_size=B, seed=0), 0)
    it = iter(loader)
    for _ in range(20):
        next(it)
    if profile:
        import cProfile
        import pstats

        pr = cProfile.Profile()
        pr.enable()
    t = time.perf_counter()
    for _ in range(batches):
        next(it)
    ms = (time.perf_counter() - t) / batches * 1e3
    if profile:
        pr.disable()
        pstats.Stats(pr).sort_stats("tottime").print_stats(12)
    return ms


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--profile", action="store_true", help="cProfile stoker's last round")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    work = BENCH / ".work" / "tokens_bench"
    # the floor reads the raw stream stoker's dataset was written from: the full corpus
    # for a full tokens_bench run, its snapshot for --quick
    pairs = [
        (BENCH / ".work" / "tokens.u16", work / "data" / "stoker_dl"),
        (work / "corpus" / "tokens.u16", work / "data-quick" / "stoker_dl"),
    ]
    for raw_path, url in pairs:
        if raw_path.exists() and (url / "manifest.json").exists():
            tokens = stoker.TokenSource(str(url)).manifest.num_tokens
            if tokens == raw_path.stat().st_size // 2:
                break
    else:
        print("run benchmarks/tokens_bench.py (or --quick) first", file=sys.stderr)
        return 1
    raw = np.memmap(raw_path, dtype=np.uint16, mode="r")
    batches = min(1000, (len(raw) - 1) // L // B - 40)
    if batches < 10:
        print(f"{raw_path}: too few tokens for a measurement", file=sys.stderr)
        return 1
    fl, st = [], []
    for r in range(args.rounds):
        fl.append(floor_ms(raw, batches))
        st.append(stoker_ms(str(url), batches, args.profile and r == args.rounds - 1))
    f, s = statistics.median(fl), statistics.median(st)
    print(f"floor {f:.3f} ms/batch, stoker {s:.3f} ms/batch: stoker at {f / s:.2f}x the floor")
    return 0


if __name__ == "__main__":
    sys.exit(main())
