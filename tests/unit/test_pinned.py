"""The bookkeeping of host memory the device tier copies from (stoker.pinned), with fake
events: the staging pool (a Hypothesis state machine) and the loans of a loader's batch
slots, which go back to their worker only after their copy's event completed."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest
import torch
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from stoker.device.pinning import register
from stoker.errors import StokerError
from stoker.pinned import Loan, Loans, PinnedPool

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


# -- loans of a loader's batch slots -------------------------------------------------------


class Slots:
    """The worker's side of the loans: which slots came back, checked as they come."""

    def __init__(self) -> None:
        self.events: dict[int, FakeEvent | None] = {}  # slot -> the event it settled with
        self.back: list[int] = []

    def give_back(self, slot: int) -> Any:
        def back() -> None:
            ev = self.events.get(slot)
            assert ev is None or ev.done, f"slot {slot} given back while its copy ran"
            self.back.append(slot)

        return back


def test_a_slot_goes_back_only_after_its_copy_completed() -> None:
    slots, loans = Slots(), Loans()
    loan = loans.lend(0, slots.give_back(7))
    ev = slots.events[7] = FakeEvent()
    loan.settle(ev)
    assert (loans.reap(), slots.back, loans.out(0)) == (0, [], 1)  # the copy still runs
    ev.done = True
    assert (loans.reap(), slots.back, loans.out(0)) == (1, [7], 0)
    assert (loans.lent, loans.returned) == (1, 1)


def test_wait_and_close_finish_the_copies_first() -> None:
    slots, loans = Slots(), Loans()
    a, b, c = (loans.lend(w, slots.give_back(s)) for w, s in ((0, 1), (1, 2), (0, 3)))
    slots.events[1], slots.events[2] = FakeEvent(), FakeEvent()
    a.settle(slots.events[1])
    b.settle(slots.events[2])
    assert loans.out() == 3 and loans.out(0) == 2
    assert loans.wait() and slots.back == [1]  # the oldest, waited for
    c.settle()  # no device copy (staged on the host): back at once
    assert slots.back == [1, 3]
    loans.close()
    assert slots.back == [1, 3, 2] and loans.out() == 0 and not loans.wait()


def test_a_loan_never_settled_goes_back_at_close() -> None:
    slots, loans = Slots(), Loans()
    loans.lend(0, slots.give_back(4))  # its batch never reached a copy (an error)
    loans.close()
    assert slots.back == [4] and loans.out() == 0
    with pytest.raises(StokerError):
        loans.lend(0, slots.give_back(5))


def test_close_without_give_back_waits_for_the_copies_and_keeps_the_slots() -> None:
    # the loader closes its loans as it stops its workers: a slot handed back would make
    # a worker fill it once more before it reads the stop
    slots, loans = Slots(), Loans()
    a, b = loans.lend(0, slots.give_back(1)), loans.lend(1, slots.give_back(2))
    ev = slots.events[1] = FakeEvent()
    a.settle(ev)
    loans.lend(0, slots.give_back(3))  # never settled
    loans.close(give_back=False)
    assert ev.done  # waited for: the slot's memory is free of copies
    assert slots.back == [] and loans.out() == 0 and loans.returned == loans.lent == 3
    with pytest.raises(StokerError):
        b.settle()  # the pass ended


def test_settling_twice_is_refused() -> None:
    loans = Loans()
    loan = loans.lend(0, lambda: None)
    loan.settle()
    with pytest.raises(StokerError, match="twice"):
        loan.settle(FakeEvent())


