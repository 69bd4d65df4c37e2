"""stoker.DevicePrefetcher on a CPU machine: order, exact resume with batches in flight,
shutdown, and TokenLoader(device=...)'s lent batch slots (copied from directly, given
back to their worker only after the copy's event completed).

``stage=True`` runs the copy path of a GPU (pool, narrow transfer, widening) with host
copies standing in for the transfers; without it batches pass through. The pool's and
the loans' bookkeeping have their own tests (test_pinned.py).
"""

from __future__ import annotations

import multiprocessing as mp
import threading
from collections.abc import Callable, Iterator
from typing import Any, ClassVar

import numpy as np
import pytest
import torch

import stoker
from stoker import device as device_tier
from stoker.device import narrow_dtype
from stoker.errors import StateError, StokerError
from stoker.loader import loader as token_loader
from stoker.pinned import Event, Loan, Loans

from ._datasets import SmallDataset
from .test_pinned import FakeEvent

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
    coordinator-fed TokenLoader (``coordinator``, ``last_epoch``, Checkpoint); it tells
    the device tier so (:class:`stoker.device.Prefetchable`)."""

    coordinator = "fake"
    rank = 0
    keeps_passes = True
    zero_copy = False

    def snapshot(self) -> Any:
        ep = self.last_epoch
        if ep is None:
            state = self.state_dict()
            return lambda: dict(state)
        epoch, batches = ep.epoch, ep.batches
        return lambda: self.state_at(epoch, batches)

    def transfer_dtypes(self) -> dict[str, torch.dtype]:
        return {}

    def end_pass(self) -> None:
        pass

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

    def state_at(self, epoch: int, batches: int) -> dict[str, Any]:
        name, snap = self.checkpoint(epoch, batches)
        return {"epoch": epoch, "batches": batches, "checkpoint": name, "snapshot": snap}

    def state_dict(self) -> dict[str, Any]:
        ep = self.last_epoch
        return {"epoch": None} if ep is None else self.state_at(ep.epoch, ep.batches)


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
    # a coordinator-fed pass broken off is kept, its read-ahead included, and continued
    assert p.suspended_taken() == 10
    assert [int(b["sample_id"]) for b in p] == list(range(10, 50))
    assert p._suspended is None


def test_state_at_is_for_a_loader_fed_by_a_coordinator(data: SmallDataset) -> None:
    with pytest.raises(StateError, match="coordinator"):
        loader(data).state_at(0, 3)


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


# -- TokenLoader(device=...): lent batch slots -------------------------------------------


def lent_view(ld: stoker.TokenLoader) -> Any:
    """The device tier's view of ``ld`` (its ``loans``, ``register``)."""
    view = ld._prefetcher().loader
    assert isinstance(view, token_loader._HostView)
    return view


class LateEvent(FakeEvent):
    """A copy that completes on its ``after``-th query, or only when waited for (None)."""

    def __init__(self, after: int | None) -> None:
        super().__init__()
        self.left = after

    def query(self) -> bool:
        if self.left is not None:
            self.left -= 1
            self.done = self.done or self.left <= 0
        return self.done


class CheckedLoans(Loans):
    """Loans that fail the pass if a slot goes back before its copy's event completed."""

    made: ClassVar[list[CheckedLoans]] = []

    def __init__(self) -> None:
        super().__init__()
        self.events: dict[int, Event | None] = {}
        self.early: list[str] = []  # slots given back while their copy ran
        CheckedLoans.made.append(self)

    def lend(self, owner: int, give_back: Callable[[], None], direct: bool = True) -> Loan:
        lent: list[Loan] = []

        def checked() -> None:
            ev = self.events.get(id(lent[0]), "unsettled")
            if not (isinstance(ev, FakeEvent) and ev.done):  # recorded, not raised: the
                self.early.append(repr(ev))  # loader's own errors must not hide it
            give_back()

        lent.append(super().lend(owner, checked, direct))
        return lent[0]

    def _settle(self, loan: Loan, event: Event | None) -> None:
        self.events[id(loan)] = event
        super()._settle(loan, event)


