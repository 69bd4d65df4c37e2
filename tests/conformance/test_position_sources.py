"""The position-source seam (:class:`stoker.loader.sources.PositionSource`), one suite for
both sources: the static plan's :class:`StaticSource` and the coordinator's
:class:`LeaseStream`, the latter against a real coordinator (gRPC server on loopback,
in this process). Each subclass provides a ``source``: one consumer's source of epoch
0 of a one-rank job over ``N`` samples, and confirms each batch the way its rank's
main process would (the static plan has nothing to confirm).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar

import numpy as np
import pytest

from stoker import plan
from stoker.coordinator.client import CoordinatorClient
from stoker.coordinator.consumer import LeaseStream
from stoker.coordinator.leases import Config
from stoker.coordinator.service import Coordinator, Server
from stoker.loader import state as st
from stoker.loader.sources import PositionSource, Segments, StaticSource

N = 203  # positions of the epoch: not a multiple of SIZE, nor of LEASE
SIZE = 8
LEASE = 50  # positions per lease: batches straddle leases
LIMITS = (1, 5, 13, 1000)  # what upcoming() is asked for, in turn


class PositionSourceTests:
    """Behaviours of every :class:`PositionSource`; subclasses provide ``source``."""

    confirms: ClassVar[bool] = True  # batches come with segments to confirm

    def confirm(self, source: PositionSource, seq: int, segments: Segments) -> None:
        """Confirm the rank's ``seq``-th batch (what training is handed next)."""

    def one_pass(
        self, source: PositionSource, size: int = SIZE
    ) -> Iterator[tuple[np.ndarray, Segments]]:
        """The source's batches, each confirmed before the next is asked for."""
        for seq, (positions, segments) in enumerate(source.batches(size)):
            self.confirm(source, seq, segments)
            yield positions, segments

    # -- the tests -------------------------------------------------------------------
    def test_it_is_a_position_source_of_epoch_0(self, source: PositionSource) -> None:
        assert isinstance(source, PositionSource)
        assert source.epoch == 0
        assert source.first_step == 0
        assert source.reregistered == 0
        assert isinstance(source.consumer, int)

    def test_one_pass_yields_every_position_of_the_epoch_exactly_once(
        self, source: PositionSource
    ) -> None:
        got = np.concatenate([p for p, _ in self.one_pass(source)])
        assert len(got) == N
        np.testing.assert_array_equal(np.sort(got), np.arange(N))
        assert list(source.batches(SIZE)) == []  # the pass is over: nothing more
        assert source.reregistered == 0

    def test_batches_are_full_but_the_last(self, source: PositionSource) -> None:
        sizes = [len(p) for p, _ in self.one_pass(source)]
        assert sizes[:-1] == [SIZE] * (len(sizes) - 1)
        assert 1 <= sizes[-1] <= SIZE
        assert sum(sizes) == N

    def test_positions_are_int64_arrays_and_segments_cover_the_batch(
        self, source: PositionSource
    ) -> None:
        for positions, segments in self.one_pass(source):
            assert isinstance(positions, np.ndarray) and positions.ndim == 1
            assert positions.dtype == np.int64
            if self.confirms:
                assert segments and all(rows >= 1 for _, _, rows in segments)
                assert sum(rows for _, _, rows in segments) == len(positions)
            else:
                assert segments == []

    def test_upcoming_is_what_the_next_batches_start_with(self, source: PositionSource) -> None:
        announced: list[tuple[int, np.ndarray]] = []  # (batches before, upcoming)
        batches: list[np.ndarray] = []
        for i, (positions, _) in enumerate(self.one_pass(source)):
            batches.append(positions)
            limit = LIMITS[i % len(LIMITS)]
            ahead = source.upcoming(limit)
            assert isinstance(ahead, np.ndarray) and ahead.dtype == np.int64
            assert len(ahead) <= limit
            announced.append((i + 1, ahead))
        assert any(len(a) for _, a in announced)  # it did announce something
        for before, ahead in announced:
            following = np.concatenate([np.zeros(0, np.int64), *batches[before:]])
            np.testing.assert_array_equal(
                ahead, following[: len(ahead)], err_msg=f"upcoming after batch {before}"
            )
        assert len(source.upcoming(10)) == 0  # past the last batch: nothing of this epoch


class TestStaticSource(PositionSourceTests):
    confirms = False

    @pytest.fixture
    def source(self) -> PositionSource:
        progress = st.Progress(0, plan.first_epoch_set(0, N, 1, False), world=1, chunk=SIZE)
        return StaticSource(progress, rank=0, worker=0, num_workers=1, interleave=SIZE)

    def test_upcoming_before_the_first_batch_is_the_first_batch(
        self, source: PositionSource
    ) -> None:
        ahead = source.upcoming(SIZE)
        first, _ = next(iter(source.batches(SIZE)))
        np.testing.assert_array_equal(ahead, first)


