"""stoker.DevicePrefetcher on a CPU machine: order, exact resume with batches in flight,
shutdown, and the pinned pool's bookkeeping (a Hypothesis state machine).

``stage=True`` runs the staging path of a GPU (pool, narrow transfer, widening)
with host copies standing in for the transfers; without it batches pass through.
"""

from __future__ import annotations

import multiprocessing as mp
import threading
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

import stoker
from stoker.device import PinnedPool, narrow_dtype
from stoker.errors import StokerError

from ._datasets import SmallDataset

SEQ = 16
B = 4
CONFIG: dict[str, Any] = {"seed": 3, "shard_size": 5, "window_shards": 3}
READY_TIMEOUT = 60.0


@pytest.fixture(scope="module")
def data(write_small_module: Callable[..., SmallDataset]) -> SmallDataset:
    # ~15k tokens: about 950 samples, 238 batches of 4 per epoch
    return write_small_module("device", num_docs=100, max_len=300, vocab_size=1000)


def loader(data: SmallDataset, num_workers: int = 0, **kw: Any) -> stoker.TokenLoader:
    ds = stoker.TokenDataset(data.url, SEQ, batch_size=B, **CONFIG)
    return stoker.TokenLoader(ds, num_workers, **kw)


def ids(batches: list[dict[str, Any]]) -> list[list[int]]:
    return [b["sample_id"].tolist() for b in batches]


def passes(it: Any, total: int, max_passes: int = 5) -> list[dict[str, Any]]:
    """Batches of whole passes (a training loop's epochs) until ``total`` came."""
    out: list[dict[str, Any]] = []
    for _ in range(max_passes):
        if len(out) >= total:
            break
        out.extend(it)
    return out[:total]


def prefetch_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "stoker-prefetch"]


def assert_nothing_left(p: stoker.DevicePrefetcher) -> None:
    """No prefetch thread, no loader worker process, no staging buffer."""
    assert prefetch_threads() == []
    assert mp.active_children() == []
    for m in p._movers:
        assert m.pool is None or len(m.pool) == 0


@pytest.fixture(scope="module")
def reference(data: SmallDataset) -> list[dict[str, Any]]:
    """Two epochs through the bare loader."""
    ld = loader(data)
    return list(ld) + list(ld)


# -- order and content ---------------------------------------------------------------


@pytest.mark.parametrize("stage", [False, True])
@pytest.mark.parametrize(("num_workers", "depth"), [(0, 1), (0, 3), (2, 2)])
def test_batches_come_out_in_order_with_the_same_content(
    data: SmallDataset,
    reference: list[dict[str, Any]],
    num_workers: int,
    depth: int,
    stage: bool,
) -> None:
    p = stoker.DevicePrefetcher(loader(data, num_workers), depth=depth, stage=stage)
    got = list(p) + list(p)  # iterating again runs the next epoch, as the loader does
    assert len(got) == len(reference)
    for a, b in zip(got, reference):
        assert a.keys() == b.keys()
        for k in b:
            assert a[k].dtype == b[k].dtype, k
            assert torch.equal(a[k], b[k]), k
    assert p.stats()["batches"] == len(reference)
    assert_nothing_left(p)


def test_tokens_cross_narrow_and_arrive_widened(data: SmallDataset) -> None:
    p = stoker.DevicePrefetcher(loader(data), depth=2, stage=True)
    assert p.transfer == {"tokens": torch.uint16}  # vocab 1000 fits uint16
    batches = list(p)
    toks = sum(b["tokens"].numel() for b in batches)
    rows = sum(len(b["sample_id"]) for b in batches)
    assert all(b["tokens"].dtype == torch.int64 for b in batches)
    # tokens as uint16 (2 bytes), masks as bool (1), sample ids as int64 (8)
    assert p.stats()["bytes_transferred"] == 2 * toks + 1 * toks + 8 * rows


