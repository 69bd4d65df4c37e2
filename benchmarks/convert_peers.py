"""The MDS and LitData inputs of ``benchmarks/convert_bench.py`` (runs in ``.venv-peers``):
written by each library's own writer, read whole by its own reader.

Launched by ``convert_bench.py``; not meant to be run by hand::

    .venv-peers/bin/python benchmarks/convert_peers.py version mds|litdata
    .venv-peers/bin/python benchmarks/convert_peers.py write mds|litdata DOCS.npz OUT_DIR
    .venv-peers/bin/python benchmarks/convert_peers.py read mds|litdata DIR

Each prints one JSON object as its last line: ``version`` the library's version (it
fails where the library does not import), ``write`` nothing more, ``read`` the tokens
seen and the seconds the read took, its imports outside the clock (the process's start
and torch's import would otherwise be most of a small read).

* MDS: ``streaming.MDSWriter(columns={"input_ids": "ndarray:int32"})``, one sample a
  document (defaults: no compression, 64 MB shards); read by ``StreamingDataset(local=
  DIR)`` sample by sample (``ds[i]``), single process. Its ``__iter__`` is not timed: it
  hands each sample from a ready thread to a yield loop that polls every 7 ms
  (``streaming.base.constant.TICK``), and on this corpus that waiting, not the reading,
  was most of a pass (docs/benchmarks.md).
* LitData: ``litdata.optimize(..., item_loader=TokensLoader())`` with one worker, each
  document a torch int32 tensor, chunks of 2049 * 8012 tokens as in LitData's LLM
  pre-training guide; read by ``StreamingDataset(DIR, item_loader=TokensLoader(
  block_size=2048))``, every block in order. Its blocks do not cross a chunk's end, so it
  reads each chunk's whole blocks and leaves the rest (under 2,048 tokens a chunk).
"""

from __future__ import annotations

import json
import os
import sys
import time
import warnings
from collections.abc import Iterator
from typing import Any

os.environ.setdefault("LITDATA_DISABLE_VERSION_CHECK", "1")  # no PyPI look-up

import numpy as np

BLOCK = 2048  # LitData's TokensLoader block, a sequence length
CHUNK_TOKENS = 2049 * 8012  # LitData's chunk_size, as in its LLM pre-training guide
_DOCS: Any = None  # the npz that optimize's (forked) worker reads


def version(fmt: str) -> dict[str, Any]:
    import torch

    if fmt == "mds":
        import streaming

        return {"mosaicml-streaming": streaming.__version__, "torch": torch.__version__}
    import litdata

    return {"litdata": litdata.__version__, "torch": torch.__version__}


def _documents(keys: list[str]) -> Iterator[Any]:
    """optimize's function: those documents of the npz, as torch int32 tensors."""
    import torch

    for k in keys:
        yield torch.from_numpy(_DOCS[k])


def write(fmt: str, npz: str, out: str) -> None:
    global _DOCS
    _DOCS = np.load(npz)
    keys = list(_DOCS.files)  # arr_0, arr_1, ...: the corpus's order
    if fmt == "mds":
        from streaming import MDSWriter

        with MDSWriter(out=out, columns={"input_ids": "ndarray:int32"}) as w:
            for k in keys:
                w.write({"input_ids": _DOCS[k]})
        return
    from litdata import TokensLoader, optimize

    optimize(
        fn=_documents,
        inputs=[keys[i : i + 256] for i in range(0, len(keys), 256)],
        output_dir=out,
        chunk_size=CHUNK_TOKENS,
        item_loader=TokensLoader(),
        num_workers=1,  # one worker, inputs in order: the chunks keep the corpus's order
        reorder_files=False,
        start_method="fork",
        verbose=False,
    )


def read(fmt: str, path: str) -> dict[str, Any]:
    n = 0
    if fmt == "mds":
        from streaming import StreamingDataset

        t = time.perf_counter()
        ds = StreamingDataset(local=path, shuffle=False, batch_size=1)
        for i in range(len(ds)):
            n += len(ds[i]["input_ids"])
    else:
        from litdata import StreamingDataset, TokensLoader

        t = time.perf_counter()
        ds = StreamingDataset(path, item_loader=TokensLoader(block_size=BLOCK), shuffle=False)
        for block in ds:
            n += len(block)
    return {"tokens": n, "seconds": time.perf_counter() - t}


def main() -> int:
    cmd, fmt, *args = sys.argv[1:]
    assert fmt in ("mds", "litdata"), fmt
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import torch  # noqa: F401  (both libraries import it; outside any clock)

        res: dict[str, Any] = {}
        if cmd == "version":
            res = version(fmt)
        elif cmd == "write":
            write(fmt, *args)
        else:
            res = read(fmt, *args)
    print(json.dumps(res), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
