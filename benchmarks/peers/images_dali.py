"""DALI, CPU only: ``fn.readers.file`` over the tree, decoded and cropped by DALI's own operators.

No format to write (``prepare`` is None): ``fn.readers.file(file_root=folder,
random_shuffle=True)`` reads the same files as ImageFolder, its labels the class
folders' indices in sorted order, shuffled through its default buffer of 1024
samples. The pipeline is built with ``device_id=None`` (no GPU is touched) and runs
``fn.decoders.image_random_crop(device="cpu", output_type=RGB)`` (its defaults are
RandomResizedCrop's: area 0.08-1, aspect 3/4-4/3, 10 attempts; it decodes through
nvImageCodec's CPU backend, only the crop's region where it can), ``fn.resize(
resize_x=224, resize_y=224)`` (linear, antialiased), ``fn.flip(horizontal=
fn.random.coin_flip())`` and ``fn.transpose`` to (3, 224, 224), batches of 64, handed
to torch by ``DALIGenericIterator`` (CPU tensors). DALI has no worker processes:
``num_workers`` 0 maps to ``num_threads=1`` (one thread decoding, beside the main
thread that waits for the batch), 2 to ``num_threads=2``.
"""

from __future__ import annotations

from typing import Any

import nvidia.dali as dali
import torch
from nvidia.dali import fn, pipeline_def, types
from nvidia.dali.plugin.pytorch import DALIGenericIterator

from peers.images_common import BATCH, IMAGE_SIZE, SEED

KEY = "images_dali"
LABEL = "DALI (CPU)"
prepare = None


def versions() -> dict[str, str]:
    return {"nvidia-dali-cuda120": dali.__version__, "torch": torch.__version__}


@pipeline_def
def _pipeline(folder: str) -> Any:
    jpegs, labels = fn.readers.file(file_root=folder, random_shuffle=True, name="reader")
    images = fn.decoders.image_random_crop(jpegs, device="cpu", output_type=types.RGB)
    images = fn.resize(images, resize_x=IMAGE_SIZE, resize_y=IMAGE_SIZE)
    images = fn.flip(images, horizontal=fn.random.coin_flip())
    return fn.transpose(images, perm=[2, 0, 1]), labels


class _Loader:
    def __init__(self, folder: str, num_workers: int) -> None:
        threads = max(1, num_workers)
        pipe = _pipeline(folder, batch_size=BATCH, num_threads=threads, device_id=None, seed=SEED)
        self.it = DALIGenericIterator(
            [pipe],
            ["images", "labels"],
            reader_name="reader",
            auto_reset=True,
            prepare_first_batch=False,
        )

    def __iter__(self):  # type: ignore[no-untyped-def]
        for out in self.it:
            yield out[0]["images"], out[0]["labels"].view(-1)


def open_loader(folder: str, num_workers: int) -> _Loader:
    return _Loader(folder, num_workers)
