"""torchvision: ``datasets.ImageFolder`` over the JPEG files, through torch's ``DataLoader``.

What users have today: no format to write (``prepare`` is None), the tree read as it
is. ``ImageFolder(folder, transform=...)`` opens each file with Pillow (``convert
("RGB")``) and applies RandomResizedCrop(224), RandomHorizontalFlip and PILToTensor;
``DataLoader(batch_size=64, shuffle=True, num_workers=n, persistent_workers=n > 0)``
collates the uint8 (3, 224, 224) tensors.
"""

from __future__ import annotations

from typing import Any

import torch
import torchvision
from torch.utils.data import DataLoader
from torchvision import datasets

from peers.images_common import BATCH, transform

KEY = "images_torchvision"
LABEL = "torchvision"
prepare = None


def versions() -> dict[str, str]:
    return {"torchvision": torchvision.__version__, "torch": torch.__version__}


def open_loader(folder: str, num_workers: int) -> Any:
    ds = datasets.ImageFolder(folder, transform=transform())
    return DataLoader(
        ds,
        batch_size=BATCH,
        shuffle=True,
        num_workers=num_workers,
        persistent_workers=num_workers > 0,
    )