def test_narrow_payloads_are_widened_as_asked() -> None:
    images = [torch.randint(0, 256, (2, 3, 4, 4), dtype=torch.uint8) for _ in range(5)]
    source = [{"image": im, "label": torch.tensor([i, i])} for i, im in enumerate(images)]
    for stage in (False, True):
        p = stoker.DevicePrefetcher(source, depth=2, widen={"image": torch.float32}, stage=stage)
        got = list(p)
        assert [g["image"].dtype for g in got] == [torch.float32] * 5
        assert all(torch.equal(g["image"], im.float()) for g, im in zip(got, images))
        assert [g["label"].tolist() for g in got] == [[i, i] for i in range(5)]
        if stage:
            assert p.stats()["bytes_transferred"] == 5 * (images[0].numel() + 2 * 8)


def test_zero_copy_views_are_copied_before_the_loader_reuses_them(
    data: SmallDataset, reference: list[dict[str, Any]]
) -> None:
    # one slot per worker: the slot of batch k is refilled as soon as batch k + 2 is asked for
    p = stoker.DevicePrefetcher(loader(data, 2, zero_copy=True, prefetch=1), depth=4)
    got = list(p)
    first = reference[: len(got)]
    assert all(torch.equal(a["tokens"], b["tokens"]) for a, b in zip(got, first))
    assert ids(got) == ids(first)


@pytest.mark.parametrize(
    ("vocab", "dtype"),
    [
        (1, torch.uint8),
        (256, torch.uint8),
        (257, torch.uint16),
        (65536, torch.uint16),
        (65537, torch.int32),
        (1 << 31, torch.int32),
        ((1 << 31) + 1, None),
    ],
)
def test_narrowest_dtype_holds_the_vocabulary(vocab: int, dtype: torch.dtype | None) -> None:
    assert narrow_dtype(vocab) == dtype


# -- exact resume ----------------------------------------------------------------------


def take_in_flight(p: stoker.DevicePrefetcher, k: int) -> tuple[list[dict[str, Any]], Any]:
    """Take ``k`` batches (whole passes, then part of one), wait until ``depth`` more are
    read ahead, and return them with the state saved right then (the pass left open)."""
    got: list[dict[str, Any]] = []
    for _ in range(5):
        it = iter(p)
        for b in it:
            got.append(b)
            if len(got) == k:
                break
        if len(got) == k:
            break
    else:
        raise AssertionError("not enough batches")
    assert p._run is not None
    assert p._run.wait_ready(p.depth, READY_TIMEOUT)
    return got, it


@pytest.mark.parametrize(("before", "after"), [(0, 0), (0, 2), (2, 0), (2, 2)])
@pytest.mark.parametrize("where", ["start", "mid", "epoch_end", "second_epoch"])
def test_state_with_batches_in_flight_restores_exactly(
    data: SmallDataset,
    reference: list[dict[str, Any]],
    before: int,
    after: int,
    where: str,
) -> None:
    per_epoch = len(reference) // 2
    k = {"start": 1, "mid": 37, "epoch_end": per_epoch, "second_epoch": per_epoch + 5}[where]
    depth = 3
    p = stoker.DevicePrefetcher(loader(data, before), depth=depth)
    taken, it = take_in_flight(p, k)
    state = p.state_dict()
    if where != "epoch_end":  # at the epoch end only the end of the pass is in flight
        # the loader itself counted the batches read ahead: they are in flight
        assert p.loader.state_dict()["consumed"] == state["consumed"] + depth * B
    this_epoch = taken[per_epoch:] if k > per_epoch else taken
    assert state["consumed"] == sum(len(b["sample_id"]) for b in this_epoch)
    it.close()
    assert_nothing_left(p)
    assert p.state_dict() == state  # still what training consumed, after the pass closed

    q = stoker.DevicePrefetcher(loader(data, after), depth=depth)
    q.load_state_dict(state)
    rest = passes(q, len(reference) - k)
    assert ids(taken + rest) == ids(reference)
    assert all(torch.equal(a["tokens"], b["tokens"]) for a, b in zip(rest, reference[k:]))


