"""Where a node's next fresh lease starts: the coordinator's side of locality (pure).

Consumers report the positions their node's cache holds
(:mod:`stoker.coordinator.holdings`), and a node that is granted a lease claims the
shuffle windows it touches (its reader fetches their blocks). With
``Config.locality`` the lease table grants a node its own positions first,
then positions that belong to no node, then the front of the queue. Every
range list here is sorted and disjoint (:mod:`stoker.coordinator.ranges`).
"""

from __future__ import annotations

import json
import math
from fractions import Fraction
from typing import Any

from stoker.coordinator import ranges
from stoker.plan import spread_profile


def windows(stream: str) -> tuple[int, int, int] | None:
    """``(samples per data epoch, positions per shuffle window, shift)`` of a consumers'
    stream description: window ``w > 0`` starts at ``w * W - shift`` positions into a data
    epoch, give or take the one short shard or unit. The window order's windows start
    every ``shard_size * window_shards`` positions (shift 0); the spread order's every
    ``window_shards`` turns, and its turns start ``sum(d * n_d)`` positions early (what its
    first units still deal out). None when the description does not say."""
    try:
        s = json.loads(stream) if stream else None
        if s is None:
            return None
        S, W = int(s["num_samples"]), int(s["shard_size"]) * int(s["window_shards"])
        shift = sum(d * c for d, c in enumerate(_profile(s)))
    except (ValueError, KeyError, TypeError, AttributeError):
        return None
    return (S, W, shift) if S > 0 and W > 0 else None


def _profile(s: dict[str, Any]) -> tuple[int, ...]:
    """How a unit's samples are dealt over the turns (:func:`spread_profile`) in a stream
    description of the spread order; empty for the window order."""
    if s.get("order", "window") != "spread":
        return ()
    return spread_profile(int(s["shard_size"]), int(s["spread"]))


def lease_size(stream: str, configured: int) -> int:
    """Positions per fresh lease for consumers of ``stream``: ``configured``, and for the
    spread order at least four times the turns over which a unit's samples are dealt
    (plus one), in positions. A block's samples are read by one job only while they lie
    in what its reader knows (its lease, and the next one once it asks ahead half way):
    with leases shorter than that reach, nearly every block is decoded once per lease
    it falls in (measured: 0.54x the static plan's rate at 4,096-position leases)."""
    try:
        s = json.loads(stream) if stream else {}
        if "mixture" in s:
            return _mixture_lease(s, configured)
        turns = len(_profile(s))
        return max(configured, 4 * (turns + 1) * int(s["shard_size"])) if turns else configured
    except (ValueError, KeyError, TypeError, AttributeError, ZeroDivisionError):
        return configured


def positions_per_epoch(stream: str) -> int | None:
    """The positions an epoch holds, where a consumers' stream description says so (a
    mixture's: its steps an epoch x batch size x the world its plan was made on); None
    when it does not (a dataset's epoch is its samples, which the coordinator is given)."""
    try:
        s = json.loads(stream) if stream else None
        if not isinstance(s, dict) or "mixture" not in s:
            return None
        n = int(s["steps_per_epoch"]) * int(s["batch_size"]) * int(s["world"])
    except (ValueError, KeyError, TypeError, RecursionError):
        return None
    return n if n > 0 else None


#: A mixture's fresh leases are no longer than this, whatever its weights (unless the
#: configured lease size is longer).
MIXTURE_LEASE_MAX = 1 << 22


def _mixture_lease(s: dict[str, Any], configured: int) -> int:
    """A mixture's lease: a source of least weight ``w`` gets about ``w`` of a lease's
    positions (they map to a stretch of its own positions), so the lease is long enough
    that each source's part is as long as that source would lease alone."""
    weights = s["weights"]
    size = configured
    for i, name in enumerate(weights["names"]):
        need = lease_size(json.dumps(s["mixture"][name]), 0)
        # its least weight while it is read at all (a weight of 0 reads nothing)
        given = [w for w in (Fraction(ws[i]) for _, ws in weights["points"]) if w > 0]
        if need and given:
            size = max(size, math.ceil(need / min(given)))
    return min(size, max(configured, MIXTURE_LEASE_MAX))


def pick(
    queue: list[tuple[int, int]],
    node: str,
    local: dict[str, list[tuple[int, int]]],
    claimed: dict[str, list[tuple[int, int]]],
) -> tuple[int, int, int]:
    """Where ``node``'s next fresh lease starts in the (non-empty) ``queue``:
    ``(queue index, start, limit)``.

    The first queued positions of ``node`` (``local``: its cache holds them, or
    ``claimed``: they are in a shuffle window granted to the node before, so its
    reader has that window's blocks); else the first that belong to no other node;
    else the front. Without a node, or with no node known, the front.
    """
    a, b = queue[0]
    if not node or not (local or claimed):
        return 0, a, b
    mine = sorted(local.get(node, []) + claimed.get(node, []))
    for i, (qa, qb) in enumerate(queue):
        for la, lb in mine:
            if la < qb and qa < lb:
                return i, max(qa, la), min(qb, lb)
    others = sorted(
        r for table in (local, claimed) for n, rs in table.items() if n != node for r in rs
    )
    for i, (qa, qb) in enumerate(queue):
        start = qa
        for la, lb in others:
            if lb <= start:
                continue
            if la > start:
                break
            start = lb  # inside another node's cached part: skip past it
        if start < qb:
            nxt = next((la for la, _ in others if la > start), qb)
            return i, start, min(qb, nxt)
    return 0, a, b


def claim(
    claimed: list[tuple[int, int]], geometry: tuple[int, int, int], start: int, end: int
) -> None:
    """Add the shuffle windows that positions ``[start, end)`` touch to a node's
    ``claimed`` ranges (in place); ``geometry`` is :func:`windows`'s answer."""
    S, W, shift = geometry
    base = (start // S) * S

    def first(w: int) -> int:  # where window w starts in the data epoch
        return min(max(w * W - shift, 0), S)

    for w in range((start - base + shift) // W, (end - 1 - base + shift) // W + 1):
        if first(w) < first(w + 1):
            ranges.insert(claimed, (base + first(w), base + first(w + 1)))
