"""A second, deliberately small kind of data: fixed-size float32 vectors stored as blocks.

It exists to keep the pipeline's seam honest (docs/architecture.md, "The kind of
data"): it plugs into stoker's worker pool, slots, coordinator feed, device tier and
resume through :class:`~stoker.loader.planned.PlannedDataset` alone, a reader and a
layout, with nothing token-specific. A dataset is a directory of ``block-<k>.npy``
files of ``rows_per_block`` rows of ``dim`` float32 each (the last may be shorter).
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import numpy as np
import torch

from stoker import plan
from stoker.loader.batch import Field, Layout
from stoker.loader.planned import PlannedDataset


def write_arrays(path: Path, rows: np.ndarray, rows_per_block: int) -> Path:
    """Store ``rows`` (N, dim) float32 as blocks under ``path``."""
    path.mkdir(parents=True, exist_ok=True)
    for k, lo in enumerate(range(0, len(rows), rows_per_block)):
        np.save(path / f"block-{k:05d}.npy", rows[lo : lo + rows_per_block].astype(np.float32))
    return path


class ArrayReader:
    """Rows by sample id, a block file loaded (memory-mapped) when first needed; only the
    blocks of the planned samples are kept."""

    horizon = 64

    def __init__(self, root: Path, rows_per_block: int, dim: int) -> None:
        self.root, self.rpb = root, rows_per_block
        self.layout = ArrayDataset.layout_for(dim)
        self._blocks: dict[int, np.ndarray] = {}
        self.planned: set[int] = set()
        self.closed = False

    def plan(self, upcoming: np.ndarray) -> None:
        self.planned = set((upcoming // self.rpb).tolist())
        for b in [b for b in self._blocks if b not in self.planned]:
            del self._blocks[b]

    def _block(self, b: int) -> np.ndarray:
        got = self._blocks.get(b)
        if got is None:
            got = self._blocks[b] = np.load(self.root / f"block-{b:05d}.npy", mmap_mode="r")
        return got

    def fill(self, ids: np.ndarray, out: dict[str, np.ndarray]) -> None:
        x = out["x"]
        for i, sid in enumerate(ids.tolist()):
            b, r = divmod(sid, self.rpb)
            x[i] = self._block(b)[r]

    def close(self) -> None:
        self._blocks.clear()
        self.closed = True


class ArrayDataset(PlannedDataset):
    """The vectors at ``root``, shuffled in windows like a token dataset's samples."""

    def __init__(
        self,
        root: str | Path,
        *,
        batch_size: int = 1,
        seed: int = 0,
        shuffle: bool = True,
        rank: int | None = None,
        world_size: int | None = None,
        drop_remainder: bool = False,
    ) -> None:
        super().__init__()
        self.root = Path(root)
        blocks = sorted(self.root.glob("block-*.npy"))
        first = np.load(blocks[0], mmap_mode="r")
        self.rows_per_block, self.dim = int(first.shape[0]), int(first.shape[1])
        last = np.load(blocks[-1], mmap_mode="r")
        self.num_samples = self.rows_per_block * (len(blocks) - 1) + int(last.shape[0])
        self.batch_size = batch_size
        self.shuffle_config = plan.ShuffleConfig(seed, shuffle, 16, 4).resolve(1)
        self.drop_remainder = drop_remainder
        self.rank, self.world_size = rank, world_size
        self.name = str(self.root)
        self._id = hashlib.sha256(str(self.root.resolve()).encode()).hexdigest()[:16]
        self._init_epochs()

    @staticmethod
    def layout_for(dim: int) -> Layout:
        return Layout({"x": Field(torch.float32, (dim,))})

    def identity(self) -> dict[str, Any]:
        c = self.shuffle_config
        return {
            "dataset_id": self._id,
            "num_samples": self.num_samples,
            "dim": self.dim,
            "seed": c.seed,
            "shuffle": c.shuffle,
            "shard_size": c.shard_size,
            "window_shards": c.window_shards,
        }

    @property
    def layout(self) -> Layout:
        return self.layout_for(self.dim)

    def open_reader(self, epoch: int = 0, decoding: int | None = None) -> ArrayReader:
        return ArrayReader(self.root, self.rows_per_block, self.dim)

    def transfer_dtypes(self) -> dict[str, torch.dtype]:
        return {"x": torch.float16}  # what a device tier copies them in (they fit)

    def rows(self) -> np.ndarray:
        """Every stored row, in sample-id order (to check what the pipeline delivers)."""
        return np.concatenate([np.load(p) for p in sorted(self.root.glob("block-*.npy"))])
