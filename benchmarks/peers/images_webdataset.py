"""WebDataset: tar shards of the JPEG files, ``WebDataset(...).shuffle(1000).decode("pil")``.

Written with ``wds.ShardWriter`` (1000 samples per shard, uncompressed tar, ImageFolder's
order), a sample being the file's bytes as they are (key ``jpg``: bytes are written
unencoded) and its label (key ``cls``, written as the decimal text). Read as
WebDataset's documentation reads images: ``wds.WebDataset(shards, shardshuffle=100,
seed=0).shuffle(1000, seed=0).decode("pil").to_tuple("jpg", "cls")``, the image
through torchvision's RandomResizedCrop(224), RandomHorizontalFlip and PILToTensor
(``map_tuple``), ``.batched(64)`` in the workers, through ``wds.WebLoader(batch_size=
None, num_workers=n)``; each worker reads its share of the shards (``split_by_worker``).
``decode("pil")`` opens the bytes with Pillow and converts to RGB, as ImageFolder does.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import webdataset as wds

from peers.images_common import BATCH, SEED, samples, transform

KEY = "images_webdataset"
LABEL = "WebDataset"
PER_SHARD = 1000


def versions() -> dict[str, str]:
    return {"webdataset": wds.__version__, "torch": torch.__version__}


def prepare(folder: Path, out: Path) -> dict[str, Any]:
    out.mkdir(parents=True)
    n = 0
    with wds.ShardWriter(str(out / "shard-%05d.tar"), maxcount=PER_SHARD, verbose=0) as sink:
        for i, (path, label) in enumerate(samples(folder)):
            sink.write({"__key__": f"{i:08d}", "jpg": Path(path).read_bytes(), "cls": label})
            n += 1
    shards = len(list(out.glob("*.tar")))
    return {"samples": n, "layout": f"{shards} tar shards of {PER_SHARD} samples"}


def _identity(x: Any) -> Any:
    return x


def open_loader(data: str, num_workers: int) -> Any:
    shards = sorted(str(p) for p in Path(data).glob("*.tar"))
    ds = (
        wds.WebDataset(shards, shardshuffle=100, seed=SEED, empty_check=False)
        .shuffle(1000, seed=SEED)
        .decode("pil")
        .to_tuple("jpg", "cls")
        .map_tuple(transform(), _identity)
        .batched(BATCH, partial=False)
    )
    return wds.WebLoader(ds, batch_size=None, num_workers=num_workers)