class TestLeaseStream(PositionSourceTests):
    @pytest.fixture
    def client(self, tmp_path: Path) -> Iterator[CoordinatorClient]:
        coordinator = Coordinator(
            N, 1, str(tmp_path / "state"), config=Config(lease_size=LEASE, min_readahead=16)
        )
        server = Server(coordinator, "127.0.0.1:0").start()
        client = CoordinatorClient(server.address, token=server.token, retry_for=10.0)
        yield client
        client.close()
        server.stop(0)

    @pytest.fixture
    def source(self, client: CoordinatorClient) -> PositionSource:
        return LeaseStream(client, rank=0, worker=0)

    def confirm(self, source: PositionSource, seq: int, segments: Segments) -> None:
        assert isinstance(source, LeaseStream)
        answers = source.client.confirm_batch(source.consumer, source.epoch, seq, segments, SIZE)
        assert len(answers) == len(segments) and None not in answers  # nothing refused

    def test_segments_name_the_rows_of_their_lease(self, source: PositionSource) -> None:
        leases: dict[int, list[int]] = {}
        for positions, segments in self.one_pass(source):
            row = 0
            for lease, upto, rows in segments:
                np.testing.assert_array_equal(
                    positions[row : row + rows], np.arange(upto - rows, upto)
                )
                leases.setdefault(lease, []).extend(range(upto - rows, upto))
                row += rows
        assert len(leases) == -(-N // LEASE)  # one lease after another, none stolen
        assert source.consumer != 0

    def test_the_coordinator_counts_what_was_confirmed_and_ends_the_epoch(
        self, source: PositionSource, client: CoordinatorClient
    ) -> None:
        done = last = 0
        for positions, _ in self.one_pass(source):
            last = len(positions)
            status = client.status()
            if status.epoch == 0:  # the last confirm ends the epoch: the next one begins
                done += len(positions)
                assert (status.quota, status.consumed) == (N, done)
        assert done == N - last  # every batch but the last was counted in epoch 0
        assert client.status().epoch == 1


class TestLeaseStreamAskingAhead(TestLeaseStream):
    """A consumer that asks for its next lease half way through the one it reads (what
    the loader's consumers do): the same behaviours, and it knows what follows."""

    @pytest.fixture
    def source(self, client: CoordinatorClient) -> PositionSource:
        return LeaseStream(client, rank=0, worker=0, ahead=True)

    def test_it_holds_two_leases_at_most_and_asks_ahead_once_per_lease(
        self, source: PositionSource, client: CoordinatorClient
    ) -> None:
        assert isinstance(source, LeaseStream)
        most = 0
        across = 0  # batches after which upcoming() reached into the next lease
        for _, segments in self.one_pass(source):
            held = [k for k, h in source._held.items() if h.read < h.end]
            most = max(most, len(held))
            ahead = source.upcoming(2 * LEASE)
            last = source._held.get(segments[-1][0])
            if last is not None and len(ahead) and ahead[-1] >= last.end:
                across += 1
        assert most <= 2
        assert across > 0


@pytest.mark.parametrize("pause_after", range(1, 15))
def test_a_consumer_asking_ahead_that_expired_registers_again_and_the_epoch_comes_once(
    tmp_path: Path, pause_after: int
) -> None:
    """Paused past the timeout (a worker blocked on a full queue): its leases went back to
    the queue; asking ahead finds it expired, it registers again and reads on, and the
    rows the rank confirms are every position once."""
    now = [0.0]  # the coordinator's clock: 0.1 s a batch, a slow consumer (short horizons)
    config = Config(lease_size=LEASE, min_readahead=16, timeout=10.0)
    coordinator = Coordinator(N, 1, str(tmp_path / "state"), config=config, clock=lambda: now[0])
    server = Server(coordinator, "127.0.0.1:0").start()
    client = CoordinatorClient(server.address, token=server.token, retry_for=10.0)
    try:
        source = LeaseStream(client, rank=0, worker=0, ahead=True)
        accepted: list[int] = []
        for seq, (positions, segments) in enumerate(source.batches(SIZE)):
            answers = client.confirm_batch(source.consumer, source.epoch, seq, segments, SIZE)
            row = 0
            for (_, _, rows), answer in zip(segments, answers, strict=True):
                if answer is not None:
                    accepted.extend(positions[row : row + rows].tolist())
                row += rows
            now[0] += 0.1
            if seq + 1 == pause_after:
                now[0] += config.timeout + 1  # silent past the timeout
                assert coordinator.expire() == [source.consumer]
        assert source.reregistered == 1
        assert sorted(accepted) == list(range(N))
    finally:
        client.close()
        server.stop(0)
