"""The device tier: :class:`DevicePrefetcher` puts batches on the GPU before training asks.

::

    loader (CPU batches) -- prefetch thread --> pinned staging buffer (PinnedPool)
        -- side CUDA stream --> GPU, narrow dtype -- widened on the side stream --> ready event
    training: next() --> its stream waits on the event --> the batch, already on the GPU

    TokenLoader(device=..., num_workers>0): worker --> page-locked shared-memory slot,
        tokens already narrow -- side CUDA stream --> GPU (no staging memcpy)
        -- the slot goes back to its worker once the copy's event completed

A thread, not a side stream driven from the training thread: pulling a batch
from the loader and copying it into a pinned buffer are host work (a memcpy,
for ``num_workers=0`` the whole decode), and on the training thread they would
sit between two steps however early the copy was issued. On the thread they
overlap the step; the training thread only makes its stream wait on an event
(a GPU-side wait, no host sync). CUDA streams and events may be used from any
thread.

Host memory (:mod:`stoker.pinned`): a batch from any loader is copied into
buffers of a :class:`~stoker.pinned.PinnedPool`, and a buffer returns to the
pool only once the event recorded after its copy has completed. A
:class:`~stoker.TokenLoader` that feeds its own device tier instead *lends*
its shared-memory batch slots (:class:`~stoker.pinned.Lent` batches): the
slots hold tokens in the transfer dtype and are page-locked, so the copies
read them where the worker wrote them, and each :class:`~stoker.pinned.Loan`
is settled with its copy's event; the loader gives the slot back to its
worker once that event completed. A lent batch is staged like any other when
its slots could not be page-locked or a tensor is not in its transfer dtype.
Device tensors are made on the side stream and ``record_stream``-ed onto the
consumer's stream when handed out, so the caching allocator never reuses
them under a running step.

Narrow payloads: a key can cross the bus in a narrower dtype than the loader
gives (``tokens`` as uint16 when the dataset's vocabulary fits) and is widened
on the GPU to what training receives (``widen``, by default the loader's
dtype). uint8 images cross as uint8 and become float32 there with
``widen={"image": torch.float32}``.

Exact resume: right after pulling batch ``k`` the thread snapshots the
loader's state (before pulling ``k + 1``) and keeps it with batch ``k``;
:meth:`DevicePrefetcher.state_dict` returns the snapshot of the last batch
handed to training, so batches read ahead never count as consumed.
``TokenLoader.state_dict()`` costs about 15 us, once per batch. Fed by a
coordinator its state is a Checkpoint call, so there the snapshot is only
``(epoch, batches)`` and the call (``state_at``) is made when a state is
asked for.

Without CUDA (or with ``device="cpu"``) batches pass through as the loader
gives them (``widen`` applied), still read ahead by the thread, so the
ordering, resume and shutdown logic is the same code on a CPU machine.
``stage=True`` runs the copy path there with host copies (``TokenLoader``'s
``device=`` always does): lent slots, their loans and the staging pool are
then the same code as on a GPU, less the page-locking.
"""

from __future__ import annotations

import contextlib
import threading
import time
import warnings
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, Protocol, runtime_checkable

import torch

from stoker import env
from stoker.errors import ConfigError, StokerError
from stoker.observe.registry import LoaderStats, registry
from stoker.pinned import Event, Loan, PinnedPool

Batch = dict[str, Any]

#: Seconds :meth:`DevicePrefetcher.close` waits for the thread to leave ``next(loader)``.
JOIN_TIMEOUT = 60.0


#: Set to 1 to make a CUDA device asked for on a machine without CUDA an error.
STRICT_ENV = "STOKER_STRICT_DEVICE"
_warned_devices: set[str] = set()  # CUDA devices asked for without CUDA, warned about once


def _strict_from_env() -> bool:
    raw = (env.get(STRICT_ENV) or "").strip().lower()
    if raw in ("", "0", "false", "no"):
        return False
    if raw in ("1", "true", "yes"):
        return True
    raise ConfigError(f"environment variable {STRICT_ENV}={raw!r} must be 1 or 0")