def test_state_before_any_batch_is_the_loaders(data: SmallDataset) -> None:
    ld = loader(data)
    p = stoker.DevicePrefetcher(ld, depth=3)
    it = iter(p)
    first = next(it)
    assert p.state_dict()["consumed"] == B
    it.close()
    fresh = stoker.DevicePrefetcher(loader(data), depth=3)
    assert fresh.state_dict() == loader(data).state_dict()
    assert first["sample_id"].tolist() == next(iter(loader(data)))["sample_id"].tolist()


def test_resume_after_resume(data: SmallDataset, reference: list[dict[str, Any]]) -> None:
    p = stoker.DevicePrefetcher(loader(data), depth=3)
    first, it = take_in_flight(p, 20)
    state = p.state_dict()
    it.close()
    q = stoker.DevicePrefetcher(loader(data, 2), depth=2)
    q.load_state_dict(state)
    second, it = take_in_flight(q, 30)
    state = q.state_dict()
    it.close()
    r = stoker.DevicePrefetcher(loader(data), depth=3)
    r.load_state_dict(state)
    rest = passes(r, len(reference) - 50)
    assert ids(first + second + rest) == ids(reference)


def test_after_a_whole_pass_the_state_is_the_loaders(data: SmallDataset) -> None:
    ld = loader(data)
    p = stoker.DevicePrefetcher(ld, depth=3)
    n = len(list(p))
    assert p.state_dict() == ld.state_dict()
    assert p.state_dict()["epoch"] == 1 and p.state_dict()["consumed"] == 0
    assert p.stats()["batches"] == n


class CoordinatorLike:
    """A loader whose state is an expensive call at its batch count, like a
    coordinator-fed TokenLoader (``coordinator``, ``last_epoch``, Checkpoint)."""

    coordinator = "fake"

    def __init__(self, n: int) -> None:
        self.n = n
        self.last_epoch: Any = None
        self.calls: list[tuple[int, int]] = []

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        self.last_epoch = type("Epoch", (), {"epoch": 4, "batches": 0})()
        for i in range(self.n):
            self.last_epoch.batches += 1
            yield {"sample_id": torch.tensor([i])}

    def _coordinator(self) -> CoordinatorLike:
        return self

    def checkpoint(self, epoch: int, batches: int) -> tuple[str, dict[str, Any]]:
        self.calls.append((epoch, batches))
        return f"ckpt-{batches}", {"batches": batches}

    def state_dict(self) -> dict[str, Any]:
        ep = self.last_epoch
        if ep is None:
            return {"epoch": None}
        name, snap = self.checkpoint(ep.epoch, ep.batches)
        return {"epoch": ep.epoch, "batches": ep.batches, "checkpoint": name, "snapshot": snap}


def test_coordinator_state_is_asked_for_only_when_saved() -> None:
    ld = CoordinatorLike(50)
    p = stoker.DevicePrefetcher(ld, depth=3)
    it = iter(p)
    got = [next(it) for _ in range(10)]
    assert p._run is not None and p._run.wait_ready(3, READY_TIMEOUT)
    assert ld.calls == []  # no Checkpoint call per batch
    state = p.state_dict()
    assert ld.calls == [(4, 10)]
    assert state["batches"] == 10 and state["checkpoint"] == "ckpt-10"
    assert ld.last_epoch.batches == 13  # three batches in flight
    assert [int(b["sample_id"]) for b in got] == list(range(10))
    it.close()


# -- shutdown --------------------------------------------------------------------------


@pytest.mark.parametrize("stage", [False, True])
@pytest.mark.parametrize("num_workers", [0, 2])
def test_breaking_out_leaves_nothing_behind(
    data: SmallDataset, num_workers: int, stage: bool
) -> None:
    p = stoker.DevicePrefetcher(loader(data, num_workers), depth=3, stage=stage)
    for i, _ in enumerate(p):
        if i == 0:
            assert p._run is not None and p._run.wait_ready(3, READY_TIMEOUT)
            assert len(prefetch_threads()) == 1
        if i == 5:
            break
    assert_nothing_left(p)
    assert p._run is None


