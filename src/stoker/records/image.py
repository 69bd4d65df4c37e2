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
from stoker.records import jpeg

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
    _within(img.width, img.height, max_pixels)
    return img


def _within(width: int, height: int, max_pixels: int) -> None:
    if width * height > max_pixels:
        raise ImageError(
            f"{width} x {height} pixels is more than the {max_pixels:,} decoded at most"
        )


def image_size(data: bytes, max_pixels: int = MAX_PIXELS) -> tuple[int, int]:
    """``data``'s image's ``(width, height)``: a JPEG's from its frame header, anything
    else's from Pillow; ImageError as :func:`open_image`."""
    head = jpeg.header(data)
    if head is None:
        img = open_image(data, max_pixels)
        return img.width, img.height
    _within(head.width, head.height, max_pixels)
    return head.width, head.height


def _plain_jpeg(data: bytes, max_pixels: int) -> tuple[int, int] | None:
    """The ``(width, height)`` of a whole (its end marker there) 8-bit gray or colour JPEG
    (:attr:`~stoker.records.jpeg.JpegHeader.plain`), what OpenCV decodes, read from its
    header without Pillow (ImageError when too large); None for anything else."""
    if data[-2:] != b"\xff\xd9":  # (cut short: OpenCV would hand it over half grey)
        return None
    head = jpeg.header(data)
    if head is None or not head.plain:
        return None
    _within(head.width, head.height, max_pixels)
    return head.width, head.height


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


DECODERS = ("auto", "opencv", "pillow")
_cv2_module: Any = None


def _cv2() -> Any:
    """OpenCV, when it is installed (one thread of its own: the reader's threads are the
    parallelism), else None."""
    global _cv2_module
    if _cv2_module is None:
        try:
            import cv2

            cv2.setNumThreads(0)  # (none of its own; 1 kept a pool that aborted exits)
            _cv2_module = cv2
        except ImportError:
            _cv2_module = False
    return _cv2_module or None


def decode_region(
    data: bytes,
    size: tuple[int, int],
    box: Any,
    flip: bool = False,
    max_pixels: int = MAX_PIXELS,
    decoder: str = "auto",
    out: np.ndarray | None = None,
) -> np.ndarray:
    """``data``'s image, the region ``box(width, height) -> (left, top, w, h)`` of it
    resized to ``size`` (width, height), flipped left to right when ``flip``: a uint8
    array of shape ``(3, height, width)`` (written into ``out`` when given: one copy of
    the pixels fewer).

    ``decoder``: ``"opencv"`` decodes a whole (RGB or grayscale) JPEG with OpenCV, at a
    reduced size where the region allows (its IMREAD_REDUCED_COLOR_2/4/8), and resizes
    with OpenCV (INTER_AREA where a side shrinks twice or more, else INTER_LINEAR): about
    2.4 times Pillow's rate on one core (docs/benchmarks.md, "JPEG decoders"), Pillow's
    pixels to within a level or two. ``"pillow"`` decodes everything with Pillow
    (``draft``, then one ``resize(box=...)``, BILINEAR). ``"auto"``: OpenCV for those
    JPEGs when it is installed (``stoker[records]`` brings it), Pillow for the rest: other
    formats and modes, and a JPEG that does not end with its end marker (OpenCV would
    hand a cut one over half grey; Pillow names it)."""
    if decoder not in DECODERS:
        raise ValueError(f"decoder must be one of {DECODERS}, got {decoder!r}")
    cv2 = _cv2() if decoder != "pillow" else None
    if cv2 is not None:
        wh = _plain_jpeg(data, max_pixels)
        if wh is not None:
            return _opencv_region(cv2, data, *wh, box(*wh), size, flip, out)
    elif decoder == "opencv":
        raise ImportError("decoder='opencv' needs OpenCV: pip install opencv-python-headless")
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
        resized = img.resize((out_w, out_h), Image.Resampling.BILINEAR, box=region)
    except Exception as exc:  # pragma: no cover - a decoded RGB image resizes
        raise ImageError(f"does not resize ({exc})") from exc
    a = np.asarray(resized)
    if flip:
        a = a[:, ::-1]
    return _chw_into(a, out)


