"""MosaicML Streaming: MDS shards of 2049-token windows, ``StreamingDataset`` + ``StreamingDataLoader``.

Written with ``MDSWriter(columns={"tokens": "ndarray:uint16:2049"}, compression="zstd")``,
one sample per window ``tokens[i*2048 : i*2048+2049]`` (the floor's and stoker's
samples), default shard size limit (64 MiB before compression). Read with
``StreamingDataset(local=..., shuffle=True, shuffle_seed=0, batch_size=8)`` (default
``py1e`` shuffle) and ``StreamingDataLoader(batch_size=8)``; a collate function stacks
the uint16 windows and widens them to int64 once per batch. Resume: the loader's
``state_dict()`` / ``load_state_dict()``.

Streaming has no HTTP downloader (its remotes are the schemes listed in ``HTTP``), so
there is no cold run over HTTP; ``remote=<local dir>`` with an empty ``local`` cache
is measured instead as its cold path without a network.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import numpy as np
import streaming
import torch
from streaming import MDSWriter, StreamingDataLoader, StreamingDataset
from streaming.base.util import clean_stale_shared_memory

from peers.common import BATCH, WINDOW, Corpus, Ctx

KEY = "mosaic_streaming"
LABEL = "MosaicML Streaming"
VENV = "peers"
HTTP = (
    "none: no http(s) downloader in Streaming (remotes: s3, gs, oci, azure, azure-dl, "
    "dbfs, hf, sftp, alipan, local paths)"
)
COLD_LOCAL = True  # remote=<local dir> + empty local cache
RESUME = "state"


def versions() -> dict[str, str]:
    return {
        "mosaicml-streaming": streaming.__version__,
        "torch": torch.__version__,
        "numpy": np.__version__,
    }


def remotes() -> list[str]:
    from streaming.base.storage.download import DOWNLOADER_MAPPINGS

    return sorted(k or "local path" for k in DOWNLOADER_MAPPINGS)


def prepare(corpus: Corpus, out: Path) -> dict[str, Any]:
    shutil.rmtree(out, ignore_errors=True)
    n = 0
    with MDSWriter(
        out=str(out), columns={"tokens": f"ndarray:uint16:{WINDOW}"}, compression="zstd"
    ) as writer:
        for window in corpus.windows():
            writer.write({"tokens": window})
            n += 1
    return {"samples": n, "remotes": remotes()}


def collate(items: list[dict[str, Any]]) -> torch.Tensor:
    return torch.from_numpy(np.stack([it["tokens"] for it in items]).astype(np.int64))


class Loader:
    def __init__(self, ctx: Ctx) -> None:
        clean_stale_shared_memory()
        if ctx.remote is not None:  # cold: copy shards from remote into an empty cache
            remote, local = ctx.remote, ctx.cache
        else:
            remote, local = None, ctx.data
        self.ds = StreamingDataset(
            remote=remote,
            local=local,
            shuffle=True,
            shuffle_seed=ctx.seed,
            batch_size=BATCH,
        )
        self.dl = StreamingDataLoader(
            self.ds, batch_size=BATCH, num_workers=ctx.num_workers, collate_fn=collate
        )

    def __iter__(self):  # type: ignore[no-untyped-def]
        yield from self.dl

    def state_dict(self) -> dict[str, Any]:
        state = self.dl.state_dict()
        assert state is not None
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.dl.load_state_dict(state)


def open_loader(ctx: Ctx) -> Loader:
    return Loader(ctx)
