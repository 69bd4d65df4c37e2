"""What moves a batch to the device on the prefetch thread: :class:`_Stager` (straight
from a lent, page-locked slot, else through pinned staging buffers, narrowed, then
widened on the device) and :class:`_Pass` (no staging: the loader's batch, widened)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Mapping

import torch

from stoker.device.backends import _Cuda, _Done, _Host
from stoker.device.contract import Batch
from stoker.errors import StokerError
from stoker.pinned import Event, Loan, PinnedPool


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