def resolve_device(device: torch.device | str | None, strict: bool | None = None) -> torch.device:
    """The device batches go to: ``device``, or CUDA when present and none is given.

    A CUDA device asked for on a machine without CUDA leaves batches on the CPU
    (the same script runs on a laptop) with one ``RuntimeWarning`` per device and
    process; with ``strict`` (default: the ``STOKER_STRICT_DEVICE`` environment
    variable, ``1`` or ``0``) it is a :class:`~stoker.errors.ConfigError` instead.
    """
    cuda = torch.cuda.is_available()
    dev = torch.device(device if device is not None else ("cuda" if cuda else "cpu"))
    if dev.type == "cuda" and not cuda:
        if _strict_from_env() if strict is None else strict:
            raise ConfigError(
                f"device {str(dev)!r} was asked for but CUDA is not available "
                f"(torch {torch.__version__}, CUDA build: {torch.version.cuda or 'no'}); "
                'install a CUDA build of torch, or pass device="cpu"'
            )
        if str(dev) not in _warned_devices:
            _warned_devices.add(str(dev))
            warnings.warn(
                f"device {str(dev)!r} was asked for but CUDA is not available: batches stay "
                f"on the CPU (set {STRICT_ENV}=1 to make this an error)",
                RuntimeWarning,
                stacklevel=3,
            )
        return torch.device("cpu")
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    if dev.type not in ("cuda", "cpu"):
        raise ConfigError(f"device must be a CUDA device or cpu, got {dev}")
    return dev


def narrow_dtype(vocab_size: int) -> torch.dtype | None:
    """The narrowest dtype holding token ids ``[0, vocab_size)``; None if int64 is needed."""
    if vocab_size <= 1 << 8:
        return torch.uint8
    if vocab_size <= 1 << 16:
        return torch.uint16
    if vocab_size <= 1 << 31:
        return torch.int32
    return None


@runtime_checkable
class Prefetchable(Protocol):
    """What the device tier asks of a loader that knows itself (a
    :class:`~stoker.TokenLoader`); any other loader gets the defaults: its
    ``state_dict()`` taken after every batch, the transfer dtypes it is given, rank 0.
    """

    rank: int  # whose figures the device tier's metrics are
    keeps_passes: bool  # a broken-off pass is continued as it is, not reloaded from a state
    zero_copy: bool  # its batches are views, valid only until the next one is asked for

    def snapshot(self) -> Callable[[], dict[str, Any]]:
        """The state as of the batch just handed out, cheap to take after every batch;
        calling it makes the state."""
        ...

    def transfer_dtypes(self) -> Mapping[str, torch.dtype]:
        """The dtypes fields cross the bus in (narrower than they are, where they fit)."""
        ...

    def end_pass(self) -> None:
        """Drop a kept, broken-off pass."""
        ...


class _Done:
    """The event of a host copy: complete once issued."""

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        pass


class _Host:
    """Staging without CUDA: copies are synchronous, so every event is complete."""

    pin = False

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def side(self) -> contextlib.AbstractContextManager[Any]:
        return contextlib.nullcontext()

    def record(self, timed: bool) -> Event:
        return _Done()

    def hand_over(self, batch: Batch, event: Event) -> None:
        pass


class _Cuda:
    """A side stream of ``device`` for the copies; events order the consumer after them."""

    pin = True

    def __init__(self, device: torch.device) -> None:
        self.device = device
        torch.cuda.set_device(device)  # this thread's device
        self.stream = torch.cuda.Stream(device)

    def side(self) -> contextlib.AbstractContextManager[Any]:
        return torch.cuda.stream(self.stream)

    def record(self, timed: bool) -> Event:
        event = torch.cuda.Event(enable_timing=timed)
        event.record(self.stream)
        return event

    def hand_over(self, batch: Batch, event: Event) -> None:
        current = torch.cuda.current_stream(self.device)
        current.wait_event(event)  # type: ignore[arg-type]
        for v in batch.values():
            if isinstance(v, torch.Tensor):
                v.record_stream(current)


