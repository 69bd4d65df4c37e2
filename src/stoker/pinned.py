"""Host memory the device tier copies from, and when each piece may be reused.

A copy to the GPU issued with ``non_blocking`` reads its source after the call
returns, until the event recorded behind it completes; the source must stay
untouched until then. Two kinds of source, one rule:

- :class:`PinnedPool`: staging buffers the prefetch thread fills with a host
  memcpy (any loader's batches). A buffer is free again once its copy's event
  completed.
- :class:`Loans`: the loader's own shared-memory batch slots, page-locked
  (:func:`stoker.device.pinning.register`) and copied from directly, without the staging memcpy. A
  slot lent to the device tier goes back to its worker (``give_back``) only
  once its copy's event completed, never when training takes the batch.

Both are bookkeeping only, over the :class:`Event` protocol (a CUDA event in
use, fake events in the tests), so the reuse rule is tested without a GPU. The one
call into CUDA, page-locking the slots, is :func:`stoker.device.pinning.register`
(still importable from here).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

import torch

from stoker.errors import ConfigError, StokerError

if TYPE_CHECKING:
    from stoker.device.pinning import register as register

Key = tuple[tuple[int, ...], torch.dtype]


class Event(Protocol):
    """What the bookkeeping needs of a CUDA event: whether it completed, and a wait for it."""

    def query(self) -> bool: ...

    def synchronize(self) -> None: ...


T = TypeVar("T")


class _InFlight(Generic[T]):
    """Items a copy still reads, each until its event completes, in release order."""

    def __init__(self) -> None:
        self._q: deque[tuple[T, Event]] = deque()

    def __len__(self) -> int:
        return len(self._q)

    def __iter__(self) -> Iterator[T]:
        return (item for item, _ in self._q)

    def add(self, item: T, event: Event) -> None:
        self._q.append((item, event))

    def done(self) -> list[T]:
        """Take out the items whose event completed."""
        done: list[T] = []
        left: deque[tuple[T, Event]] = deque()
        for item, event in self._q:
            if event.query():
                done.append(item)
            else:
                left.append((item, event))
        self._q = left
        return done

    def wait(self) -> list[T] | None:
        """Wait for the oldest item's event, then :meth:`done`; None if there is none."""
        if not self._q:
            return None
        self._q[0][1].synchronize()
        return self.done()


