"""The static position source: the same interface as the coordinator's leases, and the
static split's positions exactly."""

from __future__ import annotations

import inspect
from typing import Any

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as hs

from stoker import intervals
from stoker.coordinator.source import LeaseStream
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


class TableClient:
    """A coordinator client answered by a lease table in this process (no gRPC)."""

    def __init__(self, table: Any) -> None:
        self.table, self.now, self.first_step = table, 0.0, 0

    def _do(self, fn: Any, *args: Any) -> Any:
        from stoker.coordinator.client import LeaseRejected
        from stoker.coordinator.leases import LeaseError
        from stoker.coordinator.service import _CODES

        self.now += 0.01
        try:
            return fn(*args)
        except LeaseError as exc:
            raise LeaseRejected(_CODES[exc.code].name, str(exc)) from None

    def register(self, rank: int, worker: int, **_: Any) -> tuple[int, int]:
        return self._do(self.table.register, rank, worker, self.now), self.table.epoch

    def lease(self, consumer: int, epoch: int, held: list[int]) -> Any:
        from stoker._proto import coordinator_pb2 as pb
        from stoker.coordinator.leases import WAIT

        g = self._do(self.table.request, consumer, self.now, held)
        if g is None:
            return pb.LeaseReply(status=pb.LeaseReply.DONE)
        if g is WAIT:
            return pb.LeaseReply(status=pb.LeaseReply.WAIT)
        return pb.LeaseReply(
            status=pb.LeaseReply.GRANTED, lease=g.lease, start=g.start, end=g.end, horizon=g.horizon
        )

    def heartbeat(self, consumer: int, epoch: int, lease: int = 0, read: int = 0) -> Any:
        return self._do(self.table.heartbeat, consumer, self.now, lease, read if lease else -1)

    def confirm(self, consumer: int, lease: int, upto: int) -> bool:
        return self._do(self.table.confirm, consumer, lease, upto, self.now)


def test_a_lease_lost_in_a_coordinator_crash_is_dropped_and_its_positions_come_again() -> None:
    from stoker.coordinator.client import LeaseRejected
    from stoker.coordinator.leases import Config, LeaseTable

    table = LeaseTable(0, [(0, 40)], 1, Config(lease_size=8, min_readahead=8))
    client = TableClient(table)
    stream = LeaseStream(client, 0, 0, wait=0.0)  # type: ignore[arg-type]
    batches = stream.batches(4)
    confirmed: list[int] = []

    def confirm(positions: np.ndarray, segments: list[tuple[int, int, int]]) -> None:
        row = 0
        for lease, upto, rows in segments:
            try:
                client.confirm(stream.consumer, lease, upto)
                confirmed.extend(positions[row : row + rows].tolist())
            except LeaseRejected:  # its rows are dropped, not handed to training
                pass
            row += rows

    for _ in range(2):  # the first lease, read and confirmed
        confirm(*next(batches))
    journaled = len(client.table.events)
    crashed = next(batches)  # granted the second lease: answered, not yet journaled ...
    # ... when the coordinator is killed; it restarts from its journal
    client.table = LeaseTable.replay(client.table.events[:journaled], table.config)
    client.table.revive(client.now)
    confirm(*crashed)  # refused: the restarted coordinator never granted that lease
    for positions, segments in batches:  # the stream's heartbeat on it is refused too
        confirm(positions, segments)
    assert stream.dropped == 1  # the lost lease, dropped instead of failing the reader
    assert sorted(confirmed) == list(range(40))  # every position once, none lost


def test_the_confirm_window_shrinks_for_large_batches() -> None:
    from stoker.loader.dynamic import CONFIRM_BYTES, CONFIRM_WINDOW, confirm_window

    assert confirm_window(4, 150_000) == CONFIRM_WINDOW  # (8, 2049) batches: 64 of them
    big = 64 * 8193 * 9  # (64, 8193) tokens and masks: 4.7 MB a batch
    assert confirm_window(4, big) == CONFIRM_BYTES // big < CONFIRM_WINDOW
    assert confirm_window(4, 10 * CONFIRM_BYTES) == 4  # never none
    assert confirm_window(100, 150_000) == 100  # never below the loader's prefetch