def _loan(batch: Batch) -> Loan | None:
    """The slot loan of a batch lent by its loader (:class:`~stoker.pinned.Lent`), if any."""
    loan = getattr(batch, "loan", None)
    return loan if isinstance(loan, Loan) else None


class _Stager:
    """Moves a batch to the device (runs on the prefetch thread): straight from a lent,
    page-locked slot when the batch is one whose tensors are already in their transfer
    dtype, else through pinned staging buffers."""

    def __init__(
        self,
        dev: _Host | _Cuda,
        depth: int,
        transfer: Mapping[str, torch.dtype],
        widen: Mapping[str, torch.dtype],
        timed: bool,
    ) -> None:
        self.dev = dev
        self.depth = depth
        self.transfer = transfer
        self.widen = widen
        self.timed = timed
        self.pool: PinnedPool | None = None
        self.stage_seconds = 0.0  # host copies into the staging buffers
        self.staged_bytes = 0  # bytes of those host copies
        self.bytes = 0  # bytes that crossed the bus
        self.direct = 0  # batches copied straight from their loader's slots
        self.copies: list[tuple[Event, Event, int]] = []  # timed: (start, copied, bytes)

    def _buffer(self, shape: torch.Size, dtype: torch.dtype) -> torch.Tensor:
        assert self.pool is not None
        while True:
            buf = self.pool.acquire(shape, dtype)
            if buf is not None:
                return buf
            if not self.pool.wait():
                raise StokerError(
                    f"pinned pool of {self.pool.capacity} buffers exhausted by one batch; "
                    "this is a stoker bug"
                )

    def _stage(self, batch: Batch) -> dict[str, torch.Tensor]:
        """Each tensor copied into a pinned buffer, narrowed to its transfer dtype."""
        if self.pool is None:  # sized by the first batch: depth + 1 batches in flight
            n = sum(isinstance(v, torch.Tensor) for v in batch.values())
            self.pool = PinnedPool((self.depth + 1) * max(1, n), pin=self.dev.pin)
        t = time.perf_counter()
        staged: dict[str, torch.Tensor] = {}
        for k, v in batch.items():
            if isinstance(v, torch.Tensor):
                staged[k] = buf = self._buffer(v.shape, self.transfer.get(k, v.dtype))
                buf.copy_(v)  # narrowed here when the transfer dtype is narrower
                self.staged_bytes += buf.numel() * buf.element_size()
        self.stage_seconds += time.perf_counter() - t
        return staged

    def _direct(self, batch: Batch, loan: Loan | None) -> bool:
        """Whether the copies may read ``batch``'s tensors where they are: its lent slot
        is page-locked (or nothing needs it to be: no CUDA) and holds every tensor in
        its transfer dtype."""
        if loan is None or not loan.direct:
            return False
        return all(
            v.dtype == self.transfer.get(k, v.dtype) and v.is_contiguous()
            for k, v in batch.items()
            if isinstance(v, torch.Tensor)
        )

    def move(self, batch: Batch) -> tuple[Batch, Event]:
        """Copy (staging first if needed) and widen ``batch``; the event orders a consumer
        after all of it. A lent slot is settled with the event of its copies."""
        loan = _loan(batch)
        direct = self._direct(batch, loan)
        if direct:
            source = {k: v for k, v in batch.items() if isinstance(v, torch.Tensor)}
            self.direct += 1
        else:
            source = self._stage(batch)
            if loan is not None:
                loan.settle()  # copied out on the host: the slot may go back now
        out: Batch = {}
        with self.dev.side():
            start = self.dev.record(True) if self.timed else None
            try:
                # the copies back to back; copy=True: on the host .to() would return the source
                moved = {
                    k: src.to(self.dev.device, non_blocking=True, copy=True)
                    for k, src in source.items()
                }
            except BaseException:  # e.g. out of memory after some copies were issued
                if direct and loan is not None:
                    with contextlib.suppress(Exception):
                        loan.settle(self.dev.record(False))  # back after what was issued
                raise
            copied = self.dev.record(self.timed)  # the sources may be reused after this
            widened = False
            for k, v in batch.items():
                if k not in source:
                    out[k] = v
                    continue
                wide = self.widen.get(k, v.dtype)
                out[k] = moved[k] if moved[k].dtype == wide else moved[k].to(wide)
                widened = widened or out[k] is not moved[k]
            ready = self.dev.record(False) if widened else copied
        if direct:
            assert loan is not None
            loan.settle(copied)
        else:
            assert self.pool is not None
            for buf in source.values():
                self.pool.release(buf, copied)
        nbytes = sum(src.numel() * src.element_size() for src in source.values())
        self.bytes += nbytes
        if start is not None:
            self.copies.append((start, copied, nbytes))
        return out, ready

    def hand_over(self, batch: Batch, event: Event) -> None:
        self.dev.hand_over(batch, event)

    def close(self) -> None:
        if self.pool is not None:
            self.pool.close()


