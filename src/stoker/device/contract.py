"""What the device tier reads from a loader: :class:`Prefetchable` (rank, passes,
views, snapshots, transfer dtypes), and :func:`_snapshotter`, the state after each
batch of any loader (a ``Prefetchable``'s own, else its ``state_dict()``)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol, runtime_checkable

import torch

Batch = dict[str, Any]
Snapshot = Callable[[], dict[str, Any]]  # the state, made when asked for


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
