"""Write a Hugging Face dataset with the datasets library's own save_to_disk:
``python _hf_write.py DIR SEED N VOCAB SHARDS`` (the documents of _megatron_docs)."""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from _megatron_docs import documents


def main() -> int:
    out, seed, n, vocab, shards = sys.argv[1:6]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import datasets

    docs = [
        np.concatenate(s).tolist() if s else [] for s in documents(int(seed), int(n), int(vocab))
    ]
    ds = datasets.Dataset.from_dict(
        {"text": [f"doc {i}" for i in range(len(docs))], "input_ids": docs}
    )
    ds.save_to_disk(out, num_shards=int(shards))
    return 0


if __name__ == "__main__":
    sys.exit(main())
