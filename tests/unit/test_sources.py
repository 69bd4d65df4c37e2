"""The static position source: the same interface as the coordinator's leases, and the
static split's positions exactly."""

from __future__ import annotations

import inspect

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as hs

from stoker import intervals
from stoker.coordinator.consumer import LeaseStream
from stoker.loader import state as st
from stoker.loader.sources import PositionSource, StaticSource


@settings(max_examples=150, deadline=None)
@given(
    n=hs.integers(0, 200),
    world=hs.integers(1, 4),
    nw=hs.integers(1, 3),
    interleave=hs.integers(1, 6),
    size=hs.integers(1, 9),
    consumed=hs.integers(0, 40),
    skip=hs.integers(0, 10),
)
def test_workers_of_all_ranks_cover_the_unconsumed_split_once(
    n, world, nw, interleave, size, consumed, skip
) -> None:
    epoch_set = intervals.make([(7, 7 + n)])
    per_rank = n // world
    consumed = min(consumed, per_rank)
    progress = st.Progress(2, epoch_set, world, 1, consumed)
    split = progress.split
    for rank in range(world):
        got = []
        for w in range(nw):
            src = StaticSource(progress, rank, w, nw, interleave)
            assert isinstance(src, PositionSource) and src.epoch == 2
            batches = list(src.batches(size))
            assert all(seg == [] for _, seg in batches)  # nothing to confirm
            assert all(len(p) <= size for p, _ in batches)
            got += [int(x) for p, _ in batches for x in p]
            # a source that skips its first samples hands out the rest, and upcoming()
            # always previews what the next batch holds
            later = StaticSource(progress, rank, w, nw, interleave, skip)
            mine = [int(x) for p, _ in StaticSource(progress, rank, w, nw, interleave).batches(1)
                    for x in p]  # fmt: skip
            rest = []
            for p, _ in later.batches(size):
                rest += p.tolist()
                assert later.upcoming(size).tolist() == mine[len(rest) + skip :][:size]
            assert rest == mine[skip:]
        expect = split.rank_positions(rank, np.arange(consumed, per_rank)).tolist()
        assert sorted(got) == sorted(expect)


def test_the_lease_stream_offers_the_same_interface() -> None:
    for name in ("batches", "upcoming"):
        mine = inspect.signature(getattr(StaticSource, name))
        theirs = inspect.signature(getattr(LeaseStream, name))
        assert list(mine.parameters) == list(theirs.parameters), name


def test_the_confirm_window_shrinks_for_large_batches() -> None:
    from stoker.coordinator.consumer import CONFIRM_BYTES, CONFIRM_WINDOW, confirm_window

    assert confirm_window(4, 150_000) == CONFIRM_WINDOW  # (8, 2049) batches: all of them
    big = 64 * 8193 * 9  # (64, 8193) tokens and masks: 4.7 MB a batch
    assert confirm_window(4, big) == CONFIRM_BYTES // big < CONFIRM_WINDOW
    assert confirm_window(4, 10 * CONFIRM_BYTES) == 4  # never none
    assert confirm_window(2 * CONFIRM_WINDOW, 150_000) == 2 * CONFIRM_WINDOW  # never below prefetch


def test_a_run_of_full_batches_goes_as_one_call_and_its_answers_come_back_per_batch() -> None:
    from stoker.coordinator.client import ConfirmCall
    from stoker.coordinator.consumer import merge_runs, split_answers
    from stoker.errors import CoordinatorRefused

    calls = [
        ConfirmCall(7, 0, 0, [(1, 4, 4)], 4),
        ConfirmCall(7, 0, 1, [(1, 6, 2), (2, 12, 2)], 4),  # lease 1 ends, lease 2 begins
        ConfirmCall(7, 0, 2, [(2, 16, 4)], 4),
        ConfirmCall(7, 0, 3, [(2, 17, 1)], 4),  # short: a call of its own
        ConfirmCall(8, 0, 4, [(3, 4, 4)], 4),  # another consumer
    ]
    merged, parts = merge_runs(calls)
    assert [(m.consumer, m.seq, m.count, m.segments) for m in merged] == [
        (7, 0, 3, [(1, 6, 6), (2, 16, 6)]),
        (7, 3, 1, [(2, 17, 1)]),
        (8, 4, 1, [(3, 4, 4)]),
    ]
    refused = CoordinatorRefused("FAILED_PRECONDITION", "wrong epoch", "wrong_epoch")
    # lease 1 complete (True), lease 2 refused (None); the last call refused whole
    got = split_answers([[True, None], [True], refused], parts)
    assert got[:4] == [[False], [True, None], [None], [True]]
    assert got[4] is refused


def test_closing_a_confirmer_gives_up_a_message_the_gone_coordinator_never_answers() -> None:
    """A broken-off epoch whose coordinator went away: close() stops the retries instead
    of waiting out the client's retry_for (60 s here; it returns in a fraction of it)."""
    import socket
    import time

    from stoker.coordinator.client import CoordinatorClient
    from stoker.coordinator.consumer import Confirmer

    with socket.socket() as s:  # a loopback port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    client = CoordinatorClient(f"127.0.0.1:{port}", token="t", retry_for=60.0, timeout=1.0)
    confirmer = Confirmer(client, 4)
    confirmer.submit(0, 1, [(1, 4, 4)])
    deadline = time.monotonic() + 30
    while client.retries == 0 and time.monotonic() < deadline:  # it is retrying now
        time.sleep(0.01)
    assert client.retries > 0
    t = time.monotonic()
    confirmer.close()
    assert time.monotonic() - t < 6.0  # a tenth of retry_for
    with pytest.raises(Exception, match="given up"):
        confirmer.take()
    client.close()
