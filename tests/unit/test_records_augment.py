"""An image's augmentation (stoker.records.augment, pure) and its decode into 3 x uint8
(stoker.records.image): every mode converted or named, bad bytes and pixel bombs named."""

from __future__ import annotations

import io
import math
import struct
import zlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from stoker.records import augment
from stoker.records.image import ImageError, decode_region, open_image


def test_draws_are_a_pure_function_of_seed_epoch_and_sample() -> None:
    ids = np.arange(1000)
    a = augment.uniforms(augment.sample_keys(7, 3, ids))
    assert a.shape == (1000, augment.DRAWS) and ((a >= 0) & (a < 1)).all()
    assert (a == augment.uniforms(augment.sample_keys(7, 3, ids))).all()
    assert (a[500:] == augment.uniforms(augment.sample_keys(7, 3, ids[500:]))).all()  # any batch
    for other in (augment.sample_keys(8, 3, ids), augment.sample_keys(7, 4, ids)):
        assert (augment.uniforms(other) != a).mean() > 0.99
    # uniform enough: every draw's mean near 1/2, flips near half
    assert np.abs(a.mean(axis=0) - 0.5).max() < 0.05
    assert 0.45 < np.mean([augment.flipped(u) for u in a]) < 0.55


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 5), st.integers(0, 1 << 40)), min_size=1, max_size=40),
    st.integers(0, 1 << 32),
)
def test_a_batchs_draws_are_each_samples_own(rows: list[tuple[int, int]], seed: int) -> None:
    epochs, ids = np.array(rows, dtype=np.int64).T
    got = augment.batch_uniforms(seed, epochs, ids)
    for (e, i), u in zip(rows, got, strict=True):  # a mixture's rows: each of its own epoch
        assert (u == augment.uniforms(augment.sample_keys(seed, e, np.array([i])))[0]).all()
    box = augment.crop_box(got[0].tolist(), 640, 480)  # (a list, as the reader hands it)
    assert box == augment.crop_box(got[0], 640, 480)


@settings(max_examples=300, deadline=None)
@given(
    w=st.integers(1, 3000),
    h=st.integers(1, 3000),
    key=st.integers(0, (1 << 63) - 1),
)
def test_a_crop_box_lies_in_the_image_within_scale_and_ratio(w: int, h: int, key: int) -> None:
    u = augment.uniforms(np.array([key], dtype=np.uint64))[0]
    left, top, bw, bh = augment.crop_box(u, w, h)
    assert left >= 0 and top >= 0 and bw >= 1 and bh >= 1
    assert left + bw <= w and top + bh <= h
    if (bw, bh) != (w, h) and left == (w - bw) // 2 and top == (h - bh) // 2:
        return  # the fallback: centred, the image's whole width or height
    # a box that fit: its share of the area and its aspect ratio as drawn (rounded)
    share = bw * bh / (w * h)
    side = 1 / min(bw, bh)  # (the rounding of each side, relative)
    assert 0.08 * (1 - side) ** 2 - 1e-9 <= share <= (1 + side) ** 2
    ratio = bw / bh
    slack = 1 / min(bw, bh) + 1 / max(1, min(bw, bh))
    assert 3 / 4 * (1 - slack) - 1e-9 <= ratio <= 4 / 3 * (1 + slack) + 1e-9


def test_the_crop_area_follows_the_scale_on_a_large_image() -> None:
    keys = augment.sample_keys(0, 0, np.arange(4000))
    shares = []
    for u in augment.uniforms(keys):
        _, _, bw, bh = augment.crop_box(u, 1000, 1000)
        shares.append(bw * bh / 1e6)
    shares_a = np.asarray(shares)
    assert shares_a.min() >= 0.075 and shares_a.max() <= 1.0
    # spread over the range (a box of a large share and an extreme aspect does not fit,
    # and is drawn again: fewer large ones)
    assert np.quantile(shares_a, 0.1) < 0.2 and np.quantile(shares_a, 0.9) > 0.75