class LoanMachine(RuleBasedStateMachine):
    """Lend, settle (with or without an event), complete events, reap, wait, in any order:
    a slot never goes back while its copy runs, and each goes back exactly once."""

    def __init__(self) -> None:
        super().__init__()
        self.slots, self.loans = Slots(), Loans()
        self.next = 0
        self.unsettled: list[tuple[int, Loan]] = []
        self.settled: list[int] = []
        self.owner: dict[int, int] = {}

    @rule(owner=st.integers(0, 2))
    def lend(self, owner: int) -> None:
        slot, self.next = self.next, self.next + 1
        self.owner[slot] = owner
        self.unsettled.append((slot, self.loans.lend(owner, self.slots.give_back(slot))))

    @precondition(lambda self: self.unsettled)
    @rule(i=st.integers(0, 100), with_event=st.booleans())
    def settle(self, i: int, with_event: bool) -> None:
        slot, loan = self.unsettled.pop(i % len(self.unsettled))
        ev = self.slots.events[slot] = FakeEvent() if with_event else None
        loan.settle(ev)
        self.settled.append(slot)

    @precondition(
        lambda self: any(e is not None and not e.done for e in self.slots.events.values())
    )
    @rule(i=st.integers(0, 100))
    def complete(self, i: int) -> None:
        running = [e for e in self.slots.events.values() if e is not None and not e.done]
        running[i % len(running)].done = True

    @rule()
    def reap(self) -> None:
        self.loans.reap()

    @rule()
    def wait(self) -> None:
        running = any(s not in self.slots.back for s in self.settled)
        assert self.loans.wait() == running

    @invariant()
    def accounted(self) -> None:
        back = self.slots.back
        assert len(back) == len(set(back)), "a slot went back twice"
        assert not any(s in back for s, _ in self.unsettled), "went back before its copy"
        done = {s for s, e in self.slots.events.items() if e is None or e.done}
        assert set(back) <= done
        for w in range(3):
            lent = [s for s, o in self.owner.items() if o == w]
            assert self.loans.out(w) == sum(s not in back for s in lent)

    def teardown(self) -> None:
        self.loans.close()
        assert sorted(self.slots.back) == list(range(self.next))
        assert self.loans.out() == 0 and self.loans.lent == self.loans.returned == self.next


LoanMachine.TestCase.settings = settings(max_examples=200, stateful_step_count=40, deadline=None)
test_slot_loans_bookkeeping = LoanMachine.TestCase


# -- page-locking (cudaHostRegister), against a fake CUDA runtime ---------------------------


class FakeCudart:
    """Records register / unregister calls and the thread they ran on; refuses the
    ``refuse``-th registration (1-based) with error code 712."""

    def __init__(self, refuse: int | None = None) -> None:
        self.refuse = refuse
        self.registered: list[tuple[int, int, int]] = []
        self.unregistered: list[int] = []
        self.threads: set[str] = set()
        self.current: dict[int, Any] = {}  # thread ident -> the device it selected
        self.devices: list[Any] = []  # the calling thread's device, per call

    def set_device(self, device: Any) -> None:
        self.current[threading.get_ident()] = torch.device(device)

    def _called(self) -> None:
        self.threads.add(threading.current_thread().name)
        self.devices.append(self.current.get(threading.get_ident()))

    def cudaHostRegister(self, ptr: int, nbytes: int, flags: int) -> int:
        self._called()
        if self.refuse is not None and len(self.registered) + 1 == self.refuse:
            return 712
        self.registered.append((ptr, nbytes, flags))
        return 0

    def cudaHostUnregister(self, ptr: int) -> int:
        self._called()
        self.unregistered.append(ptr)
        return 0


@pytest.fixture
def fake_cuda(monkeypatch: pytest.MonkeyPatch) -> Callable[[int | None], FakeCudart]:
    def install(refuse: int | None) -> FakeCudart:
        rt = FakeCudart(refuse)
        monkeypatch.setattr(torch.cuda, "cudart", lambda: rt)
        monkeypatch.setattr(torch.cuda, "set_device", rt.set_device)
        return rt

    return install


def slot_tensors() -> list[torch.Tensor]:
    return [
        torch.zeros((2, 4, 9), dtype=torch.uint16).share_memory_(),
        torch.zeros((2, 4), dtype=torch.int64).share_memory_(),
        torch.zeros((2, 4, 9), dtype=torch.bool).share_memory_(),
    ]


def test_register_page_locks_whole_storages_off_the_calling_thread(
    fake_cuda: Callable[[int | None], FakeCudart],
) -> None:
    rt = fake_cuda(None)
    tensors = slot_tensors()
    undo = register(tensors, torch.device("cuda", 1))
    want = [(t.untyped_storage().data_ptr(), t.untyped_storage().nbytes(), 0) for t in tensors]
    assert rt.registered == want and rt.unregistered == []
    undo()
    assert rt.unregistered == [p for p, _, _ in want]
    assert threading.current_thread().name not in rt.threads  # errors stay off this thread
    # each call on a thread that selected the rank's device (a new thread's is GPU 0)
    assert rt.devices == [torch.device("cuda", 1)] * (2 * len(tensors))


def test_a_refused_registration_raises_with_the_code_and_undoes_the_rest(
    fake_cuda: Callable[[int | None], FakeCudart],
) -> None:
    rt = fake_cuda(3)
    tensors = slot_tensors()
    with pytest.raises(StokerError, match="cudaError 712"):
        register(tensors, torch.device("cuda", 0))
    assert rt.unregistered == [p for p, _, _ in rt.registered] and len(rt.registered) == 2