@pytest.fixture
def late_copies(
    monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> list[CheckedLoans]:
    """Host copies whose events complete late (the 3rd query, or, with the parameter
    None, only when waited for), and loans that check every slot comes back only after
    its copy's event completed."""
    after = getattr(request, "param", 3)
    monkeypatch.setattr(device_tier._Host, "record", lambda self, timed: LateEvent(after))
    monkeypatch.setattr(token_loader, "Loans", CheckedLoans)
    CheckedLoans.made = []
    return CheckedLoans.made


def assert_slots_back(loans: Loans | None) -> None:
    assert loans is not None and loans.closed
    assert loans.out() == 0 and loans.lent == loans.returned > 0
    if isinstance(loans, CheckedLoans):
        assert loans.early == [], "slots given back while their copy ran"


@pytest.mark.parametrize("late_copies", [3, None], indirect=True)
def test_a_slot_goes_back_only_after_its_copy_completed(
    data: SmallDataset, reference: list[dict[str, Any]], late_copies: list[CheckedLoans]
) -> None:
    # two slots per worker: the loader must wait for copies to get slots back (with
    # copies that never report done, it waits for them; timeout: fail, not hang, if not)
    ld = loader(data, 2, device="cpu", device_depth=3, prefetch=2, timeout=20.0)
    got = list(ld)
    assert ids(got) == ids(reference[: len(got)])
    assert len(late_copies) == 1
    loans = late_copies[0]
    assert_slots_back(loans)
    assert all(isinstance(e, LateEvent) for e in loans.events.values())  # settled by copies
    assert loans.lent == len(got)


@pytest.mark.parametrize("stage", [True, False])
def test_lent_slots_give_the_int64_paths_batches_bit_for_bit(
    data: SmallDataset, reference: list[dict[str, Any]], stage: bool
) -> None:
    ld = loader(data, 2, device="cpu")
    view = lent_view(ld)
    assert view.transfer_dtypes()["tokens"] == torch.uint16  # vocab 1000: the workers write uint16
    if not stage:  # the pass-through mover copies lent slots out, too
        ld._device = stoker.DevicePrefetcher(view, "cpu", depth=2, stage=False)
    got = list(ld) + list(ld)
    int64_slots = loader(data, 2)
    for want in (reference, list(int64_slots) + list(int64_slots)):
        assert len(got) == len(want)
        for a, b in zip(got, want):
            assert a.keys() == b.keys()
            for k in b:
                assert a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]), k
    assert_slots_back(view.loans)


def test_the_staging_memcpy_is_skipped_for_lent_slots(data: SmallDataset) -> None:
    ld = loader(data, 2, device="cpu")
    batches = list(ld)
    toks = sum(b["tokens"].numel() for b in batches)
    rows = sum(len(b["sample_id"]) for b in batches)
    s = ld._prefetcher().stats()
    assert s["batches_direct"] == len(batches)
    assert s["bytes_staged"] == 0 and s["stage_seconds"] == 0
    # uint16 tokens, bool masks, int64 ids crossed, straight from the slots
    assert s["bytes_transferred"] == 2 * toks + toks + 8 * rows
    # the same loader without lending stages every byte it sends
    p = stoker.DevicePrefetcher(loader(data, 2), "cpu", stage=True)
    assert len(list(p)) == len(batches)
    assert p.stats()["bytes_staged"] == p.stats()["bytes_transferred"] == s["bytes_transferred"]
    assert p.stats()["batches_direct"] == 0


def test_slots_that_cannot_be_page_locked_are_staged_with_one_warning(
    data: SmallDataset, reference: list[dict[str, Any]]
) -> None:
    ld = loader(data, 2, device="cpu")
    view = lent_view(ld)

    def refuse(tensors: list[torch.Tensor]) -> Callable[[], None]:
        raise StokerError("cudaHostRegister refused the batch slots (cudaError 1)")

    view.register = refuse
    with pytest.warns(RuntimeWarning, match="cudaError 1") as caught:
        got = list(ld) + list(ld)
    assert len([w for w in caught if issubclass(w.category, RuntimeWarning)]) == 1
    assert ids(got) == ids(reference)
    assert all(torch.equal(a["tokens"], b["tokens"]) for a, b in zip(got, reference))
    s = ld._prefetcher().stats()
    assert s["batches_direct"] == 0 and s["bytes_staged"] == s["bytes_transferred"] > 0
    assert_slots_back(view.loans)