def test_the_centre_box_is_the_eval_crop() -> None:
    assert augment.centre_box(500, 400, 224, 256) == (0 + (500 - 350) // 2, 25, 350, 350)
    assert augment.centre_box(100, 2000, 224, 256) == (6, 956, 88, 88)


def encoded(a: np.ndarray, fmt: str, mode: str | None = None, **kw: object) -> bytes:
    img = Image.fromarray(a, mode) if mode else Image.fromarray(a)
    out = io.BytesIO()
    img.save(out, format=fmt, **kw)
    return out.getvalue()


def whole(w: int, h: int) -> tuple[int, int, int, int]:
    return 0, 0, w, h


@pytest.mark.parametrize(
    "make",
    [
        lambda a: encoded(a, "JPEG", quality=90),
        lambda a: encoded(a[..., 0], "PNG"),  # grayscale
        lambda a: encoded(np.dstack([a, a[..., :1]]), "PNG"),  # alpha
        lambda a: encoded(a, "PNG"),
        lambda a: encoded(a, "WEBP"),
        lambda a: (lambda img: (lambda o: (img.save(o, "JPEG"), o.getvalue())[1])(io.BytesIO()))(
            Image.fromarray(a).convert("CMYK")
        ),
        lambda a: (lambda img: (lambda o: (img.save(o, "PNG"), o.getvalue())[1])(io.BytesIO()))(
            Image.fromarray(a).convert("P")
        ),
        lambda a: encoded((a[..., 0].astype(np.uint16) * 257), "PNG"),  # 16-bit grayscale
    ],
    ids=["jpeg", "gray", "rgba", "png", "webp", "cmyk", "palette", "16-bit"],
)
def test_every_mode_comes_out_as_three_uint8_channels(make) -> None:
    y, x = np.mgrid[0:40, 0:60]
    a = np.stack([x * 4, y * 6, (x + y) * 2], axis=-1).astype(np.uint8)
    out = decode_region(make(a), (16, 12), whole)
    assert out.shape == (3, 12, 16) and out.dtype == np.uint8
    assert out.std() > 5  # an image, not a constant


def test_a_jpeg_is_decoded_at_a_reduced_size_when_the_output_is_smaller() -> None:
    y, x = np.mgrid[0:800, 0:800]
    a = np.stack([x % 256, y % 256, (x * y) % 256], axis=-1).astype(np.uint8)
    data = encoded(a, "JPEG", quality=90)
    img = open_image(data)
    img.draft("RGB", (100, 100))
    assert img.size == (100, 100)  # libjpeg's 1/8 scale: what decode_region asks for
    small = decode_region(data, (50, 50), whole, decoder="pillow").transpose(1, 2, 0)
    reduced = Image.open(io.BytesIO(data))
    reduced.draft("RGB", (50, 50))  # 1/8: still at least 50 x 50
    want = np.asarray(reduced.convert("RGB").resize((50, 50), Image.Resampling.BILINEAR))
    full = np.asarray(Image.open(io.BytesIO(data)).convert("RGB").resize((50, 50),
                      Image.Resampling.BILINEAR))  # fmt: skip
    assert (small == want).all() and not (small == full).all()  # the reduced decode's pixels
    assert np.abs(small.astype(int) - full.astype(int)).mean() < 40  # and still the image
    # OpenCV's reduced decode and resize: the same picture to within a few levels
    fast = decode_region(data, (50, 50), whole, decoder="opencv").transpose(1, 2, 0)
    assert np.abs(fast.astype(int) - small.astype(int)).mean() < 8


def test_opencv_and_pillow_give_the_same_crop() -> None:
    y, x = np.mgrid[0:300, 0:400]
    a = np.stack([x % 256, y % 256, (x // 3 + y // 2) % 256], axis=-1).astype(np.uint8)
    data = encoded(a, "JPEG", quality=92)
    u = augment.uniforms(augment.sample_keys(1, 2, np.arange(20)))
    for uu in u:
        box = lambda w, h, uu=uu: augment.crop_box(uu, w, h)  # noqa: E731
        flip = augment.flipped(uu)
        cv = decode_region(data, (64, 64), box, flip, decoder="opencv").astype(int)
        pil = decode_region(data, (64, 64), box, flip, decoder="pillow").astype(int)
        assert np.abs(cv - pil).mean() < 6  # the same region, the same way round
    gray = encoded(a[..., 0], "JPEG")
    assert decode_region(gray, (16, 16), whole, decoder="opencv").shape == (3, 16, 16)
    cut = data[: len(data) // 2]  # no end marker: Pillow's decode, which names it
    with pytest.raises(ImageError, match="does not decode"):
        decode_region(cut, (8, 8), whole)


def test_flip_mirrors_the_output() -> None:
    a = np.zeros((20, 20, 3), dtype=np.uint8)
    a[:, :5] = 255
    data = encoded(a, "PNG")
    plain, flipped = (
        decode_region(data, (20, 20), whole),
        decode_region(data, (20, 20), whole, True),
    )
    assert (flipped == plain[:, :, ::-1]).all() and plain[:, :, 0].mean() > 200


def png_header(w: int, h: int) -> bytes:
    """A PNG that claims ``w x h`` pixels and holds almost none of them (a pixel bomb)."""

    def chunk(kind: bytes, body: bytes) -> bytes:
        return (
            struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))
        )

    ihdr = struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0)
    idat = zlib.compress(b"\x00" * 64)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", idat) + chunk(b"IEND", b"")


def test_bad_bytes_truncated_images_and_pixel_bombs_are_named() -> None:
    with pytest.raises(ImageError, match="not an image"):
        decode_region(b"this is not an image", (8, 8), whole)
    a = (np.random.default_rng(0).random((64, 64, 3)) * 255).astype(np.uint8)
    data = encoded(a, "JPEG", quality=90)
    with pytest.raises(ImageError, match="does not decode"):
        decode_region(data[: len(data) // 2], (8, 8), whole)
    with pytest.raises(ImageError, match=r"too large.*1600000000 pixels"):
        decode_region(png_header(40_000, 40_000), (8, 8), whole)
    with pytest.raises(ImageError, match=r"12000 x 12000 pixels is more than the 100,000,000"):
        open_image(png_header(12_000, 12_000), max_pixels=100_000_000)
    assert math.isfinite(decode_region(data, (8, 8), whole).mean())
