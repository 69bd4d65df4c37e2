"""MosaicML Streaming: MDS shards with a ``jpeg`` column, ``StreamingDataset`` + ``StreamingDataLoader``.

Written with ``MDSWriter(columns={"image": "jpeg", "label": "int"})``, no compression,
the default shard size limit (64 MiB), in ImageFolder's order; each image handed over as
the file opened by Pillow (``Image.open(path)``), which MDS's ``jpeg`` encoding stores
as the file's bytes, unchanged (it re-encodes only an image that is not a JPEG file).
Read with a ``StreamingDataset(local=..., shuffle=True, shuffle_seed=0, batch_size=64)``
subclass whose ``__getitem__`` takes the sample (MDS opens the bytes with Pillow)
through ``convert("RGB")``, RandomResizedCrop(224), RandomHorizontalFlip and
PILToTensor (Streaming's documented way to transform samples), and
``StreamingDataLoader(batch_size=64, num_workers=n)``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import streaming
import torch
from PIL import Image
from streaming import MDSWriter, StreamingDataLoader, StreamingDataset
from streaming.base.util import clean_stale_shared_memory

from peers.images_common import BATCH, SEED, samples, transform

KEY = "images_mds"
LABEL = "MosaicML Streaming"


def versions() -> dict[str, str]:
    return {"mosaicml-streaming": streaming.__version__, "torch": torch.__version__}


def prepare(folder: Path, out: Path) -> dict[str, Any]:
    n = 0
    with MDSWriter(out=str(out), columns={"image": "jpeg", "label": "int"}) as writer:
        for path, label in samples(folder):
            with Image.open(path) as image:
                writer.write({"image": image, "label": label})
            n += 1
    shards = len(list(out.glob("*.mds")))
    return {"samples": n, "layout": f"{shards} MDS shards of up to 64 MiB"}


class _Images(StreamingDataset):
    def __init__(self, local: str) -> None:
        super().__init__(local=local, shuffle=True, shuffle_seed=SEED, batch_size=BATCH)
        self.tf = transform()

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        sample = super().__getitem__(i)
        return self.tf(sample["image"].convert("RGB")), sample["label"]


def open_loader(data: str, num_workers: int) -> Any:
    clean_stale_shared_memory()
    return StreamingDataLoader(_Images(data), batch_size=BATCH, num_workers=num_workers)