@pytest.mark.parametrize("how", ["break", "error"])
def test_shutdown_mid_epoch_returns_every_slot(
    data: SmallDataset, how: str, late_copies: list[CheckedLoans]
) -> None:
    ld = loader(data, 2, device="cpu", device_depth=3, prefetch=2)
    view = lent_view(ld)
    undone: list[tuple[int, int]] = []  # at unregistering: loans out, live workers
    view.register = lambda tensors: (
        lambda: undone.append((view.loans.out(), len(mp.active_children())))
    )

    def train() -> None:
        for i, _ in enumerate(ld):
            if i == 5:
                assert ld._device is not None and ld._device._run is not None
                assert ld._device._run.wait_ready(3, READY_TIMEOUT)
                if how == "error":
                    raise KeyError("step failed")
                break

    if how == "error":
        with pytest.raises(KeyError):
            train()
    else:
        train()
    assert ld._device is not None
    assert_nothing_left(ld._device)
    assert_slots_back(view.loans)
    assert late_copies[0] is view.loans
    assert undone == [(0, 0)]  # unregistered after every slot came back and the workers left
    assert ld.state_dict()["consumed"] == 6 * B


def test_resume_with_lent_slots_in_flight(
    data: SmallDataset, reference: list[dict[str, Any]], late_copies: list[CheckedLoans]
) -> None:
    ld = loader(data, 2, device="cpu", device_depth=3, prefetch=2)
    it = iter(ld)
    head = [next(it) for _ in range(10)]
    assert ld._device is not None and ld._device._run is not None
    assert ld._device._run.wait_ready(3, READY_TIMEOUT)
    state = ld.state_dict()
    assert state["consumed"] == 10 * B
    it.close()
    assert_slots_back(late_copies[0])
    again = loader(data, 2, device="cpu", device_depth=3, prefetch=2)
    again.load_state_dict(state)
    rest = passes(again, len(reference) - 10)
    got = head + rest
    assert ids(got) == ids(reference)
    assert all(torch.equal(a["tokens"], b["tokens"]) for a, b in zip(got, reference))
    assert all(loans.closed and loans.out() == 0 for loans in late_copies)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_a_gpu_batches_come_straight_from_page_locked_slots(
    data: SmallDataset, reference: list[dict[str, Any]]
) -> None:
    ld = loader(data, 2, device="cuda")
    got = [{k: v.cpu() for k, v in b.items()} for b in ld]
    s = ld._prefetcher().stats()
    assert s["batches_direct"] == len(got) and s["bytes_staged"] == 0
    for a, b in zip(got, reference):
        assert all(a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]) for k in b)
    assert_slots_back(lent_view(ld).loans)


def test_a_copy_that_fails_settles_its_slot_after_what_was_issued(
    data: SmallDataset, late_copies: list[CheckedLoans]
) -> None:
    ld = loader(data, 2, device="cpu", device_depth=2, prefetch=2)
    it = iter(ld)
    next(it)
    assert ld._device is not None and ld._device._movers
    mover = ld._device._movers[0]
    assert isinstance(mover, device_tier._Stager)
    mover.dev.device = torch.device("cuda", 999)  # the next copies fail (no such device)
    with pytest.raises((AssertionError, RuntimeError)):  # CPU torch: "not compiled with CUDA"
        for _ in range(20):
            next(it)
    loans = late_copies[0]
    assert_slots_back(loans)
    assert len(loans.events) == loans.lent  # the failed batch's slot was settled too
    assert all(isinstance(e, LateEvent) for e in loans.events.values())
    assert_nothing_left(ld._device)
