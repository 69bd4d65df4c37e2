"""Cutting a plan of samples into decode jobs (pure: arrays in, arrays out).

A sample of ``seq_len + 1`` tokens that begins at token ``id * seq_len`` has a *part*
in each stored block it touches (part 0 in the block it begins in, part ``p`` in the
``p``-th block after). A *job* is one block to read and the parts of planned samples
it fills. :func:`cut` makes the jobs for every part of a plan not yet given to a job,
ordered by first use; :class:`~stoker.loader.samples.SampleReader` runs them.
"""

from __future__ import annotations

import numpy as np


class Jobs:
    """Jobs cut from a plan: the parts ``(k, p)`` of job ``j`` (plan index, part) are
    ``[bounds[j], bounds[j + 1])``, and it reads ``block[j]``; ``order`` runs them by
    first use (``first``, the plan index of each job's first sample); ``keep``: the job
    keeps its block's record for the block's next job; ``next`` is the first (in
    ``order``) not started."""

    def __init__(
        self,
        k: np.ndarray,
        p: np.ndarray,
        bounds: np.ndarray,
        block: np.ndarray,
        order: np.ndarray,
        first: np.ndarray,
        keep: np.ndarray,
    ) -> None:
        self.k, self.p, self.bounds, self.block = k, p, bounds, block
        self.order, self.keep = order, keep
        self.due: list[int] = first[order].tolist()  # first uses (``first``) in running order
        self.next = 0

    def __len__(self) -> int:
        return len(self.block)

    @classmethod
    def empty(cls) -> Jobs:
        z = np.zeros(0, dtype=np.int64)
        return cls(z, z, np.zeros(1, dtype=np.int64), z, z, z, np.zeros(0, dtype=bool))


def cut(
    seq: np.ndarray, seq_len: int, block_tokens: int, given: np.ndarray, reach: int, gap: int
) -> Jobs:
    """The jobs that fill every part of the plan ``seq`` (sample ids) not yet given to a
    job (``given``: per sample, bit ``p`` set when part ``p`` was), in order of first use:
    per block, one job per ``reach`` samples from its first use, and one of its own for
    a sample that ends in the block more than ``gap`` samples before or after the
    block's other uses (it decodes only the block's head, instead of filling the
    block's samples early)."""
    L, bt = seq_len, block_tokens
    k = np.arange(len(seq), dtype=np.int64)
    first = seq * L // bt
    extra = (seq * L + L) // bt - first
    ks, bs, ps = [k], [first], [np.zeros(len(k), dtype=np.int64)]
    for p in range(1, int(extra.max()) + 1 if len(extra) else 1):
        sel = extra >= p
        ks.append(k[sel])
        bs.append(first[sel] + p)
        ps.append(np.full(int(sel.sum()), p, dtype=np.int64))
    K, B, P = np.concatenate(ks), np.concatenate(bs), np.concatenate(ps)
    open_ = ((given[K] >> P.astype(np.uint8)) & 1) == 0
    K, B, P = K[open_], B[open_], P[open_]
    if not len(K):
        return Jobs.empty()
    by = np.lexsort((K, B))
    K, B, P = K[by], B[by], P[by]
    # a run: a block's uses, a head part (of a sample begun in the block before) apart
    # from the others when more than ``gap`` lies between; cut in pieces of ``reach``
    # samples from the run's first use
    head = P >= 1
    apart = (K[1:] - K[:-1] > gap) & (head[1:] | head[:-1])
    run_start = np.concatenate([[True], (B[1:] != B[:-1]) | apart])
    run = np.maximum.accumulate(np.where(run_start, np.arange(len(K)), 0))
    piece = (K - K[run]) // reach
    start = run_start | np.concatenate([[True], piece[1:] != piece[:-1]])
    # a job that only fills heads (the parts of samples begun in the block before)
    # joins the job of the same block before it: a row taken early, no second read
    at = np.nonzero(start)[0]
    heads = np.minimum.reduceat(head, at).astype(bool)
    after = np.concatenate([[False], B[at[1:]] == B[at[1:] - 1]])
    near = np.concatenate([[False], K[at[1:]] - K[run[at[1:] - 1]] < 2 * reach])
    start[at[heads & after & near]] = False
    bounds = np.concatenate([np.nonzero(start)[0], [len(K)]])
    firsts, blocks = K[bounds[:-1]], B[bounds[:-1]]
    # a job whose block another job of this plan reads later keeps its record for it
    keep = np.concatenate([blocks[1:] == blocks[:-1], [False]])
    return Jobs(K, P, bounds, blocks, np.lexsort((blocks, firsts)), firsts, keep)
