"""What a batch holds: the seam between a kind of data and the pipeline that moves it.

A dataset's reader declares its batch :class:`Layout`: the name, dtype and
per-row shape of each array a batch holds (``sample_id``, int64, is always
there and is filled by the pipeline). The worker pool allocates its
shared-memory slot rings from the layout, the consumer loop hands the reader
the views of a slot to fill, and the loader hands the caller a dict of those
arrays; nothing between the reader and the caller knows what the arrays mean.
Tokens (:class:`~stoker.loader.dataset.TokenReader`) are one kind; the tests
add a second one to keep the seam honest.

Rows are fixed-size: a layout's shapes do not change within a dataset. A kind
whose samples vary in size (records before a crop, audio) either pads to a
bound it declares or carries its rows out of band (a later kind's concern;
see docs/architecture.md).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import numpy as np
import torch

SAMPLE_ID = "sample_id"


@dataclass(frozen=True)
class Field:
    """One array of a batch: ``dtype`` and the shape of one row."""

    dtype: torch.dtype
    shape: tuple[int, ...] = ()


class Layout(Mapping[str, Field]):
    """The arrays of a batch by name, ``sample_id`` (int64, one per row) included."""

    def __init__(self, fields: Mapping[str, Field]) -> None:
        self._fields = {**dict(fields), SAMPLE_ID: Field(torch.int64)}
        self._np = {k: torch.empty(0, dtype=f.dtype).numpy().dtype for k, f in self._fields.items()}

    def __getitem__(self, name: str) -> Field:
        return self._fields[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._fields)

    def __len__(self) -> int:
        return len(self._fields)

    def __repr__(self) -> str:
        return f"Layout({self._fields!r})"

    def with_dtypes(self, dtypes: Mapping[str, torch.dtype]) -> Layout:
        """The same layout with some fields stored as other dtypes (the dtypes a device
        tier copies them in); names the layout lacks are ignored."""
        return Layout(
            {
                k: Field(dtypes.get(k, f.dtype), f.shape)
                for k, f in self._fields.items()
                if k != SAMPLE_ID
            }
        )

    def row_bytes(self) -> int:
        """Bytes one row takes, all fields together."""
        total = 0
        for f in self._fields.values():
            n = 1
            for d in f.shape:
                n *= d
            total += n * torch.empty((), dtype=f.dtype).element_size()
        return total

    def allocate(self, rows: int) -> dict[str, np.ndarray]:
        """Fresh (uninitialised) arrays for ``rows`` rows, as numpy arrays (numpy's
        allocation costs a fraction of torch's; ``torch.from_numpy`` shares them)."""
        return {k: np.empty((rows, *f.shape), dtype=self._np[k]) for k, f in self._fields.items()}


class Slots:
    """``depth`` batch buffers of ``rows`` rows each, in shared memory, allocated once
    (before the workers fork, so parent and worker see the same pages)."""

    def __init__(self, layout: Layout, depth: int, rows: int) -> None:
        self.layout = layout
        self.arrays = {
            k: torch.zeros((depth, rows, *f.shape), dtype=f.dtype).share_memory_()
            for k, f in layout.items()
        }

        self._numpy = {k: a.numpy() for k, a in self.arrays.items()}

    def view(self, slot: int, n: int) -> dict[str, torch.Tensor]:
        """The first ``n`` rows of slot ``slot``."""
        return {k: a[slot, :n] for k, a in self.arrays.items()}

    def numpy_view(self, slot: int, n: int) -> dict[str, np.ndarray]:
        """The same rows as numpy arrays (what a reader fills)."""
        return {k: a[slot, :n] for k, a in self._numpy.items()}

    def tensors(self) -> list[torch.Tensor]:
        return list(self.arrays.values())