@pytest.mark.parametrize("num_workers", [0, 2])
def test_an_exception_in_the_step_leaves_nothing_behind(
    data: SmallDataset, num_workers: int
) -> None:
    p = stoker.DevicePrefetcher(loader(data, num_workers), depth=3, stage=True)

    def train() -> None:
        for i, _ in enumerate(p):
            if i == 3:
                raise KeyError("step failed")

    with pytest.raises(KeyError, match="step failed"):
        train()
    assert_nothing_left(p)
    assert p.state_dict()["consumed"] == 4 * B


def test_close_and_with_block_stop_the_thread(data: SmallDataset) -> None:
    with stoker.DevicePrefetcher(loader(data, 2), depth=2, stage=True) as p:
        it = iter(p)
        next(it)
        assert len(prefetch_threads()) == 1
    assert_nothing_left(p)
    assert next(it, "done") == "done"  # a closed pass ends


def test_a_loader_error_reaches_the_step_after_the_good_batches() -> None:
    def failing() -> Iterator[dict[str, torch.Tensor]]:
        for i in range(3):
            yield {"x": torch.tensor([i])}
        raise stoker.ChecksumError("block 7 is corrupt")

    p = stoker.DevicePrefetcher(failing(), depth=2, stage=True)
    got = []
    with pytest.raises(stoker.ChecksumError, match="block 7"):
        for b in p:
            got.append(int(b["x"]))
    assert got == [0, 1, 2]
    assert_nothing_left(p)


def test_depth_must_be_positive(data: SmallDataset) -> None:
    with pytest.raises(stoker.ConfigError, match="depth"):
        stoker.DevicePrefetcher(loader(data), depth=0)


# -- the pinned pool ---------------------------------------------------------------------


class FakeEvent:
    """A copy in flight: complete when the test says, or when waited for."""

    def __init__(self) -> None:
        self.done = False

    def query(self) -> bool:
        return self.done

    def synchronize(self) -> None:
        self.done = True


SHAPES = [((2, 3), torch.uint16), ((2, 3), torch.int64), ((4,), torch.bool)]


class PoolMachine(RuleBasedStateMachine):
    """Acquire, release (now or with an event), complete events, wait, in any order."""

    def __init__(self) -> None:
        super().__init__()
        self.capacity = 4
        self.pool = PinnedPool(self.capacity, pin=False)
        self.held: list[torch.Tensor] = []  # handed out, not released
        self.busy: list[tuple[torch.Tensor, FakeEvent]] = []  # released with an event
        self.events: list[FakeEvent] = []

    def in_use(self) -> list[torch.Tensor]:
        return self.held + [b for b, e in self.busy if not e.done]

    @rule(which=st.integers(0, len(SHAPES) - 1))
    def acquire(self, which: int) -> None:
        shape, dtype = SHAPES[which]
        can = len(self.in_use()) < self.capacity  # room, a free buffer, or a finished copy
        buf = self.pool.acquire(shape, dtype)
        if buf is None:
            assert not can, "refused although a buffer was free or there was room"
            return
        assert all(buf is not b for b in self.in_use()), "handed out a buffer still in use"
        assert tuple(buf.shape) == shape and buf.dtype == dtype
        self.busy = [(b, e) for b, e in self.busy if b is not buf]
        self.held.append(buf)

    @precondition(lambda self: self.held)
    @rule(i=st.integers(0, 100), with_event=st.booleans())
    def release(self, i: int, with_event: bool) -> None:
        buf = self.held.pop(i % len(self.held))
        if with_event:
            ev = FakeEvent()
            self.events.append(ev)
            self.busy.append((buf, ev))
            self.pool.release(buf, ev)
        else:
            self.pool.release(buf)

    @precondition(lambda self: any(not e.done for e in self.events))
    @rule(i=st.integers(0, 100))
    def complete(self, i: int) -> None:
        pending = [e for e in self.events if not e.done]
        pending[i % len(pending)].done = True

    @rule()
    def wait(self) -> None:
        had = bool(self.pool.busy)
        assert self.pool.wait() == had

    @precondition(lambda self: self.held)
    @rule()
    def release_twice_is_refused(self) -> None:
        buf = self.held.pop()
        self.pool.release(buf)
        try:
            self.pool.release(buf)
        except StokerError:
            return
        raise AssertionError("a second release was accepted")

    @invariant()
    def bounded(self) -> None:
        assert len(self.pool) <= self.capacity
        assert self.pool.held == len(self.held)
        assert self.pool.busy <= len(self.busy)
        assert self.pool.busy >= sum(not e.done for _, e in self.busy)