def _opencv_region(
    cv2: Any,
    data: bytes,
    W: int,
    H: int,
    box: tuple[int, int, int, int],
    size: tuple[int, int],
    flip: bool,
    out: np.ndarray | None = None,
) -> np.ndarray:
    """:func:`decode_region` of a whole RGB or grayscale JPEG, by OpenCV."""
    left, top, w, h = box
    out_w, out_h = size
    scale = next((f for f in (8, 4, 2) if w >= f * out_w and h >= f * out_h), 1)
    flags = {1: cv2.IMREAD_COLOR, 2: cv2.IMREAD_REDUCED_COLOR_2,
             4: cv2.IMREAD_REDUCED_COLOR_4, 8: cv2.IMREAD_REDUCED_COLOR_8}  # fmt: skip
    # (EXIF orientation ignored, as Pillow's decode ignores it: the same pixels either way)
    a = cv2.imdecode(np.frombuffer(data, np.uint8), flags[scale] | cv2.IMREAD_IGNORE_ORIENTATION)
    if a is None:
        raise ImageError("does not decode (OpenCV)")
    sx, sy = a.shape[1] / W, a.shape[0] / H
    x0, y0 = int(left * sx), int(top * sy)
    x1 = max(x0 + 1, min(a.shape[1], round((left + w) * sx)))
    y1 = max(y0 + 1, min(a.shape[0], round((top + h) * sy)))
    region = a[y0:y1, x0:x1]
    shrink = region.shape[1] >= 2 * out_w or region.shape[0] >= 2 * out_h
    r = cv2.resize(region, (out_w, out_h),
                   interpolation=cv2.INTER_AREA if shrink else cv2.INTER_LINEAR)  # fmt: skip
    if flip:
        r = cv2.flip(r, 1)
    return _planes_into(cv2, r, out, bgr=True)


def _planes_into(cv2: Any, a: np.ndarray, out: np.ndarray | None, bgr: bool) -> np.ndarray:
    """``a`` (height x width x 3; ``bgr``: OpenCV's channel order) as the planes of a 3 x
    height x width RGB array, into ``out`` when given: ``cv2.split`` writes each plane
    where it goes (a fifth of a transposing copy's time)."""
    if out is None:
        out = np.empty((3, *a.shape[:2]), dtype=np.uint8)
    planes = [out[2], out[1], out[0]] if bgr else [out[0], out[1], out[2]]
    got = cv2.split(a, planes)
    if not np.shares_memory(got[0], out):  # (an OpenCV that made planes of its own)
        np.copyto(out, a[:, :, ::-1].transpose(2, 0, 1) if bgr else a.transpose(2, 0, 1))
    return out


def _chw_into(a: np.ndarray, out: np.ndarray | None) -> np.ndarray:
    """``a`` (height x width x 3) as 3 x height x width, contiguous: into ``out`` (its
    shape) when given."""
    if out is None:
        return np.ascontiguousarray(a.transpose(2, 0, 1))
    np.copyto(out, a.transpose(2, 0, 1))
    return out


