"""The device tier: :class:`DevicePrefetcher` puts batches on the GPU before training asks.

::

    loader (CPU batches) -- prefetch thread --> pinned staging buffer (PinnedPool)
        -- side CUDA stream --> GPU, narrow dtype -- widened on the side stream --> ready event
    training: next() --> its stream waits on the event --> the batch, already on the GPU

A thread, not a side stream driven from the training thread: pulling a batch
from the loader and copying it into a pinned buffer are host work (a memcpy,
for ``num_workers=0`` the whole decode), and on the training thread they would
sit between two steps however early the copy was issued. On the thread they
overlap the step; the training thread only makes its stream wait on an event
(a GPU-side wait, no host sync). CUDA streams and events may be used from any
thread.

Buffers: a pinned buffer returns to its :class:`PinnedPool` only once the
event recorded after its copy has completed; device tensors are made on the
side stream and ``record_stream``-ed onto the consumer's stream when handed
out, so the caching allocator never reuses them under a running step.

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
``(epoch, batches)`` and the call is made when a state is asked for.

Without CUDA (or with ``device="cpu"``) batches pass through as the loader
gives them (``widen`` applied), still read ahead by the thread, so the
ordering, resume and shutdown logic is the same code on a CPU machine.
"""

from __future__ import annotations

import contextlib
import threading
import time
import warnings
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, Protocol

import torch

from stoker.errors import ConfigError, StokerError
from stoker.metrics import METRICS, LoaderStats

Batch = dict[str, Any]
Key = tuple[tuple[int, ...], torch.dtype]

#: Seconds :meth:`DevicePrefetcher.close` waits for the thread to leave ``next(loader)``.
JOIN_TIMEOUT = 60.0


class Event(Protocol):
    """What the pool needs of a CUDA event: whether it completed, and a wait for it."""

    def query(self) -> bool: ...

    def synchronize(self) -> None: ...


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
        self._busy: deque[tuple[Key, torch.Tensor, Event]] = deque()  # in release order
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
            self._busy.append((entry[0], buf, event))

    def reap(self) -> int:
        """Free the busy buffers whose event completed; how many."""
        done = [e for e in self._busy if e[2].query()]
        if done:
            self._busy = deque(e for e in self._busy if not any(e is d for d in done))
        for key, buf, _ in done:
            self._free.setdefault(key, []).append(buf)
        return len(done)

    def wait(self) -> bool:
        """Wait for the oldest busy buffer's event and free what completed; False if none is busy."""
        if not self._busy:
            return False
        self._busy[0][2].synchronize()
        self.reap()
        return True

    def close(self) -> None:
        """Wait for every copy in flight and drop all buffers (held ones stay the holder's)."""
        while self.wait():
            pass
        self._free.clear()
        self._held.clear()


def narrow_dtype(vocab_size: int) -> torch.dtype | None:
    """The narrowest dtype holding token ids ``[0, vocab_size)``; None if int64 is needed."""
    if vocab_size <= 1 << 8:
        return torch.uint8
    if vocab_size <= 1 << 16:
        return torch.uint16
    if vocab_size <= 1 << 31:
        return torch.int32
    return None


def _auto_transfer(loader: Any) -> dict[str, torch.dtype]:
    """``tokens`` narrowed to what the loader's dataset vocabulary needs, if it has one."""
    manifest = getattr(getattr(loader, "dataset", None), "manifest", None)
    vocab = getattr(manifest, "vocab_size", None)
    narrow = narrow_dtype(vocab) if isinstance(vocab, int) and vocab > 0 else None
    return {"tokens": narrow} if narrow is not None else {}


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


class _Stager:
    """Moves a batch through pinned buffers to the device (runs on the prefetch thread)."""

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
        self.bytes = 0  # bytes that crossed the bus
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

    def move(self, batch: Batch) -> tuple[Batch, Event]:
        """Stage, copy and widen ``batch``; the event orders a consumer after all of it."""
        if self.pool is None:  # sized by the first batch: depth + 1 batches in flight
            n = sum(isinstance(v, torch.Tensor) for v in batch.values())
            self.pool = PinnedPool((self.depth + 1) * max(1, n), pin=self.dev.pin)
        t = time.perf_counter()
        staged: dict[str, torch.Tensor] = {}
        for k, v in batch.items():
            if isinstance(v, torch.Tensor):
                staged[k] = buf = self._buffer(v.shape, self.transfer.get(k, v.dtype))
                buf.copy_(v)  # narrowed here when the transfer dtype is narrower
        self.stage_seconds += time.perf_counter() - t
        out: Batch = {}
        with self.dev.side():
            start = self.dev.record(True) if self.timed else None
            # the copies back to back; copy=True: on the host .to() would return the buffer
            moved = {
                k: buf.to(self.dev.device, non_blocking=True, copy=True)
                for k, buf in staged.items()
            }
            copied = self.dev.record(self.timed)  # the staging buffers are free after this
            widened = False
            for k, v in batch.items():
                if k not in staged:
                    out[k] = v
                    continue
                wide = self.widen.get(k, v.dtype)
                out[k] = moved[k] if moved[k].dtype == wide else moved[k].to(wide)
                widened = widened or out[k] is not moved[k]
            ready = self.dev.record(False) if widened else copied
        for buf in staged.values():
            self.pool.release(buf, copied)
        nbytes = sum(buf.numel() * buf.element_size() for buf in staged.values())
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
        self.copies: list[tuple[Event, Event, int]] = []
        self.pool: PinnedPool | None = None

    def move(self, batch: Batch) -> tuple[Batch, Event]:
        out: Batch = {}
        for k, v in batch.items():
            if isinstance(v, torch.Tensor):
                wide = self.widen.get(k, v.dtype)
                if v.dtype != wide:
                    v = v.to(wide)
                elif self.views:  # zero_copy: valid only until the next batch is asked for
                    v = v.clone()
            out[k] = v
        return out, _Done()

    def hand_over(self, batch: Batch, event: Event) -> None:
        pass

    def close(self) -> None:
        pass


