"""An image's random augmentation as a pure function of (seed, epoch, sample id).

Every random choice of a sample's augmentation is drawn from uniforms that are a hash
of ``(seed, epoch, sample id, draw)`` (splitmix64, vectorised over a batch): the same
sample gets the same crop and flip in an epoch whatever the number of ranks, workers
or restarts, so a resumed run is bit-identical to an uninterrupted one, and no
generator state travels anywhere. :func:`crop_box` is torchvision's RandomResizedCrop
rule (ten tries at a random area and aspect ratio, then the centre) on those draws.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from stoker.permutation import derive_key, derive_keys, mix64, mix_array

#: The domain of augmentation keys (apart from the plan's shuffle keys).
_AUGMENT = 0x4155474D
#: Uniforms a sample draws: four for each of the ten crop tries, one for the flip.
DRAWS = 41
_TRIES = 10
_SALTS = np.array([mix64(j + 1) for j in range(DRAWS)], dtype=np.uint64)


def sample_keys(seed: int, epoch: int, ids: np.ndarray) -> np.ndarray:
    """Each sample's 64-bit augmentation key (uint64), from the seed, the epoch and its id."""
    keys: np.ndarray = derive_keys(derive_key(seed, _AUGMENT, epoch), np.asarray(ids, np.int64))
    return keys


def uniforms(keys: np.ndarray, draws: int = DRAWS) -> np.ndarray:
    """``draws`` uniforms in [0, 1) per key, shape ``(len(keys), draws)`` (53-bit)."""
    with np.errstate(over="ignore"):
        k = np.asarray(keys, dtype=np.uint64)[:, None]
        bits = mix_array(k ^ _SALTS[None, :draws])
    out: np.ndarray = (bits >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))
    return out


def batch_uniforms(seed: int, epochs: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """The uniforms of a batch's samples, each of its own epoch: row ``i`` is
    ``uniforms(sample_keys(seed, epochs[i], [ids[i]]))[0]``, in one array operation a
    distinct epoch (a mixture's batch mixes its sources' epochs)."""
    ids, epochs = np.asarray(ids, np.int64), np.asarray(epochs, np.int64)
    distinct = np.unique(epochs)
    if len(distinct) == 1:
        return uniforms(sample_keys(seed, int(distinct[0]), ids))
    keys = np.empty(len(ids), dtype=np.uint64)
    for e in distinct.tolist():
        at = epochs == e
        keys[at] = sample_keys(seed, e, ids[at])
    return uniforms(keys)


def crop_box(
    u: Sequence[float] | np.ndarray,
    width: int,
    height: int,
    scale: tuple[float, float] = (0.08, 1.0),
    ratio: tuple[float, float] = (3 / 4, 4 / 3),
) -> tuple[int, int, int, int]:
    """RandomResizedCrop's box ``(left, top, w, h)`` in an image of ``width x height`` from
    one sample's uniforms ``u`` (:data:`DRAWS` of them): a box of a random share of the
    area (``scale``) and aspect ratio (log-uniform in ``ratio``), placed at random; after
    ten boxes that do not fit, the largest centred box within ``ratio``."""
    area = width * height
    lo, hi = math.log(ratio[0]), math.log(ratio[1])
    for t in range(_TRIES):
        a, r, y, x = u[4 * t : 4 * t + 4]
        target = area * (scale[0] + (scale[1] - scale[0]) * a)
        aspect = math.exp(lo + (hi - lo) * r)
        w = round(math.sqrt(target * aspect))
        h = round(math.sqrt(target / aspect))
        if 0 < w <= width and 0 < h <= height:
            top = min(int(y * (height - h + 1)), height - h)
            left = min(int(x * (width - w + 1)), width - w)
            return left, top, w, h
    in_ratio = width / height
    if in_ratio < ratio[0]:
        w, h = width, round(width / ratio[0])
    elif in_ratio > ratio[1]:
        w, h = round(height * ratio[1]), height
    else:
        w, h = width, height
    return (width - w) // 2, (height - h) // 2, w, h


def flipped(u: Sequence[float] | np.ndarray) -> bool:
    """Whether the sample is flipped left to right (one half of them)."""
    return bool(u[DRAWS - 1] < 0.5)


def centre_box(width: int, height: int, size: int, resize: int) -> tuple[int, int, int, int]:
    """The box of an evaluation crop in the image's own pixels: the image's short side
    resized to ``resize``, then its centre ``size x size`` (ImageNet's 256 / 224)."""
    scale = resize / min(width, height)
    side = min(size / scale, width, height)
    w = h = max(1, round(side))
    return (width - w) // 2, (height - h) // 2, w, h
