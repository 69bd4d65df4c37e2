"""Decoding an image's bytes into a fixed-size uint8 RGB array (Pillow).

An image comes out as three channels of uint8 whatever it was stored as: grayscale,
palette, CMYK and images with alpha are converted (alpha dropped), 16-bit ones scaled
to 8 bits; any other mode, an image larger than ``max_pixels`` (a pixel bomb: a
40,000 x 40,000 header decodes into 4.8 GB) and bytes that do not decode are an
:class:`ImageError`. A JPEG is decoded at a reduced size where the output is
smaller than the region it comes from (libjpeg's DCT scaling, through Pillow's
``draft``: 1/2, 1/4 or 1/8 the pixels' side, the region still at least the output's
size), which is most of the time at ImageNet's sizes; the crop and the resize are
then one resampling of the region (``Image.resize(box=...)``).
"""

from __future__ import annotations

import io
import math
import threading
import warnings
from typing import Any

import numpy as np

from stoker.errors import ImageError

#: The largest image decoded (pixels): well above any photograph (ImageNet's largest
#: is about 10M pixels, a 50-megapixel camera's 50M).
MAX_PIXELS = 128 << 20
_SIXTEEN = ("I;16", "I;16B", "I;16L", "I;16N", "I")


def _pil() -> Any:
    try:
        from PIL import Image
    except ImportError as exc:  # pragma: no cover - pillow is in the test environment
        raise ImportError("decoding images needs Pillow: pip install 'stoker[records]'") from exc
    return Image


#: (``warnings.catch_warnings`` changes the process's filters: one decode thread at a time)
_WARNINGS = threading.Lock()


def open_image(data: bytes, max_pixels: int = MAX_PIXELS) -> Any:
    """The image in ``data``, its header read (not yet decoded); ImageError if it is not
    an image or is larger than ``max_pixels`` (or than Pillow's own limit, twice
    ``PIL.Image.MAX_IMAGE_PIXELS``)."""
    Image = _pil()
    try:
        with _WARNINGS, warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            img = Image.open(io.BytesIO(data))
    except Image.DecompressionBombError as exc:
        raise ImageError(f"too large to decode ({exc})") from exc
    except Image.UnidentifiedImageError as exc:
        raise ImageError("not an image Pillow reads (no image format it knows)") from exc
    except Exception as exc:
        raise ImageError(f"not an image Pillow reads ({type(exc).__name__}: {exc})") from exc
    if img.width * img.height > max_pixels:
        raise ImageError(
            f"{img.width} x {img.height} pixels is more than the {max_pixels:,} decoded at most"
        )
    return img


def rgb(img: Any) -> Any:
    """``img`` decoded, as 8-bit RGB (ImageError when it does not decode)."""
    Image = _pil()
    try:
        img.load()
    except Exception as exc:
        raise ImageError(f"does not decode ({type(exc).__name__}: {exc})") from exc
    mode = img.mode
    if mode == "RGB":
        return img
    if mode in _SIXTEEN:  # 16-bit (or 32-bit integer) gray: its top 8 bits of 16
        a = np.asarray(img).astype(np.int64)
        eight = mode == "I" and a.size and int(a.max()) <= 255  # 8-bit values in 32 bits
        b = a if eight else np.clip(a >> 8, 0, 255)
        return Image.fromarray(b.astype(np.uint8), "L").convert("RGB")
    if mode in ("L", "LA", "P", "PA", "RGBA", "RGBX", "CMYK", "YCbCr", "1", "La", "RGBa"):
        try:
            return img.convert("RGB")
        except Exception as exc:
            raise ImageError(f"mode {mode!r} does not convert to RGB ({exc})") from exc
    raise ImageError(f"mode {mode!r} is not converted to RGB (3 x 8-bit channels)")


def decode_region(
    data: bytes,
    size: tuple[int, int],
    box: Any,
    flip: bool = False,
    max_pixels: int = MAX_PIXELS,
) -> np.ndarray:
    """``data``'s image, the region ``box(width, height) -> (left, top, w, h)`` of it
    resized to ``size`` (width, height), flipped left to right when ``flip``: a uint8
    array of shape ``(3, height, width)``."""
    Image = _pil()
    img = open_image(data, max_pixels)
    W, H = img.width, img.height
    left, top, w, h = box(W, H)
    out_w, out_h = size
    if img.format == "JPEG" and w >= 2 * out_w and h >= 2 * out_h:
        # the smallest DCT scale at which the region is still at least the output's size
        img.draft("RGB", (math.ceil(W * out_w / w), math.ceil(H * out_h / h)))
    img = rgb(img)
    sx, sy = img.width / W, img.height / H
    region = (left * sx, top * sy, (left + w) * sx, (top + h) * sy)
    try:
        out = img.resize((out_w, out_h), Image.Resampling.BILINEAR, box=region)
    except Exception as exc:  # pragma: no cover - a decoded RGB image resizes
        raise ImageError(f"does not resize ({exc})") from exc
    a = np.asarray(out)
    if flip:
        a = a[:, ::-1]
    return np.ascontiguousarray(a.transpose(2, 0, 1))
