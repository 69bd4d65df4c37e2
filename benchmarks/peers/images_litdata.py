"""LitData: ``optimize()`` chunks of the JPEG bytes, ``StreamingDataset`` + ``StreamingDataLoader``.

Written with ``litdata.optimize(fn, inputs, chunk_bytes="64MB")`` over the tree's
(path, label) pairs in ImageFolder's order (one worker, ``reorder_files=False``), ``fn``
returning ``{"image": <the file's bytes>, "label": <int>}``: LitData's bytes serializer
stores them as they are, uncompressed. (Handing ``fn``'s image over as a Pillow
``JpegImageFile`` would store the same bytes, but LitData's JPEG serializer then
decodes with ``torchvision.io.decode_jpeg`` to a tensor, another decoder and another
resize than ImageFolder's: not measured.) Read with ``StreamingDataset(input_dir,
shuffle=True, seed=0, transform=...)``, the transform opening the bytes with Pillow
(``convert("RGB")``) and applying RandomResizedCrop(224), RandomHorizontalFlip and
PILToTensor, through ``StreamingDataLoader(batch_size=64, num_workers=n)``.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import litdata
import torch
from litdata import StreamingDataLoader, StreamingDataset, optimize
from PIL import Image

from peers.images_common import BATCH, SEED, samples, transform

KEY = "images_litdata"
LABEL = "LitData"
CHUNK_BYTES = "64MB"
_TF = transform()


def versions() -> dict[str, str]:
    return {"litdata": litdata.__version__, "torch": torch.__version__}


def _item(sample: tuple[str, int]) -> dict[str, Any]:
    path, label = sample
    return {"image": Path(path).read_bytes(), "label": label}


def prepare(folder: Path, out: Path) -> dict[str, Any]:
    inputs = samples(folder)
    optimize(
        fn=_item,
        inputs=inputs,
        output_dir=str(out),
        chunk_bytes=CHUNK_BYTES,
        num_workers=1,
        reorder_files=False,
        start_method="fork",
        verbose=False,
    )
    chunks = len(list(out.glob("*.bin")))
    return {"samples": len(inputs), "layout": f"{chunks} chunks of up to {CHUNK_BYTES}"}


def _decode(item: dict[str, Any]) -> tuple[torch.Tensor, int]:
    image = Image.open(io.BytesIO(item["image"])).convert("RGB")
    return _TF(image), item["label"]


def open_loader(data: str, num_workers: int) -> Any:
    ds = StreamingDataset(input_dir=data, shuffle=True, seed=SEED, transform=_decode)
    return StreamingDataLoader(ds, batch_size=BATCH, num_workers=num_workers)