PoolMachine.TestCase.settings = settings(max_examples=200, stateful_step_count=40, deadline=None)
test_pinned_pool_bookkeeping = PoolMachine.TestCase


def test_pool_reuses_buffers_and_makes_room_for_a_new_shape() -> None:
    pool = PinnedPool(2, pin=False)
    a = pool.acquire((3,), torch.int64)
    assert a is not None
    pool.release(a)
    assert pool.acquire((3,), torch.int64) is a  # reused, not reallocated
    b = pool.acquire((5,), torch.int64)
    assert b is not None and pool.acquire((7,), torch.int64) is None  # both held
    pool.release(b)
    c = pool.acquire((7,), torch.int64)  # the free (5,) buffer gives way
    assert c is not None and tuple(c.shape) == (7,)
    assert (pool.allocations, len(pool)) == (3, 2)


def test_staging_allocates_once_and_reuses(data: SmallDataset) -> None:
    p = stoker.DevicePrefetcher(loader(data), depth=2, stage=True)
    n = len(list(p))
    pool = p._movers[0].pool
    assert pool is not None
    assert pool.acquisitions == 3 * n  # tokens, sample ids, masks of every batch
    assert pool.allocations <= 2 * pool.capacity  # the short last batch adds a shape
    assert len(pool) == 0  # freed when the pass ended


def test_stats_count_what_training_took(data: SmallDataset) -> None:
    p = stoker.DevicePrefetcher(loader(data), depth=3)
    it = iter(p)
    for _ in range(7):
        next(it)
    assert p._run is not None and p._run.wait_ready(3, READY_TIMEOUT)
    s = p.stats()
    assert s["batches"] == 7 and s["samples"] == 7 * B
    assert s["wait_seconds"] > 0 and 0 <= s["stall_share"] <= 1
    it.close()


def test_random_token_ids_survive_the_narrow_round_trip() -> None:
    rng = np.random.default_rng(0)
    toks = [torch.from_numpy(rng.integers(0, 65536, size=(3, 9))) for _ in range(4)]
    p = stoker.DevicePrefetcher(
        [{"tokens": t} for t in toks], depth=2, stage=True, transfer={"tokens": torch.uint16}
    )
    got = [b["tokens"] for b in p]
    assert all(g.dtype == torch.int64 and torch.equal(g, t) for g, t in zip(got, toks))


@pytest.mark.parametrize("num_workers", [0, 2])
def test_the_loaders_device_option_reads_ahead_and_resumes_exactly(
    data: SmallDataset, num_workers: int
) -> None:
    """TokenLoader(device=...) goes through the device tier: same batches, and a state taken
    with batches in flight restores exactly."""
    plain = ids(passes(loader(data, num_workers), 30))
    dev = loader(data, num_workers, device="cpu", device_depth=3)
    it = iter(dev)
    head = [next(it) for _ in range(10)]
    state = dev.state_dict()
    assert dev._device is not None and prefetch_threads()  # reading ahead right now
    it.close()
    assert not prefetch_threads()
    again = loader(data, num_workers, device="cpu", device_depth=3)
    again.load_state_dict(state)
    rest = passes(again, 20)
    assert ids(head) + ids(rest) == plain
    assert not prefetch_threads()
