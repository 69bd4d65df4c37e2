"""Cutting a plan into decode jobs (stoker.loader.jobs), exhaustively on small plans."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from stoker.loader.jobs import Jobs, cut


def parts_of(seq: np.ndarray, L: int, bt: int) -> set[tuple[int, int]]:
    """Every (plan index, part) of the plan: one part per block a sample's tokens touch."""
    out = set()
    for k, s in enumerate(seq.tolist()):
        first, last = s * L // bt, (s * L + L) // bt
        out |= {(k, p) for p in range(last - first + 1)}
    return out


def job_parts(jobs: Jobs, j: int) -> list[tuple[int, int]]:
    lo, hi = int(jobs.bounds[j]), int(jobs.bounds[j + 1])
    return list(zip(jobs.k[lo:hi].tolist(), jobs.p[lo:hi].tolist(), strict=True))


@settings(max_examples=300, deadline=None)
@given(
    L=st.integers(1, 40),
    extra=st.integers(0, 40),  # a block holds a sample at least (as the reader requires)
    n=st.integers(0, 60),
    reach=st.integers(1, 20),
    gap=st.integers(1, 20),
    seed=st.integers(0, 2**32 - 1),
    given_share=st.floats(0.0, 1.0),
)
def test_every_open_part_is_in_exactly_one_job_of_its_block(
    L: int, extra: int, n: int, reach: int, gap: int, seed: int, given_share: float
) -> None:
    bt = L + 1 + extra
    rng = np.random.default_rng(seed)
    num_samples = max(1, 200 // L)
    seq = rng.integers(0, num_samples, n).astype(np.int64)
    given = np.zeros(n, dtype=np.uint8)
    done = set()
    for k, p in parts_of(seq, L, bt):
        if rng.random() < given_share:
            given[k] |= 1 << p
            done.add((k, p))
    jobs = cut(seq, L, bt, given, reach, gap)
    seen: list[tuple[int, int]] = []
    for j in range(len(jobs)):
        parts = job_parts(jobs, j)
        assert parts  # no empty job
        for k, p in parts:  # each part lies in the job's block
            assert int(seq[k]) * L // bt + p == int(jobs.block[j])
        seen += parts
    assert len(seen) == len(set(seen))  # no part twice
    assert set(seen) == parts_of(seq, L, bt) - done  # every open part, no given one
    # run by first use; a job's first use is its smallest plan index
    firsts = [min(k for k, _ in job_parts(jobs, j)) for j in range(len(jobs))]
    assert jobs.due == sorted(jobs.due) == [firsts[j] for j in jobs.order.tolist()]
    # a job keeps its record exactly when the block's next job (by first use) follows
    by_block: dict[int, list[int]] = {}
    for j in sorted(range(len(jobs)), key=lambda j: (int(jobs.block[j]), firsts[j])):
        by_block.setdefault(int(jobs.block[j]), []).append(j)
    for js in by_block.values():
        assert [bool(jobs.keep[j]) for j in js] == [True] * (len(js) - 1) + [False]


def test_a_blocks_uses_are_cut_in_pieces_of_reach_samples() -> None:
    """One block (samples of 4 tokens in a block of 64: 16 begin in block 0), planned in
    order: pieces of ``reach`` samples from the first use."""
    seq = np.arange(15, dtype=np.int64)  # sample 15 ends in block 1
    jobs = cut(seq, 4, 64, np.zeros(15, dtype=np.uint8), reach=6, gap=100)
    assert jobs.block.tolist() == [0, 0, 0]
    assert [len(job_parts(jobs, j)) for j in range(3)] == [6, 6, 3]
    assert jobs.keep.tolist() == [True, True, False]


def test_a_head_far_from_its_blocks_other_uses_is_a_job_of_its_own() -> None:
    """Sample 15 (tokens 60..64) ends one token into block 1; block 1's own samples come
    much later in the plan: the head is its own job, read then (not those samples early)."""
    seq = np.array([15, *range(40, 60), *range(16, 20)], dtype=np.int64)
    jobs = cut(seq, 4, 64, np.zeros(len(seq), dtype=np.uint8), reach=100, gap=5)
    block1 = [job_parts(jobs, j) for j in jobs.order.tolist() if int(jobs.block[j]) == 1]
    assert block1 == [[(0, 1)], [(21, 0), (22, 0), (23, 0), (24, 0)]]
    # run at first use: block 0's job and the head (plan index 0), then blocks 2 and 3
    assert [int(jobs.block[j]) for j in jobs.order.tolist()][:2] == [0, 1]