class _Pass:
    """No staging: the loader's batch (copied if the loader lends views), widened."""

    def __init__(self, widen: Mapping[str, torch.dtype], views: bool) -> None:
        self.widen, self.views = widen, views
        self.bytes = 0
        self.stage_seconds = 0.0
        self.staged_bytes = 0
        self.direct = 0
        self.copies: list[tuple[Event, Event, int]] = []
        self.pool: PinnedPool | None = None

    def move(self, batch: Batch) -> tuple[Batch, Event]:
        loan = _loan(batch)
        views = self.views or loan is not None
        out: Batch = {}
        for k, v in batch.items():
            if isinstance(v, torch.Tensor):
                wide = self.widen.get(k, v.dtype)
                if v.dtype != wide:
                    v = v.to(wide)
                elif views:  # zero_copy or a lent slot: valid only for a while
                    v = v.clone()
            out[k] = v
        if loan is not None:
            loan.settle()
        return out, _Done()

    def hand_over(self, batch: Batch, event: Event) -> None:
        pass

    def close(self) -> None:
        pass


Mover = _Stager | _Pass
Snapshot = Callable[[], dict[str, Any]]  # the state, made when asked for


def _snapshotter(loader: Any) -> Callable[[], Snapshot] | None:
    """How to capture the loader's state cheaply after each batch it hands out."""
    if isinstance(loader, Prefetchable):
        return loader.snapshot
    if not callable(getattr(loader, "state_dict", None)):
        return None

    def eager() -> Snapshot:
        state = loader.state_dict()
        return lambda: dict(state)

    return eager


