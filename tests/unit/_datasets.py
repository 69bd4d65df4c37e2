"""Small token datasets written with stoker.write_tokens, and the raw facts they hold."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

import stoker


@dataclass
class SmallDataset:
    """A dataset on local disk and the raw facts it was written from."""

    url: str
    docs: list[np.ndarray]
    eos_id: int | None
    vocab_size: int
    manifest: stoker.Manifest

    @property
    def stream(self) -> np.ndarray:
        """The token stream the dataset must hold: documents back to back, EOS after each."""
        parts = []
        for d in self.docs:
            parts.append(np.asarray(d, dtype=np.int64))
            if self.eos_id is not None:
                parts.append(np.asarray([self.eos_id], dtype=np.int64))
        return np.concatenate(parts)

    @property
    def doc_offsets(self) -> np.ndarray:
        """Token offsets where the (non-empty, EOS included) documents start."""
        extra = 1 if self.eos_id is not None else 0
        lengths = np.asarray([len(d) + extra for d in self.docs], dtype=np.int64)
        lengths = lengths[lengths > 0]
        return np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)


def make_docs(
    seed: int, num_docs: int, max_len: int, vocab_size: int, low: int = 1
) -> list[np.ndarray]:
    """Random documents (some empty) with token ids in ``[low, vocab_size)``."""
    rng = np.random.default_rng(seed)
    return [
        rng.integers(low, vocab_size, size=int(rng.integers(0, max_len + 1)), dtype=np.int64)
        for _ in range(num_docs)
    ]


def writer(root: Path) -> Callable[..., SmallDataset]:
    """A ``write(name, ...)`` function that writes datasets under ``root``."""

    def write(
        name: str = "ds",
        *,
        seed: int = 0,
        num_docs: int = 100,
        max_len: int = 300,
        vocab_size: int = 1000,
        eos_id: int | None = 0,
        docs: list[np.ndarray] | None = None,
        **kwargs: object,
    ) -> SmallDataset:
        if docs is None:
            docs = make_docs(seed, num_docs, max_len, vocab_size)
        url = str(root / name)
        kwargs.setdefault("block_tokens", 256)
        manifest = stoker.write_tokens(docs, url, vocab_size=vocab_size, eos_id=eos_id, **kwargs)
        return SmallDataset(url, docs, eos_id, vocab_size, manifest)

    return write