class PinnedPool:
    """Reusable host staging buffers keyed by (shape, dtype), at most ``capacity`` of them.

    A buffer is *free*, *held* (returned by :meth:`acquire`, being filled) or
    *busy* (given back by :meth:`release` with an event: a copy from it runs
    until the event completes). :meth:`acquire` hands out only free buffers
    (or new ones, while there are fewer than ``capacity``), so a buffer is
    never handed out while in use. Buffers are pinned when ``pin`` (default:
    when CUDA is available); ``alloc`` replaces the allocation (tests).
    """

    def __init__(
        self,
        capacity: int,
        *,
        pin: bool | None = None,
        alloc: Callable[[tuple[int, ...], torch.dtype], torch.Tensor] | None = None,
    ) -> None:
        if capacity < 1:
            raise ConfigError(f"capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        pinned = torch.cuda.is_available() if pin is None else pin
        self._alloc = alloc or (lambda s, d: torch.empty(s, dtype=d, pin_memory=pinned))
        self._free: dict[Key, list[torch.Tensor]] = {}
        self._held: dict[int, tuple[Key, torch.Tensor]] = {}  # id(buffer) -> (key, buffer)
        self._busy: _InFlight[tuple[Key, torch.Tensor]] = _InFlight()
        self.allocations = 0
        self.acquisitions = 0

    @property
    def free(self) -> int:
        return sum(len(v) for v in self._free.values())

    @property
    def held(self) -> int:
        return len(self._held)

    @property
    def busy(self) -> int:
        return len(self._busy)

    def __len__(self) -> int:
        return self.free + self.held + self.busy

    def acquire(self, shape: Iterable[int], dtype: torch.dtype) -> torch.Tensor | None:
        """A buffer nobody uses, or None when all ``capacity`` are held or busy
        (:meth:`wait` for one, then ask again)."""
        self.reap()
        key = (tuple(int(n) for n in shape), dtype)
        free = self._free.get(key)
        if free:
            buf = free.pop()
        else:
            if len(self) >= self.capacity:
                other = next((k for k, v in self._free.items() if v), None)
                if other is None:
                    return None
                self._free[other].pop()  # a free buffer of another shape makes room
            buf = self._alloc(key[0], dtype)
            self.allocations += 1
        self._held[id(buf)] = (key, buf)
        self.acquisitions += 1
        return buf

    def release(self, buf: torch.Tensor, event: Event | None = None) -> None:
        """Give ``buf`` back: free now, or once ``event`` completed."""
        entry = self._held.get(id(buf))
        if entry is None or entry[1] is not buf:
            raise StokerError("released a buffer this pool did not hand out (or twice)")
        del self._held[id(buf)]
        if event is None:
            self._free.setdefault(entry[0], []).append(buf)
        else:
            self._busy.add(entry, event)

    def reap(self) -> int:
        """Free the busy buffers whose event completed; how many."""
        return self._freed(self._busy.done())

    def wait(self) -> bool:
        """Wait for the oldest busy buffer's event and free what completed; False if none is busy."""
        done = self._busy.wait()
        if done is None:
            return False
        self._freed(done)
        return True

    def _freed(self, entries: list[tuple[Key, torch.Tensor]]) -> int:
        for key, buf in entries:
            self._free.setdefault(key, []).append(buf)
        return len(entries)

    def close(self) -> None:
        """Wait for every copy in flight and drop all buffers (held ones stay the holder's)."""
        while self.wait():
            pass
        self._free.clear()
        self._held.clear()


class Loan:
    """One batch slot lent to the device tier by its ``owner`` (a loader worker).

    ``direct``: the slot may be copied from as it is (page-locked, or no CUDA
    copy at all); otherwise the device tier stages it like any batch. The
    device tier calls :meth:`settle` once the copies from the slot are issued.
    """

    __slots__ = ("_loans", "direct", "give_back", "owner", "settled")

    def __init__(
        self, loans: Loans, owner: int, give_back: Callable[[], None], direct: bool
    ) -> None:
        self._loans = loans
        self.owner, self.give_back, self.direct = owner, give_back, direct
        self.settled = False

    def settle(self, event: Event | None = None) -> None:
        """The copies from the slot are issued: it goes back once ``event`` completed
        (at the owner's next :meth:`Loans.reap`), or now if there is no event."""
        self._loans._settle(self, event)


class Loans:
    """The batch slots a loader has lent to the device tier, per owner.

    A loan is *out* from :meth:`lend` until its slot is given back, which
    happens only after :meth:`Loan.settle`'s event completed: in :meth:`reap`
    (events that completed), :meth:`wait` (the oldest, waited for) or
    :meth:`close`. One thread uses it (the prefetch thread runs both the
    loader's pass and the copies).
    """

    def __init__(self) -> None:
        self._out: dict[int, int] = {}  # owner -> loans not given back
        self._unsettled: list[Loan] = []
        self._settled: _InFlight[Loan] = _InFlight()
        self.closed = False
        self.lent = 0
        self.returned = 0

    def lend(self, owner: int, give_back: Callable[[], None], direct: bool = True) -> Loan:
        if self.closed:
            raise StokerError("lent a slot after the loans were closed; this is a stoker bug")
        loan = Loan(self, owner, give_back, direct)
        self._out[owner] = self._out.get(owner, 0) + 1
        self._unsettled.append(loan)
        self.lent += 1
        return loan

    def out(self, owner: int | None = None) -> int:
        """Loans not given back (of ``owner``, or of all)."""
        return sum(self._out.values()) if owner is None else self._out.get(owner, 0)

    def _settle(self, loan: Loan, event: Event | None) -> None:
        if loan.settled or loan not in self._unsettled:
            raise StokerError("a slot loan settled twice (or not lent here); this is a stoker bug")
        if self.closed:
            raise StokerError("a slot loan settled after its pass ended; this is a stoker bug")
        loan.settled = True
        self._unsettled.remove(loan)
        if event is None:
            self._return(loan)
        else:
            self._settled.add(loan, event)

    def _return(self, loan: Loan) -> None:
        self._out[loan.owner] -= 1
        self.returned += 1
        loan.give_back()

    def reap(self) -> int:
        """Give back the slots whose copy's event completed; how many."""
        return self._returned(self._settled.done())

    def wait(self) -> bool:
        """Wait for the oldest settled loan's event and give back what completed;
        False if none is settled."""
        done = self._settled.wait()
        if done is None:
            return False
        self._returned(done)
        return True

    def _returned(self, loans: list[Loan]) -> int:
        for loan in loans:
            self._return(loan)
        return len(loans)

    def close(self, give_back: bool = True) -> None:
        """Wait for every copy in flight and give every slot back (a loan never settled:
        its batch reached no copy); with ``give_back=False`` the slots are only counted
        back (their owners are being stopped and would fill them again)."""
        if not give_back:
            for loan in self._settled:
                loan.give_back = _nothing
            for loan in self._unsettled:
                loan.give_back = _nothing
        while self.wait():
            pass
        for loan in self._unsettled:
            loan.settled = True
            self._return(loan)
        self._unsettled.clear()
        self.closed = True


def _nothing() -> None:
    pass


class Lent(dict[str, Any]):
    """A batch whose tensors are views into a lent slot: valid until ``loan`` is settled."""

    def __init__(self, batch: dict[str, Any], loan: Loan) -> None:
        super().__init__(batch)
        self.loan = loan


def __getattr__(name: str) -> Any:  # its home before the device package
    if name == "register":
        import warnings

        from stoker.device.pinning import register

        warnings.warn(
            "stoker.pinned.register moved to stoker.device.pinning.register; the old name "
            "goes in 0.3",
            DeprecationWarning,
            stacklevel=2,
        )

        return register
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
