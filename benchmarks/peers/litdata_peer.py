"""LitData: ``optimize(..., item_loader=TokensLoader())`` chunks, ``StreamingDataset`` + ``StreamingDataLoader``.

Written as in LitData's LLM pre-training guide: ``optimize(fn, inputs,
chunk_size=2049 * 8012, item_loader=TokensLoader())`` where ``fn`` yields each
document's tokens (uint16, EOS included), one worker so the token stream keeps the
corpus order. No compression (the guide uses none; TokensLoader memory-maps chunks).
Read with ``StreamingDataset(input_dir, item_loader=TokensLoader(block_size=2049),
shuffle=True, seed=0)`` and ``StreamingDataLoader(batch_size=8)``; a collate function
stacks the windows and widens them to int64 once per batch. Resume: the loader's
``state_dict()`` / ``load_state_dict()``.

Not the same samples as the others: TokensLoader cuts each chunk into
non-overlapping blocks of 2049 tokens (stride 2049, not 2048) and drops each chunk's
remainder. LitData has no HTTP downloader (see ``HTTP``); its cold path without a
network (``local:<dir>`` copied into an empty cache directory) is measured instead.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import litdata
import numpy as np
import torch
from litdata import StreamingDataLoader, StreamingDataset, TokensLoader, optimize

from peers.common import BATCH, WINDOW, Corpus, Ctx

KEY = "litdata_peer"
LABEL = "LitData"
VENV = "peers"
HTTP = "none: no http(s) downloader in LitData (remotes: s3, gs, azure, hf, r2, local:)"
COLD_LOCAL = True  # local:<dir> + empty cache_dir
RESUME = "state"
CHUNK_SIZE = 2049 * 8012  # tokens per chunk, as in LitData's LLM pre-training guide


def versions() -> dict[str, str]:
    return {"litdata": litdata.__version__, "torch": torch.__version__, "numpy": np.__version__}


_CORPUS: Corpus | None = None


def _tokens_of(span: tuple[int, int]):  # type: ignore[no-untyped-def]
    """Documents [a, b) of the corpus, one array each (runs in optimize's worker)."""
    assert _CORPUS is not None
    toks = _CORPUS.tokens()
    ends = np.cumsum(_CORPUS.doc_lens())
    starts = ends - _CORPUS.doc_lens()
    for d in range(*span):
        yield np.asarray(toks[starts[d] : ends[d]], dtype=np.uint16)


def prepare(corpus: Corpus, out: Path) -> dict[str, Any]:
    global _CORPUS
    shutil.rmtree(out, ignore_errors=True)
    _CORPUS = corpus
    step = max(1, corpus.num_docs // 64)
    spans = [(a, min(a + step, corpus.num_docs)) for a in range(0, corpus.num_docs, step)]
    optimize(
        fn=_tokens_of,
        inputs=spans,
        output_dir=str(out),
        chunk_size=CHUNK_SIZE,
        item_loader=TokensLoader(),
        num_workers=1,
        reorder_files=False,
        start_method="fork",
        verbose=False,
    )
    return {"chunk_size": CHUNK_SIZE}


def collate(items: list[Any]) -> torch.Tensor:
    return torch.from_numpy(np.stack([np.asarray(it) for it in items]).astype(np.int64))


class Loader:
    def __init__(self, ctx: Ctx) -> None:
        kw: dict[str, Any] = {}
        if ctx.remote is not None:  # cold: chunks copied from the "remote" into an empty cache
            input_dir = ctx.remote if ctx.remote.startswith("local:") else f"local:{ctx.remote}"
            kw["cache_dir"] = ctx.cache
        else:
            input_dir = ctx.data
        self.ds = StreamingDataset(
            input_dir=input_dir,
            item_loader=TokensLoader(block_size=WINDOW),
            shuffle=True,
            seed=ctx.seed,
            **kw,
        )
        self.dl = StreamingDataLoader(
            self.ds, batch_size=BATCH, num_workers=ctx.num_workers, collate_fn=collate
        )

    def __iter__(self):  # type: ignore[no-untyped-def]
        yield from self.dl

    def state_dict(self) -> dict[str, Any]:
        return self.dl.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.dl.load_state_dict(state)


def open_loader(ctx: Ctx) -> Loader:
    return Loader(ctx)
