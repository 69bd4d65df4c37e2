"""stoker's own loader: ``stoker.TokenLoader(TokenDataset(...), batch_size=8, num_workers=nw)``.

Same dataset files as :mod:`peers.stoker_dl` (this adapter writes nothing of its
own). Batches are dicts; the benchmark takes ``batch["tokens"]`` (8, 2049) int64.
Resume through the loader's ``state_dict()`` / ``load_state_dict()``.
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

import stoker
from peers import stoker_dl
from peers.common import BATCH, Corpus, Ctx

KEY = "stoker_loader"
LABEL = "stoker TokenLoader"
VENV = "main"
HTTP = True
COLD_LOCAL = True
RESUME = "state"
SHARES_DATA_WITH = "stoker_dl"


def available() -> str | None:
    """None when stoker has TokenLoader, else why the row is pending."""
    if hasattr(stoker, "TokenLoader"):
        return None
    return f"pending: stoker {stoker.__version__} has no TokenLoader yet"


def versions() -> dict[str, str]:
    v = stoker_dl.versions()
    why = available()
    if why is not None:
        v["pending"] = why
    return v


def prepare(corpus: Corpus, out: Path) -> dict[str, Any]:
    raise RuntimeError("stoker_loader reads the stoker_dl dataset")


class Loader:
    def __init__(self, ctx: Ctx) -> None:
        self.ds = stoker_dl.dataset(ctx)
        kw: dict[str, Any] = {"num_workers": ctx.num_workers}
        if "batch_size" in inspect.signature(stoker.TokenLoader).parameters:
            kw["batch_size"] = BATCH  # else the loader takes the dataset's batch_size (8)
        self.loader = stoker.TokenLoader(self.ds, **kw)

    def __iter__(self):  # type: ignore[no-untyped-def]
        for batch in self.loader:
            yield batch["tokens"]

    def state_dict(self) -> dict[str, Any]:
        return self.loader.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.loader.load_state_dict(state)


def open_loader(ctx: Ctx) -> Loader:
    return Loader(ctx)
