"""Which positions of a mixture's epoch a node's cache already holds (pure).

A single dataset's locality is its shuffle windows (:mod:`stoker.coordinator.holdings`):
their samples come from a few known units. A mixture's positions have no such
windows of their own: a stretch of a rank's steps draws from every source, each from
a stretch of that source's own order. So a mixture's report is measured, not derived:
each rank's share of the epoch is cut into windows of whole steps, the windows'
positions are mapped to their sources' samples by the mixture's plan (every rank's
steps in one walk of it), and each source says which of its samples the node holds
every block of. A window whose samples the node holds at least ``threshold`` of is
local. The coordinator grants a node's local positions first, as it does a single
dataset's.

Every consumer reports when its epoch begins, so a report looks only at the first
:data:`REACH` positions of the epoch's shares (the same first steps of every rank's
share, in whole windows): past them, leases go in the queue's order, as without
locality.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from stoker.mixture.stream import decode

#: A window is at least this many steps of one rank (or its whole share, when shorter).
WINDOW_STEPS = 64
#: Positions of an epoch a report looks at, at most (at least one window a share).
REACH = 1 << 17


def local_ranges(
    step_ids: Callable[[int, int], np.ndarray],
    epoch: int,
    steps_per_epoch: int,
    world: int,
    batch_size: int,
    holds: Sequence[Callable[[np.ndarray], np.ndarray]],
    window: int = 0,
    threshold: float = 0.5,
    reach: int = REACH,
) -> list[tuple[int, int]]:
    """Stream positions of the mixture's epoch ``epoch`` whose windows the node holds,
    as sorted disjoint ranges.

    ``step_ids(step, n)`` gives every rank's mixture sample ids of global steps ``[step,
    step + n)``, shape ``(world, n, batch_size)``; an epoch is ``steps_per_epoch`` steps;
    ``holds[i]`` tells of source ``i``'s own sample ids whether the node holds every
    block each is read from. A window is ``window`` positions of a rank's share (at
    least :data:`WINDOW_STEPS` steps), in whole steps; the first windows of each share
    are looked at, ``reach`` positions in all (windows shrink to keep to it, down to
    one step).
    """
    spe, B = steps_per_epoch, max(1, batch_size)
    if spe < 1 or world < 1:
        return []
    reach_steps = max(1, reach // (world * B))  # steps of each share looked at
    w = min(spe, reach_steps, max(WINDOW_STEPS, -(-window // B)))  # steps a window
    windows = min(-(-spe // w), max(1, reach_steps // w))
    steps = min(spe, windows * w)
    got = np.asarray(step_ids(epoch * spe, steps), dtype=np.int64)
    if got.shape != (world, steps, B):  # (an epoch planned on another world: no report)
        return []
    ids = got.reshape(-1)
    src, sid = decode(ids)
    held = np.zeros(len(ids), dtype=bool)
    for i, test in enumerate(holds):
        mine = src == i
        if mine.any():
            held[mine] = test(sid[mine])
    per_step = held.reshape(world, steps, B).mean(axis=2)  # (world, steps)
    per_rank = spe * B
    out: list[tuple[int, int]] = []
    for r in range(world):
        share = epoch * per_rank * world + r * per_rank
        for j in range(windows):
            a, b = j * w, min((j + 1) * w, steps)
            if per_step[r, a:b].mean() < threshold:
                continue
            lo, hi = share + a * B, share + b * B
            if out and out[-1][1] == lo:
                out[-1] = (out[-1][0], hi)
            else:
                out.append((lo, hi))
    return out
