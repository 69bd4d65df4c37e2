"""stoker.records.jpeg: a JPEG's frame header, read as Pillow reads it, without Pillow."""

from __future__ import annotations

import io
import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from stoker.records import image, jpeg
from stoker.records.image import ImageError, decode_region

COMPONENTS = {"L": 1, "RGB": 3, "CMYK": 4}


def photo(w: int = 90, h: int = 70) -> np.ndarray:
    y, x = np.mgrid[0:h, 0:w]
    return np.stack([x * 3 % 256, y * 5 % 256, (x + y) % 256], axis=-1).astype(np.uint8)


def saved(img: Image.Image, **kw: object) -> bytes:
    out = io.BytesIO()
    img.save(out, "JPEG", **kw)
    return out.getvalue()


def segment(marker: int, body: bytes) -> bytes:
    return bytes([0xFF, marker]) + struct.pack(">H", len(body) + 2) + body


def after_soi(data: bytes, extra: bytes) -> bytes:
    return data[:2] + extra + data[2:]


KINDS = {
    "baseline": lambda: saved(Image.fromarray(photo()), quality=90),
    "progressive": lambda: saved(Image.fromarray(photo(123, 45)), progressive=True),
    "optimized 4:4:4": lambda: saved(Image.fromarray(photo()), optimize=True, subsampling=0),
    "gray": lambda: saved(Image.fromarray(photo()[..., 0])),
    "cmyk": lambda: saved(Image.fromarray(photo(33, 77)).convert("CMYK")),
    "icc profile": lambda: saved(Image.fromarray(photo()), icc_profile=b"\x00" * 70_000),
    # an EXIF block holding a thumbnail: a JPEG of its own, another size, skipped whole
    "exif thumbnail": lambda: after_soi(
        saved(Image.fromarray(photo(200, 150))),
        segment(0xE1, b"Exif\x00\x00" + saved(Image.fromarray(photo(16, 12)))),
    ),
    # fill bytes before a marker, and a marker with no length (RST0) before the frame
    "fill and standalone": lambda: after_soi(
        saved(Image.fromarray(photo(64, 48))), b"\xff\xff\xff\xd0"
    ),
}


@pytest.mark.parametrize("kind", KINDS)
def test_the_header_says_what_pillow_says(kind: str) -> None:
    data = KINDS[kind]()
    img = Image.open(io.BytesIO(data))
    head = jpeg.header(data)
    assert head is not None
    assert (head.width, head.height) == img.size
    assert head.components == COMPONENTS[img.mode]
    assert head.precision == 8
    assert head.marker == (0xC2 if kind == "progressive" else 0xC0)
    assert head.plain == (img.mode in ("L", "RGB"))
    assert image.image_size(data) == img.size


def frame(width: int, height: int, precision: int = 8, components: int = 3) -> bytes:
    body = struct.pack(">BHHB", precision, height, width, components)
    return segment(0xC0, body + b"".join(bytes([c + 1, 0x11, 0]) for c in range(components)))


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"\xff\xd8",
        b"\x89PNG\r\n\x1a\n" + b"\x00" * 40,
        b"\xff\xd8" + segment(0xE0, b"JFIF\x00") + b"junk" + frame(10, 10),  # bytes between
        b"\xff\xd8" + segment(0xDA, b"\x00" * 8) + frame(10, 10),  # a scan before the frame
        b"\xff\xd8\xff\xd9" + frame(10, 10),  # the image ends before its frame
        b"\xff\xd8" + frame(10, 0),  # its height left to a DNL marker
        b"\xff\xd8\xff\xe0\x00\x01" + frame(10, 10),  # a length shorter than itself
        b"\xff\xd8\xff\x00" + frame(10, 10),  # a stuffed zero where a marker goes
        b"\xff\xd8" + frame(10, 10)[:8],  # the frame header cut short
    ],
    ids=["empty", "soi", "png", "junk", "scan first", "eoi", "dnl", "length", "zero", "cut"],
)
def test_what_the_walk_does_not_recognise_is_none(data: bytes) -> None:
    assert jpeg.header(data) is None


def test_twelve_bit_samples_are_not_plain_and_fail_by_name() -> None:
    head = jpeg.header(b"\xff\xd8" + frame(10, 20, precision=12))
    assert head == jpeg.JpegHeader(10, 20, 3, 12, 0xC0) and not head.plain
    data = bytearray(saved(Image.fromarray(photo())))
    sof = data.index(b"\xff\xc0")
    data[sof + 4] = 12  # the same file claiming 12-bit samples
    with pytest.raises(ImageError):
        decode_region(bytes(data), (8, 8), lambda w, h: (0, 0, w, h))


REAL = saved(Image.fromarray(photo(120, 80)), quality=85)
FRAME_END = REAL.index(b"\xff\xc0") + 10


@settings(max_examples=300, deadline=None)
@given(st.integers(0, len(REAL)))
def test_a_cut_file_has_no_header_until_the_frame_header_is_whole(n: int) -> None:
    head = jpeg.header(REAL[:n])
    assert head == (jpeg.header(REAL) if n >= FRAME_END else None)


@settings(max_examples=500, deadline=None)
@given(st.integers(0, FRAME_END - 1), st.integers(0, 255))
def test_a_changed_byte_before_the_frame_never_raises(at: int, value: int) -> None:
    data = bytearray(REAL)
    data[at] = value
    head = jpeg.header(bytes(data))
    assert head is None or isinstance(head, jpeg.JpegHeader)


def test_a_plain_jpeg_decodes_without_pillow_opening_it(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("cv2")

    def refused(*a: object, **kw: object) -> None:
        raise AssertionError("Pillow opened a plain JPEG")

    monkeypatch.setattr(image, "open_image", refused)
    out = decode_region(REAL, (32, 32), lambda w, h: (10, 5, w - 20, h - 10), True)
    assert out.shape == (3, 32, 32) and out.std() > 5
    assert image.prepare(REAL, 40).shape == (40, 60, 3)


def test_a_jpeg_pixel_bomb_is_named_from_its_header() -> None:
    bomb = b"\xff\xd8" + frame(40_000, 40_000) + segment(0xDA, b"\x00" * 8) + b"\xff\xd9"
    # named from the header on OpenCV's path, by Pillow's own check on Pillow's
    for decoder, named in (("auto", r"40000 x 40000 pixels is more"), ("pillow", r"too large")):
        with pytest.raises(ImageError, match=named):
            decode_region(bomb, (8, 8), lambda w, h: (0, 0, w, h), decoder=decoder)
    with pytest.raises(ImageError, match=r"40000 x 40000 pixels is more than"):
        image.image_size(bomb)