class _Run:
    """One pass over the loader: a thread reads up to ``depth`` batches ahead of training.

    ``depth`` counts batches pulled (or being pulled) from the loader and not yet
    taken by training, the end of the pass included. Items are ``("batch",
    batch, event, snapshot)``, ``("end",)`` or ``("error", exc)``.
    """

    def __init__(
        self,
        loader: Iterable[Batch],
        make_mover: Callable[[], Mover],
        snapshot: Callable[[], Snapshot] | None,
        depth: int,
    ) -> None:
        self.loader = loader
        self.make_mover = make_mover
        self.snapshot = snapshot
        self.depth = depth
        self.mover: Mover | None = None
        self.ended = False  # training took the end of the pass
        self.done = False  # the thread finished (loader closed, buffers freed)
        self.in_flight = 0
        self.taken = 0  # batches training took
        self._items: deque[tuple[Any, ...]] = deque()
        self._cv = threading.Condition()
        self._stop = False
        self.thread = threading.Thread(target=self._main, name="stoker-prefetch", daemon=True)
        self.thread.start()

    def _reserve(self) -> bool:
        with self._cv:
            while not self._stop and self.in_flight >= self.depth:
                self._cv.wait()
            if self._stop:
                return False
            self.in_flight += 1
            return True

    def _put(self, item: tuple[Any, ...]) -> None:
        with self._cv:
            self._items.append(item)
            self._cv.notify_all()

    def _main(self) -> None:
        it: Iterator[Batch] | None = None
        try:
            self.mover = self.make_mover()
            it = iter(self.loader)
            while self._reserve():
                try:
                    batch = next(it)
                except StopIteration:
                    self._put(("end",))
                    return
                # before the next pull: the state as of this batch
                snap = None if self.snapshot is None else self.snapshot()
                moved, event = self.mover.move(batch)
                self._put(("batch", moved, event, snap))
        except BaseException as exc:
            self._put(("error", exc))
        finally:
            close = getattr(it, "close", None)
            try:
                if close is not None:
                    close()  # a generator's finally: the loader's workers stop
            finally:
                if self.mover is not None:
                    self.mover.close()
                with self._cv:
                    self.done = True
                    self._cv.notify_all()

    def wait_ready(self, n: int, timeout: float) -> bool:
        """Wait until ``n`` items are ready (or the thread ended); False on timeout."""
        with self._cv:
            return self._cv.wait_for(lambda: len(self._items) >= n or self.done, timeout)

    def take(self) -> tuple[Any, ...]:
        """The next item; ``("closed",)`` once :meth:`close` was called."""
        with self._cv:
            while not self._items:
                if self._stop:
                    return ("closed",)
                if self.done:
                    raise StokerError("the prefetch thread ended without a batch or an error")
                self._cv.wait()
            item = self._items.popleft()
            self.in_flight -= 1
            self._cv.notify_all()
            return item

    def close(self) -> None:
        """Stop the thread and drop what it read ahead."""
        with self._cv:
            self._stop = True
            self._cv.notify_all()
        if self.thread is not threading.current_thread():
            self.thread.join(JOIN_TIMEOUT)
            if self.thread.is_alive():
                warnings.warn(
                    f"the prefetch thread is still inside next(loader) after {JOIN_TIMEOUT:.0f} s; "
                    "it stops (and frees its buffers) when that call returns",
                    ResourceWarning,
                    stacklevel=3,
                )
        with self._cv:
            self._items.clear()


