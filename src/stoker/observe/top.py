"""``stoker top``: a live terminal view of a running job, from its metrics endpoints.

Every ``interval`` seconds it scrapes the endpoints again and prints, from the
rates since the last scrape: the job's throughput and stall share, the node
caches' hit ratio and remote bandwidth, a row per node (the endpoints of one
host: its ranks, their tokens/s and stall, its cache hits and remote reads) and
a row per rank (tokens/s, stall, batches ready, consumption at the
coordinator, ``-`` without one); for a mixture, a row per source (its tokens/s, its
share of the samples handed out in the window, the share its weight gives, and its
share of the time the consumers waited on the sources' reads). Rows come from :func:`stoker.observe.doctor.evidence`.
Without endpoints it reads those the machine's stoker processes recorded
(:func:`stoker.observe.doctor.endpoints_or_discover`).
"""

from __future__ import annotations

import sys
import time
import urllib.parse
from typing import TextIO

from stoker.observe import doctor


def host(endpoint: str) -> str:
    """The machine of an endpoint (``host:port`` or a URL)."""
    url = endpoint if "://" in endpoint else f"http://{endpoint}"
    return urllib.parse.urlsplit(url).hostname or endpoint


def by_node(
    before: dict[str, doctor.Samples], after: dict[str, doctor.Samples], seconds: float
) -> dict[str, doctor.Evidence]:
    """The evidence of each node: its endpoints' samples alone."""
    hosts: dict[str, list[str]] = {}
    for ep in after:
        if ep[:1] != "!":
            hosts.setdefault(host(ep), []).append(ep)
    return {
        h: doctor.evidence(
            {ep: before.get(ep, {}) for ep in eps}, {ep: after[ep] for ep in eps}, seconds
        )
        for h, eps in sorted(hosts.items())
    }


def frame(
    ev: doctor.Evidence,
    endpoints: dict[str, doctor.Samples],
    nodes: dict[str, doctor.Evidence] | None = None,
) -> str:
    """One screen of the view (``nodes``: :func:`by_node`)."""
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
    ]
    if nodes:
        ranks_of = {name: ",".join(sorted(n.stall, key=int)) or "-" for name, n in nodes.items()}
        wn = max(16, *(len(name) for name in nodes))
        wr = max(10, *(len(r) for r in ranks_of.values()))
        lines += [
            "",
            f"{'node':<{wn}} {'ranks':<{wr}} {'tokens/s':>12} {'stall':>7} {'hits':>7} "
            f"{'remote MB/s':>12}",
        ]
        for name, n in nodes.items():
            nstall = sum(n.stall.values()) / len(n.stall) if n.stall else 0.0
            lines.append(
                f"{name:<{wn}} {ranks_of[name]:<{wr}} {sum(n.tokens_per_s.values()):>12,.0f} "
                f"{100 * nstall:>6.1f}% {doctor._pct(n.hit_ratio):>7} "
                f"{n.remote_bytes_per_s / 1e6:>12.1f}"
            )
    names = sorted({*ev.source_tokens_per_s, *ev.source_target})
    if names:  # a mixture: its sources, every rank together
        ws = max(16, *(len(n) for n in names))
        lines += [
            "",
            f"{'source':<{ws}} {'tokens/s':>12} {'share':>7} {'target':>7} {'reads':>7}",
        ]
        reads = ev.source_read_share()  # of the time the consumers waited on sources
        for name in names:
            share, target = ev.source_share.get(name), ev.source_target.get(name)
            lines.append(
                f"{name:<{ws}} {ev.source_tokens_per_s.get(name, 0.0):>12,.0f} "
                f"{doctor._pct(share):>7} {doctor._pct(target):>7} "
                f"{doctor._pct(reads.get(name)):>7}"
            )
    lines += [
        "",
        f"{'rank':>6} {'tokens/s':>12} {'stall':>7} {'ready':>6} {'consumed/s':>11}",
    ]
    for r in ranks:
        consumed = ev.consumed_per_s.get(r)  # none without a coordinator
        lines.append(
            f"{r:>6} {ev.tokens_per_s.get(r, 0.0):>12,.0f} {100 * ev.stall[r]:>6.1f}% "
            f"{ready.get(r, 0):>6.0f} {'-' if consumed is None else f'{consumed:.0f}':>11}"
        )
    errors = endpoints.get("!errors")
    if errors:
        lines.append("")
        lines += [f"unreachable: {name}" for (name, _) in errors]
    return "\n".join(lines)


def run(
    endpoints: list[str] | None,
    interval: float = 2.0,
    iterations: int | None = None,
    out: TextIO = sys.stdout,
) -> int:
    endpoints = doctor.endpoints_or_discover(endpoints)
    before, t0 = doctor.scrape(endpoints), time.monotonic()
    n = 0
    while iterations is None or n < iterations:
        time.sleep(interval)  # the measurement window
        after, t1 = doctor.scrape(endpoints), time.monotonic()
        ev = doctor.evidence(before, after, t1 - t0)
        clear = "\x1b[2J\x1b[H" if out.isatty() else ""
        out.write(clear + frame(ev, after, by_node(before, after, t1 - t0)) + "\n")
        out.flush()
        before, t0 = after, t1
        n += 1
    return 0
