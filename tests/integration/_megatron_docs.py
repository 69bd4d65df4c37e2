"""The documents of the Megatron conversion tests: random token ids, some documents
of several sequences, some empty, ending with an end-of-document id (as Megatron's
preprocessing with --append-eod writes them)."""

from __future__ import annotations

import numpy as np

EOD = 0


def documents(seed: int, n: int, vocab: int) -> list[list[np.ndarray]]:
    """``n`` documents, each a list of sequences (token arrays)."""
    rng = np.random.default_rng(seed)
    docs = []
    for d in range(n):
        if d % 17 == 5:
            docs.append([])  # a document of no sequence at all
            continue
        seqs = [
            rng.integers(1, vocab, size=int(rng.integers(0, 40)))
            for _ in range(int(rng.integers(1, 4)))
        ]
        seqs[-1] = np.append(seqs[-1], EOD)
        docs.append(seqs)
    return docs
