"""What the image adapters share: the ImageFolder tree's samples, torchvision's transform.

The tree is benchmarks/image_corpus.py's: ``<folder>/<class>/<n>.jpg``. A sample's label
is its class's index among the class folders sorted by name, and the samples are in
``torchvision.datasets.ImageFolder``'s order (classes sorted, files sorted in each), so
every written format holds the same (bytes, label) pairs as ImageFolder reads.
torchvision is imported here, when an adapter is, so that no adapter's first batch
waits for its import.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from torchvision import transforms

IMAGE_SIZE = 224
BATCH = 64
SEED = 0
EXTENSIONS = (".jpg", ".jpeg")


def classes(folder: str | Path) -> list[str]:
    return sorted(e.name for e in os.scandir(folder) if e.is_dir())


def samples(folder: str | Path) -> list[tuple[str, int]]:
    """(path, label) of every JPEG of the tree, in ImageFolder's order."""
    out = []
    for label, name in enumerate(classes(folder)):
        for root, _dirs, files in sorted(os.walk(Path(folder) / name, followlinks=True)):
            for f in sorted(files):
                if f.lower().endswith(EXTENSIONS):
                    out.append((os.path.join(root, f), label))
    return out


def transform() -> Any:
    """torchvision's RandomResizedCrop(224) + RandomHorizontalFlip + PILToTensor (uint8, CHW)."""
    return transforms.Compose(
        [
            transforms.RandomResizedCrop(IMAGE_SIZE),
            transforms.RandomHorizontalFlip(),
            transforms.PILToTensor(),
        ]
    )


def check_batch(images: Any, labels: Any) -> None:
    """A batch is uint8 images (n, 3, 224, 224) and n labels."""
    import torch

    shape = (3, IMAGE_SIZE, IMAGE_SIZE)
    if not isinstance(images, torch.Tensor) or images.dtype != torch.uint8:
        raise TypeError(f"images are {type(images).__name__} {getattr(images, 'dtype', '')}")
    if tuple(images.shape[1:]) != shape or len(labels) != len(images):
        raise ValueError(f"images {tuple(images.shape)} with {len(labels)} labels")
