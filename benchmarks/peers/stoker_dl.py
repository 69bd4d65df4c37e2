"""stoker through torch's DataLoader: ``TokenDataset`` + ``DataLoader(batch_size=8)``.

Written with ``stoker.write_tokens`` (defaults) from the corpus split into its
documents (EOS already in the stream: ``append_eos=False, eos_id=...``). Read with
``TokenDataset(url, seq_len=2048, batch_size=8, seed=0)`` (defaults otherwise:
shuffle on, doc-start masks on), batched by ``DataLoader(ds, batch_size=8,
num_workers=nw)``; the benchmark takes ``batch["tokens"]``. Resume: the dataset's
``state_dict()`` taken in the main process (num_workers=0) and ``load_state_dict``.
"""

from __future__ import annotations

import inspect
import shutil
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader

import stoker
from peers.common import BATCH, SEQ_LEN, Corpus, Ctx

KEY = "stoker_dl"
LABEL = "stoker TokenDataset + DataLoader"
VENV = "main"
HTTP = True
COLD_LOCAL = True  # local path + empty cache_dir
RESUME = "state"


def versions() -> dict[str, str]:
    import numpy as np

    return {"stoker": stoker.__version__, "torch": torch.__version__, "numpy": np.__version__}


def prepare(corpus: Corpus, out: Path) -> dict[str, Any]:
    shutil.rmtree(out, ignore_errors=True)
    m = stoker.write_tokens(
        corpus.documents(),
        str(out),
        vocab_size=corpus.vocab_size,
        eos_id=corpus.eos_id,
        append_eos=False,
    )
    if m.num_tokens != corpus.num_tokens:
        raise RuntimeError(f"stoker wrote {m.num_tokens} tokens, corpus has {corpus.num_tokens}")
    return {"num_blocks": m.num_blocks, "block_tokens": m.block_tokens}


def dataset(ctx: Ctx) -> stoker.TokenDataset:
    url = ctx.remote if ctx.remote is not None else ctx.data
    # the per-process disk cache: a node agent would be a second process to start and
    # measure; benchmarks/agent_remote.py measures the agent
    kw = {"agent": False} if "agent" in inspect.signature(stoker.TokenDataset).parameters else {}
    return stoker.TokenDataset(
        url, seq_len=SEQ_LEN, batch_size=BATCH, seed=ctx.seed, cache_dir=ctx.cache, **kw
    )


class Loader:
    def __init__(self, ctx: Ctx) -> None:
        self.ds = dataset(ctx)
        self.dl = DataLoader(self.ds, batch_size=BATCH, num_workers=ctx.num_workers)

    def __iter__(self):  # type: ignore[no-untyped-def]
        for batch in self.dl:
            yield batch["tokens"]

    def state_dict(self) -> dict[str, Any]:
        return self.ds.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.ds.load_state_dict(state)


def open_loader(ctx: Ctx) -> Loader:
    return Loader(ctx)
