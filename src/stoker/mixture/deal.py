"""How a mixture's step is shared among the ranks (pure).

Each source's epoch is cut into one contiguous share per rank, as a single
dataset's is (:class:`~stoker.plan.EpochSplit`), so that a rank reads its own
blocks. The step's samples of a source, the ``taken`` after the first ``done`` of
its epoch (its in-epoch counts), are dealt to the ranks in turn: sample ``k`` of
the epoch goes to rank ``k % world`` as that rank's local sample ``k // world``
(:func:`deal`). So after any step every rank has taken a prefix of its share, the
prefixes differ by at most one sample between ranks, and how long each is follows
from the source's count alone (:func:`rank_counts`): a mixture's state needs no
per-rank numbers.

Dealt so, a rank's count for the step can be off its batch size by up to one per
source; :func:`balance` moves the surplus samples of the ranks over it to the ranks
under it (the lowest ranks first, deterministically), which read those few samples
from another rank's share. Every sample of the step is still read exactly once.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np


def rank_counts(done: int, world: int) -> np.ndarray:
    """How many of their share's samples each rank has taken after the first ``done``
    samples of an epoch were dealt."""
    r = np.arange(world)
    return (done - r + world - 1) // world


def deal(done: int, taken: int, world: int) -> tuple[np.ndarray, np.ndarray]:
    """Each rank's local sample range ``[start[r], stop[r])`` of samples ``done <= k <
    done + taken`` of an epoch."""
    return rank_counts(done, world), rank_counts(done + taken, world)


#: One sample of a step: (source, the rank whose share holds it, its local index there).
Item = tuple[int, int, int]


def balance(dealt: Sequence[tuple[np.ndarray, np.ndarray]], batch: int) -> list[list[Item]]:
    """Each rank's ``batch`` samples of a step, from what each source dealt the ranks
    (:func:`deal`'s ranges, one pair per source); the dealt counts must sum to
    ``batch * world``. A rank keeps what it was dealt up to ``batch`` (its sources in
    order), and its surplus (the last of its items) fills the ranks under ``batch``."""
    if not dealt:
        raise ValueError("a step needs at least one source")
    world = len(dealt[0][0])
    per_rank: list[list[Item]] = [[] for _ in range(world)]
    for i, (start, stop) in enumerate(dealt):
        for r in range(world):
            per_rank[r].extend((i, r, int(j)) for j in range(int(start[r]), int(stop[r])))
    total = sum(len(p) for p in per_rank)
    if total != batch * world:
        raise ValueError(f"the step dealt {total} samples, {batch} x {world} ranks expected")
    surplus: list[Item] = []
    for items in per_rank:
        surplus.extend(items[batch:])
        del items[batch:]
    for items in per_rank:
        need = batch - len(items)
        if need > 0:
            items.extend(surplus[:need])
            del surplus[:need]
    return per_rank


def rank_batch(dealt: Sequence[tuple[np.ndarray, np.ndarray]], batch: int, rank: int) -> list[Item]:
    """``balance(dealt, batch)[rank]`` without making the other ranks' batches: what a
    rank reads of a step, in O(world + batch)."""
    counts = sum((stop - start for start, stop in dealt), np.zeros(len(dealt[0][0]), int))
    world = len(counts)
    if int(counts.sum()) != batch * world:
        raise ValueError(f"the step dealt {int(counts.sum())} samples, {batch} x {world} expected")

    def items_of(r: int, lo: int, hi: int) -> list[Item]:
        """Items ``lo <= n < hi`` of rank ``r``'s dealt list (its sources in order)."""
        out: list[Item] = []
        at = 0
        for i, (start, stop) in enumerate(dealt):
            a, b = int(start[r]), int(stop[r])
            n = b - a
            take_lo, take_hi = max(lo - at, 0), min(hi - at, n)
            out.extend((i, r, j) for j in range(a + take_lo, a + take_hi))
            at += n
        return out

    mine = items_of(rank, 0, batch)
    need = batch - len(mine)
    if need <= 0:
        return mine
    over = np.maximum(counts - batch, 0)
    under = np.maximum(batch - counts, 0)
    offset = int(under[:rank].sum())  # surplus items taken by the ranks under before this one
    seen = 0
    for r in (int(x) for x in np.flatnonzero(over)):
        n = int(over[r])
        lo, hi = max(offset - seen, 0), min(offset + need - seen, n)
        if lo < hi:
            c = int(counts[r])
            mine.extend(items_of(r, c - n + lo, c - n + hi))
        seen += n
        if seen >= offset + need:
            break
    return mine


class EpochSamples(Protocol):
    """How many samples a source's epoch deals (its ranks' shares together)."""

    def __call__(self, source: int, epoch: int) -> int: ...


#: Where a step's samples of one source come from: (source, its epoch, samples of that
#: epoch taken before the step, samples taken in the step).
Segment = tuple[int, int, int, int]


def segments(
    before: Sequence[tuple[int, int]], taken: Sequence[int], epoch_samples: EpochSamples
) -> tuple[list[Segment], list[tuple[int, int]]]:
    """A step's segments and every source's ``(epoch, taken of it)`` after the step, from
    those before it and the step's count per source; a source whose epoch runs out in
    the step goes on with its next (``epoch_samples(source, epoch)``: how many samples
    that epoch deals, at least one)."""
    segs: list[Segment] = []
    after: list[tuple[int, int]] = []
    for i, ((epoch, done), n) in enumerate(zip(before, taken, strict=True)):
        while n > 0:
            size = epoch_samples(i, epoch)
            if size < 1:
                raise ValueError(f"source {i}'s epoch {epoch} deals no sample")
            part = min(n, size - done)
            segs.append((i, epoch, done, part))
            n -= part
            done += part
            if done == size:
                epoch, done = epoch + 1, 0
        after.append((epoch, done))
    return segs, after
