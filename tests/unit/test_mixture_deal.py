"""Sharing a mixture's steps among ranks (stoker.mixture.deal), each step's samples
per source from the quota method (stoker.mixture.apportion), over random worlds, batches, weights and
epoch sizes: every rank gets exactly its batch, every sample of a source's epoch is
read exactly once, each rank has taken a prefix of its own share that follows from
the source's count alone, and few samples are read from another rank's share."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stoker.mixture.apportion import quota
from stoker.mixture.deal import balance, deal, rank_batch, rank_counts, segments


@given(st.integers(0, 200), st.integers(0, 50), st.integers(1, 9))
def test_deal_gives_each_rank_a_prefix_of_its_share(done: int, taken: int, world: int) -> None:
    start, stop = deal(done, taken, world)
    assert int((stop - start).sum()) == taken
    assert np.array_equal(start, rank_counts(done, world))
    # the prefixes differ by at most one between ranks, the lower ranks ahead
    assert np.all(np.diff(stop) <= 0) and int(stop[0] - stop[-1]) <= 1
    # sample k of the epoch is rank k % world's local sample k // world
    got = sorted(r + world * j for r in range(world) for j in range(int(start[r]), int(stop[r])))
    assert got == list(range(done, done + taken))


@st.composite
def runs(draw: st.DrawFn) -> tuple[int, int, list[list[int]], list[list[int]]]:
    world = draw(st.integers(1, 6))
    batch = draw(st.integers(1, 6))
    k = draw(st.integers(1, 4))
    sizes = draw(
        st.lists(st.lists(st.integers(1, 40), min_size=8, max_size=8), min_size=k, max_size=k)
    )
    steps = draw(
        st.lists(
            st.lists(st.integers(0, 9), min_size=k, max_size=k).filter(lambda w: sum(w) > 0),
            min_size=1,
            max_size=30,
        )
    )
    return world, batch, sizes, steps


@settings(max_examples=200, deadline=None)
@given(runs())
def test_a_run_of_steps_reads_every_sample_once_in_exact_batches(
    run: tuple[int, int, list[list[int]], list[list[int]]],
) -> None:
    world, batch, sizes, steps = run
    k = len(sizes)

    def epoch_samples(source: int, epoch: int) -> int:
        return sizes[source][epoch % len(sizes[source])]

    state = [(0, 0)] * k
    seen: Counter[tuple[int, int, int, int]] = Counter()
    for ws in steps:
        taken = quota([0] * k, ws, batch * world)  # new weights each step
        segs, state = segments(state, taken, epoch_samples)
        dealt = [deal(done, n, world) for _, _, done, n in segs]
        every = balance(dealt, batch)
        for rank in range(world):
            items = rank_batch(dealt, batch, rank)
            assert items == every[rank] and len(items) == batch
            # at most one sample per segment but one comes from another rank's share
            assert sum(owner != rank for _, owner, _ in items) <= max(len(segs) - 1, 0)
            for seg, owner, j in items:
                source, epoch, _, _ = segs[seg]
                seen[(source, epoch, owner, j)] += 1
        # what each source's epochs have given: every rank a prefix of its share
        for source, (epoch, done) in enumerate(state):
            for e in range(epoch + 1):
                taken_of_e = done if e == epoch else epoch_samples(source, e)
                want = {
                    (r, j)
                    for r, n in enumerate(rank_counts(taken_of_e, world))
                    for j in range(int(n))
                }
                got = {(r, j) for (s, ee, r, j) in seen if s == source and ee == e}
                assert got == want
    assert max(seen.values(), default=1) == 1  # no sample twice


def test_balance_refuses_a_step_that_does_not_fill_the_batches() -> None:
    with pytest.raises(ValueError, match="expected"):
        balance([deal(0, 5, 2)], 3)
    with pytest.raises(ValueError, match="expected"):
        rank_batch([deal(0, 5, 2)], 3, 0)


def test_segments_run_into_the_next_epoch() -> None:
    segs, after = segments([(0, 8), (2, 0)], [5, 0], lambda s, e: 10)
    assert segs == [(0, 0, 8, 2), (0, 1, 0, 3)] and after == [(1, 3), (2, 0)]
