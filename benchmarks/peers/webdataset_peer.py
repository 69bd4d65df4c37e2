"""WebDataset: tar shards of 2049-token windows, ``WebDataset(...).shuffle(1000)`` batched to 8.

Written with ``wds.ShardWriter`` (1000 samples per shard, uncompressed tar), one
sample per window ``tokens[i*2048 : i*2048+2049]`` stored as the raw little-endian
uint16 bytes (key ``tok``). Read with ``wds.WebDataset(urls, shardshuffle=100,
seed=0).shuffle(1000, seed=0)``, decoded with ``np.frombuffer``, ``.batched(8)`` and
widened to int64 once per batch, through ``wds.WebLoader(batch_size=None)``.
``shardshuffle=True`` in the task maps to 100 in webdataset 1.0 (it warns and uses
100); the seed makes the stream deterministic. WebDataset has no resume state:
resuming means iterating (and discarding) the batches already consumed. Cold runs
read the shards over HTTP (webdataset pipes ``curl``), with no cache.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch
import webdataset as wds

from peers.common import BATCH, Corpus, Ctx

KEY = "webdataset_peer"
LABEL = "WebDataset"
VENV = "peers"
HTTP = True
RESUME = "skip"
PER_SHARD = 1000


def versions() -> dict[str, str]:
    return {"webdataset": wds.__version__, "torch": torch.__version__, "numpy": np.__version__}


def prepare(corpus: Corpus, out: Path) -> dict[str, Any]:
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    n = 0
    with wds.ShardWriter(str(out / "shard-%05d.tar"), maxcount=PER_SHARD, verbose=0) as sink:
        for i, window in enumerate(corpus.windows()):
            sink.write({"__key__": f"{i:08d}", "tok": window.astype("<u2").tobytes()})
            n += 1
    return {"samples": n, "shards": len(list(out.glob("*.tar")))}


def _decode(sample: dict[str, Any]) -> tuple[np.ndarray]:
    return (np.frombuffer(sample["tok"], dtype="<u2"),)


def _widen(batch: tuple[np.ndarray]) -> torch.Tensor:
    return torch.from_numpy(np.asarray(batch[0]).astype(np.int64))


class Loader:
    def __init__(self, ctx: Ctx) -> None:
        names = sorted(p.name for p in Path(ctx.data).glob("*.tar"))
        if ctx.remote is not None:
            urls = [f"{ctx.remote.rstrip('/')}/{n}" for n in names]
        else:
            urls = [str(Path(ctx.data) / n) for n in names]
        ds = (
            wds.WebDataset(urls, shardshuffle=100, seed=ctx.seed, empty_check=False)
            .shuffle(1000, seed=ctx.seed)
            .map(_decode)
            .batched(BATCH, partial=False)
            .map(_widen)
        )
        self.dl = wds.WebLoader(ds, batch_size=None, num_workers=ctx.num_workers)
        self.skip = 0
        self.consumed = 0

    def __iter__(self):  # type: ignore[no-untyped-def]
        it = iter(self.dl)
        for _ in range(self.skip):  # no resume state: skip ahead by iterating
            next(it)
        self.consumed = self.skip
        for batch in it:
            self.consumed += 1
            yield batch

    def state_dict(self) -> dict[str, Any]:
        return {"skip": self.consumed}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.skip = int(state["skip"])


def open_loader(ctx: Ctx) -> Loader:
    return Loader(ctx)
