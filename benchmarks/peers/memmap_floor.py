"""The floor: np.memmap of the raw token stream and a seeded permutation of samples.

Sample ``i`` is ``tokens[i*2048 : i*2048+2049]``; the epoch order is
``np.random.default_rng(seed).permutation(num_samples)``; a batch is 8 consecutive
entries of that order, gathered with one fancy index and converted with
``torch.from_numpy(rows.astype(np.int64))``. Batches are yielded by a torch
IterableDataset through a DataLoader (``batch_size=None``); with workers, worker
``w`` builds batches ``b`` with ``b % num_workers == w``, so the DataLoader's round
robin gives the same order for any ``num_workers``. Resuming is trivial: the state
is the batch index.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from peers.common import BATCH, SEQ_LEN, WINDOW, Corpus, Ctx

KEY = "memmap_floor"
LABEL = "memmap floor"
VENV = "main"
HTTP = "none: a local file only (np.memmap has no remote path)"
RESUME = "state"


def versions() -> dict[str, str]:
    return {"numpy": np.__version__, "torch": torch.__version__}


def prepare(corpus: Corpus, out: Path) -> dict[str, Any]:
    """Nothing to write: the floor reads the corpus snapshot in place."""
    return {"path": str(corpus.tokens_path), "bytes": corpus.num_tokens * 2}


class _Batches(IterableDataset):  # type: ignore[type-arg]
    def __init__(self, path: str, num_tokens: int, seed: int, start: int) -> None:
        super().__init__()
        self.path, self.num_tokens, self.seed, self.start = path, num_tokens, seed, start
        self.num_samples = (num_tokens - 1) // SEQ_LEN
        self.num_batches = self.num_samples // BATCH

    def __iter__(self):  # type: ignore[no-untyped-def]
        tokens = np.memmap(self.path, dtype="<u2", mode="r", shape=(self.num_tokens,))
        order = np.random.default_rng(self.seed).permutation(self.num_samples)
        offsets = np.arange(WINDOW, dtype=np.int64)
        info = get_worker_info()
        w, nw = (info.id, info.num_workers) if info is not None else (0, 1)
        for b in range(self.start + w, self.num_batches, nw):
            starts = order[b * BATCH : (b + 1) * BATCH].astype(np.int64) * SEQ_LEN
            rows = tokens[starts[:, None] + offsets[None, :]]
            yield torch.from_numpy(rows.astype(np.int64))


class Loader:
    def __init__(self, ctx: Ctx) -> None:
        self.ctx = ctx
        self.start = 0
        self.consumed = 0

    def __iter__(self):  # type: ignore[no-untyped-def]
        ds = _Batches(
            str(self.ctx.corpus.tokens_path), self.ctx.corpus.num_tokens, self.ctx.seed, self.start
        )
        self.consumed = self.start
        for batch in DataLoader(ds, batch_size=None, num_workers=self.ctx.num_workers):
            self.consumed += 1
            yield batch

    def state_dict(self) -> dict[str, int]:
        return {"batch": self.consumed}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.start = int(state["batch"])


def open_loader(ctx: Ctx) -> Loader:
    return Loader(ctx)
