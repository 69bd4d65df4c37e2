"""Sets of integers as sorted, disjoint half-open intervals (pure).

An interval set is an int64 array of shape ``(k, 2)``; row ``[a, b)``. The
*ordered index* of a member is its rank in the set, so a set also reads as a
sequence: the first ``n`` members, members ``[i, j)``, and so on.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

Intervals = np.ndarray


def make(pairs: Iterable[tuple[int, int]] | np.ndarray) -> Intervals:
    """Normalise pairs: drop empty ones, sort, merge overlapping and adjacent ones."""
    arr = np.asarray(list(pairs) if not isinstance(pairs, np.ndarray) else pairs, dtype=np.int64)
    arr = arr.reshape(-1, 2)
    arr = arr[arr[:, 1] > arr[:, 0]]
    if len(arr) == 0:
        return np.zeros((0, 2), dtype=np.int64)
    arr = arr[np.argsort(arr[:, 0], kind="stable")]
    merged = [list(arr[0])]
    for a, b in arr[1:]:
        if a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    return np.asarray(merged, dtype=np.int64)


def size(iv: Intervals) -> int:
    return int((iv[:, 1] - iv[:, 0]).sum())


def union(a: Intervals, b: Intervals) -> Intervals:
    return make(np.concatenate([a, b]))


def subtract(a: Intervals, b: Intervals) -> Intervals:
    """Members of ``a`` not in ``b``."""
    out: list[tuple[int, int]] = []
    b = make(b)
    j = 0
    for start, stop in a:
        cur = int(start)
        while j < len(b) and b[j, 1] <= cur:
            j += 1
        k = j
        while k < len(b) and b[k, 0] < stop:
            if b[k, 0] > cur:
                out.append((cur, int(b[k, 0])))
            cur = max(cur, int(b[k, 1]))
            k += 1
        if cur < stop:
            out.append((cur, int(stop)))
    return make(out)


def slice_ordered(iv: Intervals, lo: int, hi: int) -> Intervals:
    """Members with ordered index in ``[lo, hi)``, as intervals."""
    if hi <= lo:
        return np.zeros((0, 2), dtype=np.int64)
    lengths = iv[:, 1] - iv[:, 0]
    ends = np.cumsum(lengths)
    starts = ends - lengths
    out = []
    for (a, _b), s, e in zip(iv, starts, ends):
        if e <= lo or s >= hi:
            continue
        out.append((int(a + max(lo - s, 0)), int(a + min(hi, e) - s)))
    return make(out)


def members_at(iv: Intervals, idx: np.ndarray) -> np.ndarray:
    """The members with the given ordered indices (vectorised)."""
    idx = np.asarray(idx, dtype=np.int64)
    lengths = iv[:, 1] - iv[:, 0]
    ends = np.cumsum(lengths)
    starts = ends - lengths
    which = np.searchsorted(ends, idx, side="right")
    if idx.size and (idx.min() < 0 or which.max() >= len(iv)):
        raise IndexError(f"ordered index out of range [0, {int(ends[-1]) if len(ends) else 0})")
    return iv[which, 0] + (idx - starts[which])


def to_list(iv: Intervals) -> list[list[int]]:
    return [[int(a), int(b)] for a, b in iv]
