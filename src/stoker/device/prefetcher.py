"""The prefetch thread and the public face of the device tier: :class:`_Run` (one pass,
read ahead on its own thread) and :class:`DevicePrefetcher`."""

from __future__ import annotations

import contextlib
import threading
import time
import warnings
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import torch

from stoker.device.backends import _Cuda, _Host
from stoker.device.contract import Batch, Prefetchable, Snapshot, _snapshotter
from stoker.device.placement import resolve_device
from stoker.device.staging import Mover, _Pass, _Stager
from stoker.errors import ConfigError, StokerError
from stoker.observe.registry import LoaderStats, registry

#: Seconds :meth:`DevicePrefetcher.close` waits for the thread to leave ``next(loader)``.
JOIN_TIMEOUT = 60.0


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