def prepare(
    data: bytes,
    short_side: int | None = None,
    max_pixels: int = MAX_PIXELS,
    decoder: str = "auto",
) -> np.ndarray:
    """``data``'s whole image decoded as RGB, its short side resized to ``short_side``
    when it is longer: a uint8 array of shape ``(height, width, 3)``, what the node agent
    holds for every local process (the random part of the augmentation is done on it
    afterwards, by :func:`region`). A JPEG is decoded at a reduced size where its short
    side stays at least ``short_side`` (libjpeg's DCT scaling); the resize is OpenCV's
    (INTER_AREA where a side shrinks twice or more, else INTER_LINEAR: INTER_AREA at a
    ratio under 2 costs more than the decode) or Pillow's BILINEAR. Decoders as for
    :func:`decode_region`."""
    if decoder not in DECODERS:
        raise ValueError(f"decoder must be one of {DECODERS}, got {decoder!r}")
    cv2 = _cv2() if decoder != "pillow" else None
    wh = _plain_jpeg(data, max_pixels) if cv2 is not None else None
    if cv2 is not None and wh is not None:
        W, H = wh
        target = _short_side_size(W, H, short_side)
        f = next((f for f in (8, 4, 2) if min(W, H) >= f * min(target)), 1)
        flags = {1: cv2.IMREAD_COLOR, 2: cv2.IMREAD_REDUCED_COLOR_2,
                 4: cv2.IMREAD_REDUCED_COLOR_4, 8: cv2.IMREAD_REDUCED_COLOR_8}  # fmt: skip
        a = cv2.imdecode(np.frombuffer(data, np.uint8), flags[f] | cv2.IMREAD_IGNORE_ORIENTATION)
        if a is None:
            raise ImageError("does not decode (OpenCV)")
        if (a.shape[1], a.shape[0]) != target:
            shrink = a.shape[1] >= 2 * target[0] or a.shape[0] >= 2 * target[1]
            a = cv2.resize(a, target,
                           interpolation=cv2.INTER_AREA if shrink else cv2.INTER_LINEAR)  # fmt: skip
        # (BGR to RGB: OpenCV's conversion, some 70 times a reversed-axis copy's speed)
        rgb_pixels: np.ndarray = cv2.cvtColor(a, cv2.COLOR_BGR2RGB)
        return rgb_pixels
    if decoder == "opencv" and cv2 is None:
        raise ImportError("decoder='opencv' needs OpenCV: pip install opencv-python-headless")
    img = open_image(data, max_pixels)
    W, H = img.width, img.height
    target = _short_side_size(W, H, short_side)
    if img.format == "JPEG" and target != (W, H):
        img.draft("RGB", target)  # (the smallest DCT scale still at least the target)
    img = rgb(img)
    if (img.width, img.height) != target:
        Image = _pil()
        img = img.resize(target, Image.Resampling.BILINEAR, reducing_gap=None)
    return np.ascontiguousarray(np.asarray(img))


def _short_side_size(width: int, height: int, short_side: int | None) -> tuple[int, int]:
    """``(width, height)`` scaled so that the short side is ``short_side`` (never enlarged)."""
    if short_side is None or min(width, height) <= short_side:
        return width, height
    if width <= height:
        return short_side, max(1, round(height * short_side / width))
    return max(1, round(width * short_side / height)), short_side


def region(
    image: np.ndarray,
    size: tuple[int, int],
    box: Any,
    flip: bool = False,
    decoder: str = "auto",
    out: np.ndarray | None = None,
) -> np.ndarray:
    """The region ``box(width, height) -> (left, top, w, h)`` of a decoded image (an
    ``(height, width, 3)`` uint8 array, from :func:`prepare`) resized to ``size`` (width,
    height) and flipped left to right when ``flip``: shape ``(3, height, width)``. OpenCV
    when it is installed and ``decoder`` is not ``"pillow"`` (INTER_AREA where a side
    shrinks twice or more, else INTER_LINEAR), else Pillow (BILINEAR); into ``out`` when
    given."""
    H, W = image.shape[:2]
    left, top, w, h = box(W, H)
    out_w, out_h = size
    crop = image[top : top + h, left : left + w]
    cv2 = _cv2() if decoder != "pillow" else None
    if cv2 is not None:
        shrink = w >= 2 * out_w or h >= 2 * out_h
        r = cv2.resize(crop, (out_w, out_h),
                       interpolation=cv2.INTER_AREA if shrink else cv2.INTER_LINEAR)  # fmt: skip
        return _planes_into(cv2, cv2.flip(r, 1) if flip else r, out, bgr=False)
    else:
        Image = _pil()
        r = np.asarray(
            Image.fromarray(np.ascontiguousarray(crop)).resize(
                (out_w, out_h), Image.Resampling.BILINEAR
            )
        )
    if flip:
        r = r[:, ::-1]
    return _chw_into(r, out)