class DevicePrefetcher:
    """Batches of ``loader`` on ``device``, ``depth`` of them copied ahead of training.

    Iterating runs one pass of the loader (for a :class:`~stoker.TokenLoader`,
    one epoch); each batch comes out already on the device, ordered after its
    copy on the current CUDA stream. ``widen`` maps keys to the dtype training
    receives (other keys keep the loader's dtype); ``transfer`` maps keys to
    the dtype they cross the bus in (default: ``tokens`` in the narrowest
    dtype of the dataset's ``manifest.vocab_size``, when the loader has one).
    Values must fit the transfer dtype; they are not checked.

    Without CUDA, or with ``device="cpu"``, batches pass through unchanged
    (apart from ``widen``), read ahead by the same thread. ``stage=True``
    forces the copy path there too, with host copies standing in for the
    transfers (tests, benchmarks, ``TokenLoader(device=...)``). A CUDA device
    asked for without CUDA warns once (``RuntimeWarning``), or with ``strict=True``
    (or ``STOKER_STRICT_DEVICE=1``) raises a ``ConfigError`` (:func:`resolve_device`).

    Batches a loader lends (:class:`~stoker.pinned.Lent`, from
    ``TokenLoader(device=...)``) are copied straight from the loader's
    page-locked slots when their tensors are in their transfer dtype, and each
    slot's loan is settled with its copy's event; other batches are staged
    through a :class:`~stoker.pinned.PinnedPool`.

    ``next()`` waits for a batch as long as the loader lets it (a
    :class:`~stoker.TokenLoader` raises after its ``timeout``); a loader's
    error reaches the training loop after the batches before it.

    :meth:`state_dict` counts the batches training took, not those in flight;
    take the state from the prefetcher, not from the loader (which counts
    what the prefetcher pulled). :meth:`close` (or leaving a ``with`` block,
    breaking out of the loop, an exception in it) stops the thread, stops the
    loader's pass and frees the staging buffers.

    :meth:`stats` gives the wait as training sees it. It is not exported to
    Prometheus: the loader's own figures (``registry().loader``) are then taken at
    the prefetch thread, where a wait means the loader itself does not keep
    up, and exporting both would count every batch twice.
    """

    def __init__(
        self,
        loader: Iterable[Batch],
        device: torch.device | str | None = None,
        depth: int = 2,
        widen: Mapping[str, torch.dtype] | None = None,
        *,
        transfer: Mapping[str, torch.dtype] | None = None,
        stage: bool | None = None,
        time_copies: bool = False,
        strict: bool | None = None,
    ) -> None:
        if depth < 1:
            raise ConfigError(f"depth must be >= 1, got {depth}")
        dev = resolve_device(device, strict)
        self.loader = loader
        self.device = dev
        self.depth = depth
        self.widen = dict({"tokens": torch.int64} if widen is None else widen)
        knows: Prefetchable | None = loader if isinstance(loader, Prefetchable) else None
        if transfer is None:
            transfer = knows.transfer_dtypes() if knows is not None else {}
        self.transfer = dict(transfer)
        self.stage = dev.type == "cuda" if stage is None else stage
        self.time_copies = time_copies and dev.type == "cuda"
        self._snapshot = _snapshotter(loader)
        # e.g. fed by a coordinator: a broken-off pass is kept, not reloaded from its state
        self._fed = knows is not None and knows.keeps_passes
        self._views = knows is not None and knows.zero_copy
        self._run: _Run | None = None
        self._state: Snapshot | None = None  # as of the last batch handed out, while it differs
        self._suspended: _Run | None = None  # a broken-off pass to continue
        self._stats = LoaderStats(rank=-1)
        self._exported = registry().device(knows.rank if knows is not None else 0)
        self._movers: list[Mover] = []

    def __len__(self) -> int:
        return len(self.loader)  # type: ignore[arg-type]

    def _mover(self) -> Mover:
        if not self.stage:
            return _Pass(self.widen, self._views)
        dev = _Cuda(self.device) if self.device.type == "cuda" else _Host(self.device)
        mover = _Stager(dev, self.depth, self.transfer, self.widen, self.time_copies)
        self._movers.append(mover)
        return mover

    def __iter__(self) -> Iterator[Batch]:
        """A pass over the loader.

        Breaking out of a pass and iterating again delivers nothing twice and loses
        nothing: for a loader whose state says what it handed out (a static
        :class:`~stoker.TokenLoader`, torchdata's StatefulDataLoader) the loader goes
        back to the state of the last batch training took, and what was read ahead
        is read again; a coordinator-fed loader's pass (its batches are confirmed
        as they are read) is kept as it is, read-ahead included, and continued. After
        a whole pass the loader runs its next epoch.
        """
        suspended, self._suspended = self._suspended, None
        if suspended is not None:
            run = suspended
        else:
            self.close()
            start = self._snapshot() if self._snapshot is not None else None
            run = self._run = _Run(self.loader, self._mover, self._snapshot, self.depth)
            self._state = start
        stats = self._stats
        handed: float | None = None
        keep = False
        try:
            while True:
                asked = time.perf_counter()
                item = run.take()
                if item[0] == "error":
                    raise item[1]
                if item[0] != "batch":
                    run.ended = item[0] == "end"
                    return
                _, batch, event, snap = item
                assert run.mover is not None
                run.mover.hand_over(batch, event)
                run.taken += 1
                self._state = snap
                got = time.perf_counter()
                ids, toks = batch.get("sample_id"), batch.get("tokens")
                figures = (
                    len(ids) if isinstance(ids, torch.Tensor) else 0,
                    toks.numel() if isinstance(toks, torch.Tensor) else 0,
                    got - asked,
                    None if handed is None else asked - handed,
                )
                stats.handed(*figures)
                with registry().lock:
                    self._exported.handed(*figures)
                handed = got
                try:
                    yield batch
                except GeneratorExit:
                    keep = self._fed
                    raise
        finally:
            if keep:
                self._suspended = run  # continued by the next pass
            else:
                self._finish(run)

    def _finish(self, run: _Run) -> None:
        run.close()
        if self._run is run:
            self._run = None
            if run.ended:  # a whole pass: nothing read ahead, the loader's own state is exact
                self._state = None
            elif (
                self._state is not None
                and not self._fed
                and callable(getattr(self.loader, "load_state_dict", None))
            ):
                # a pass cut short: the loader goes back to the last batch training took,
                # so its len(), its state and its next pass agree with what was delivered
                self.loader.load_state_dict(self._state())  # type: ignore[attr-defined]

    def suspended_taken(self) -> int | None:
        """Batches training took in a broken-off pass that the next one continues."""
        return None if self._suspended is None else self._suspended.taken

    def close(self) -> None:
        """Stop reading ahead: the thread ends, the staging buffers are freed. A
        coordinator-fed loader's broken-off pass is ended too (what it had read ahead
        was confirmed: continue from a state taken before, see :meth:`state_dict`)."""
        self._suspended = None
        if self._run is not None:
            self._finish(self._run)
        if isinstance(self.loader, Prefetchable):
            self.loader.end_pass()

    def __enter__(self) -> DevicePrefetcher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()

    # -- state -----------------------------------------------------------------
    def snapshot(self) -> Snapshot:
        """The state as of the last batch handed out, made when called."""
        if self._state is not None:
            return self._state
        if self._snapshot is not None:
            return self._snapshot()
        return self.state_dict

    def state_dict(self) -> dict[str, Any]:
        """The loader's state as of the last batch handed out (batches in flight not counted)."""
        if self._state is not None:
            return self._state()
        return self.loader.state_dict()  # type: ignore[attr-defined]

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state`` at the next iteration (a pass in progress is stopped)."""
        self.close()
        self._state = None
        self.loader.load_state_dict(state)  # type: ignore[attr-defined]

    def set_epoch(self, epoch: int) -> None:
        self.close()
        self._state = None
        self.loader.set_epoch(epoch)  # type: ignore[attr-defined]

    # -- figures ---------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        """Wait and step as training sees them (``wait_seconds``, ``step_seconds``,
        ``stall_share``, batches, tokens), plus ``bytes_transferred`` (as they crossed
        the bus), ``bytes_staged`` and ``stage_seconds`` (host copies into pinned
        buffers), ``batches_direct`` (copied straight from the loader's page-locked
        slots, no host copy) and, with ``time_copies``, ``copy_seconds`` and
        ``copy_gbps`` of the device copies. The copy figures count what the prefetch
        thread moved, batches read ahead included."""
        out = self._stats.summary()
        del out["rank"], out["ready_batches"], out["worker_busy_share"]
        out["bytes_transferred"] = sum(m.bytes for m in self._movers)
        out["bytes_staged"] = sum(m.staged_bytes for m in self._movers)
        out["stage_seconds"] = sum(m.stage_seconds for m in self._movers)
        out["batches_direct"] = sum(m.direct for m in self._movers)
        if self.time_copies:
            seconds, nbytes = 0.0, 0
            for m in self._movers:
                for start, end, n in m.copies:
                    end.synchronize()
                    seconds += start.elapsed_time(end) / 1000  # type: ignore[attr-defined]
                    nbytes += n
            out["copy_seconds"] = seconds
            out["copy_gbps"] = nbytes / seconds / 1e9 if seconds > 0 else 0.0
        return out
