"""Write a Megatron indexed dataset with Megatron-LM's own writer (megatron-core's
IndexedDatasetBuilder): ``python _megatron_write.py PREFIX SEED N VOCAB DTYPE``."""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from _megatron_docs import documents


def main() -> int:
    prefix, seed, n, vocab, dtype = sys.argv[1:6]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # its optional accelerators are not installed
        import torch
        from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

    builder = IndexedDatasetBuilder(prefix + ".bin", dtype=getattr(np, dtype))
    for seqs in documents(int(seed), int(n), int(vocab)):
        if not seqs:
            builder.end_document()
            continue
        tokens = torch.from_numpy(np.concatenate(seqs))
        builder.add_document(tokens, [len(s) for s in seqs])
    builder.finalize(prefix + ".idx")
    return 0


if __name__ == "__main__":
    sys.exit(main())
