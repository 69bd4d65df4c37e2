"""Where the copies run: :class:`_Cuda` (a side stream; events order the consumer
after the copies) and :class:`_Host` (no CUDA: synchronous copies, events that are
complete once issued, :class:`_Done`)."""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from stoker.device.contract import Batch
from stoker.pinned import Event


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
