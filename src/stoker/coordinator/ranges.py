"""Position ranges as the lease table keeps them: lists of ``(start, end)`` tuples (pure).

The table's queue, its consumed positions and each node's cached and claimed
windows are *sorted, disjoint* lists of half-open ranges, changed in place one
range at a time. :mod:`stoker.intervals` holds the same sets as int64 arrays
for the plans; these helpers stay on plain tuples of Python ints, which the
table records in its journal events and compares after a replay.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence


def insert(ranges: list[tuple[int, int]], new: tuple[int, int]) -> None:
    """Insert ``new`` into sorted disjoint ``ranges``, merging neighbours (in place)."""
    a, b = new
    i = bisect.bisect_left(ranges, (a, b))
    if i > 0 and ranges[i - 1][1] >= a:
        i -= 1
        a = min(a, ranges[i][0])
        b = max(b, ranges[i][1])
        del ranges[i]
    while i < len(ranges) and ranges[i][0] <= b:
        b = max(b, ranges[i][1])
        del ranges[i]
    ranges.insert(i, (a, b))


def merged(pairs: Iterable[Sequence[int]]) -> list[tuple[int, int]]:
    """Any ``[a, b]`` pairs as sorted disjoint ranges: empty ones dropped, overlapping and
    adjacent ones merged."""
    out: list[tuple[int, int]] = []
    for a, b in sorted((int(a), int(b)) for a, b in pairs):
        if b > a:
            insert(out, (a, b))
    return out


def subtract(a: list[tuple[int, int]], b: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The positions of ``a`` not in ``b`` (``b`` sorted), range by range of
    ``a``: neighbouring ranges of ``a`` stay apart."""
    out = []
    for start, stop in a:
        cur = start
        for x, y in b:
            if y <= cur or x >= stop:
                continue
            if x > cur:
                out.append((cur, x))
            cur = max(cur, y)
        if cur < stop:
            out.append((cur, stop))
    return out
