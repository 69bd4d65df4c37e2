"""``stoker top``: a live terminal view of a running job, from its metrics endpoints.

Every ``interval`` seconds it scrapes the endpoints again and prints, from the
rates since the last scrape: the job's throughput and stall share, the node
caches' hit ratio and remote bandwidth, and a row per rank (tokens/s, stall,
batches ready, worker busy share). Rows come from :func:`stoker.doctor.evidence`.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO

from stoker import doctor


def frame(ev: doctor.Evidence, endpoints: dict[str, doctor.Samples]) -> str:
    """One screen of the view."""
    ranks = sorted(ev.stall, key=int)
    total = sum(ev.tokens_per_s.values())
    stall = sum(ev.stall.values()) / len(ranks) if ranks else 0.0
    ready: dict[str, float] = {}
    for s in endpoints.values():
        ready.update(doctor._by(s, "stoker_loader_ready_batches", "rank"))
    lines = [
        f"stoker top — {len(ranks)} ranks, {len([e for e in endpoints if e[:1] != '!'])} "
        f"endpoints, last {ev.seconds:.1f} s",
        f"throughput {total:,.0f} tokens/s   stall {100 * stall:.1f}%   "
        f"cache hits {doctor._pct(ev.hit_ratio)}   remote {ev.remote_bytes_per_s / 1e6:.1f} MB/s"
        f"   workers busy {doctor._pct(ev.worker_busy)}",
        "",
        f"{'rank':>6} {'tokens/s':>12} {'stall':>7} {'ready':>6} {'consumed/s':>11}",
    ]
    for r in ranks:
        lines.append(
            f"{r:>6} {ev.tokens_per_s.get(r, 0.0):>12,.0f} {100 * ev.stall[r]:>6.1f}% "
            f"{ready.get(r, 0):>6.0f} {ev.consumed_per_s.get(r, float('nan')):>11.0f}"
        )
    errors = endpoints.get("!errors")
    if errors:
        lines.append("")
        lines += [f"unreachable: {name}" for (name, _) in errors]
    return "\n".join(lines)


def run(
    endpoints: list[str],
    interval: float = 2.0,
    iterations: int | None = None,
    out: TextIO = sys.stdout,
) -> int:
    before, t0 = doctor.scrape(endpoints), time.monotonic()
    n = 0
    while iterations is None or n < iterations:
        time.sleep(interval)  # the measurement window
        after, t1 = doctor.scrape(endpoints), time.monotonic()
        ev = doctor.evidence(before, after, t1 - t0)
        clear = "\x1b[2J\x1b[H" if out.isatty() else ""
        out.write(clear + frame(ev, after) + "\n")
        out.flush()
        before, t0 = after, t1
        n += 1
    return 0