Mover = _Stager | _Pass
Snapshot = Callable[[], dict[str, Any]]  # the state, made when asked for


def _snapshotter(loader: Any) -> Callable[[], Snapshot] | None:
    """How to capture the loader's state cheaply after each batch it hands out."""
    if not callable(getattr(loader, "state_dict", None)):
        return None
    if getattr(loader, "coordinator", None) is not None and hasattr(loader, "last_epoch"):
        return lambda: _coordinator_snapshot(loader)

    def eager() -> Snapshot:
        state = loader.state_dict()
        return lambda: dict(state)

    return eager


def _coordinator_snapshot(loader: Any) -> Snapshot:
    """A coordinator-fed TokenLoader's state is a Checkpoint call at the rank's batch count:
    keep the count, make the call when a state is asked for."""
    from stoker.loader.fast import _DYNAMIC

    ep = loader.last_epoch
    if ep is None or ep.epoch is None:
        state = loader.state_dict()  # nothing handed out yet: no call made
        return lambda: dict(state)
    epoch, batches = int(ep.epoch), int(ep.batches)

    def make() -> dict[str, Any]:
        name, snapshot = loader._coordinator().checkpoint(epoch, batches)
        return {
            **_DYNAMIC,
            "epoch": epoch,
            "batches": batches,
            "checkpoint": name,
            "snapshot": snapshot,
        }

    return make


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
    forces the pinned-pool path there too, with host copies standing in for
    the transfers (tests, benchmarks).

    ``next()`` waits for a batch as long as the loader lets it (a
    :class:`~stoker.TokenLoader` raises after its ``timeout``); a loader's
    error reaches the training loop after the batches before it.

    :meth:`state_dict` counts the batches training took, not those in flight;
    take the state from the prefetcher, not from the loader (which counts
    what the prefetcher pulled). :meth:`close` (or leaving a ``with`` block,
    breaking out of the loop, an exception in it) stops the thread, stops the
    loader's pass and frees the staging buffers.

    :meth:`stats` gives the wait as training sees it. It is not exported to
    Prometheus: the loader's own figures (``METRICS.loader``) are then taken at
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
    ) -> None:
        if depth < 1:
            raise ConfigError(f"depth must be >= 1, got {depth}")
        cuda = torch.cuda.is_available()
        dev = torch.device(device if device is not None else ("cuda" if cuda else "cpu"))
        if dev.type == "cuda" and not cuda:
            dev = torch.device("cpu")  # the same script runs on a machine without a GPU
        if dev.type == "cuda" and dev.index is None:
            dev = torch.device("cuda", torch.cuda.current_device())
        if dev.type not in ("cuda", "cpu"):
            raise ConfigError(f"device must be a CUDA device or cpu, got {dev}")
        self.loader = loader
        self.device = dev
        self.depth = depth
        self.widen = dict({"tokens": torch.int64} if widen is None else widen)
        self.transfer = dict(_auto_transfer(loader) if transfer is None else transfer)
        self.stage = dev.type == "cuda" if stage is None else stage
        self.time_copies = time_copies and dev.type == "cuda"
        self._snapshot = _snapshotter(loader)
        self._run: _Run | None = None
        self._state: Snapshot | None = None  # as of the last batch handed out, while it differs
        self._stats = LoaderStats(rank=-1)
        placement = getattr(getattr(loader, "dataset", None), "_placement", None)
        self._exported = METRICS.device(placement().rank if callable(placement) else 0)
        self._movers: list[Mover] = []

    def __len__(self) -> int:
        return len(self.loader)  # type: ignore[arg-type]

    def _mover(self) -> Mover:
        if not self.stage:
            views = bool(getattr(self.loader, "zero_copy", False))
            return _Pass(self.widen, views)
        dev = _Cuda(self.device) if self.device.type == "cuda" else _Host(self.device)
        mover = _Stager(dev, self.depth, self.transfer, self.widen, self.time_copies)
        self._movers.append(mover)
        return mover

    def __iter__(self) -> Iterator[Batch]:
        self.close()
        start = self._snapshot() if self._snapshot is not None else None
        run = self._run = _Run(self.loader, self._mover, self._snapshot, self.depth)
        self._state = start
        stats = self._stats
        handed: float | None = None
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
                with METRICS.lock:
                    self._exported.handed(*figures)
                handed = got
                yield batch
        finally:
            self._finish(run)

    def _finish(self, run: _Run) -> None:
        run.close()
        if self._run is run:
            self._run = None
            if run.ended:  # a whole pass: nothing read ahead, the loader's own state is exact
                self._state = None

    def close(self) -> None:
        """Stop reading ahead: the thread ends, the staging buffers are freed."""
        if self._run is not None:
            self._finish(self._run)

    def __enter__(self) -> DevicePrefetcher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()

    # -- state -----------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The loader's state as of the last batch handed out (batches in flight not counted)."""
        if self._state is not None:
            return self._state()
        return self.loader.state_dict()  # type: ignore[attr-defined,no-any-return]

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
        the bus), ``stage_seconds`` (host copies into pinned buffers) and, with
        ``time_copies``, ``copy_seconds`` and ``copy_gbps`` of the device copies."""
        out = self._stats.summary()
        del out["rank"], out["ready_batches"], out["worker_busy_share"]
        out["bytes_transferred"] = sum(m.bytes for m in self._movers)
        out["stage_seconds"] = sum(m.stage_seconds for m in self._movers)
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
