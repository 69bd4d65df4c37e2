"""What the node agent holds of a records dataset (stoker.records.held): the view it is
told, an image prepared whole (RGB, short side resized), a crop from held pixels."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from stoker.errors import ConfigError, ImageError
from stoker.records import augment
from stoker.records.held import View
from stoker.records.image import decode_region, prepare, region


def encoded(a: np.ndarray, fmt: str, **kw: object) -> bytes:
    out = io.BytesIO()
    Image.fromarray(a).save(out, format=fmt, **kw)
    return out.getvalue()


def picture(h: int, w: int) -> np.ndarray:
    y, x = np.mgrid[0:h, 0:w]
    return np.stack([x % 256, y % 256, (x // 3 + y // 2) % 256], axis=-1).astype(np.uint8)


@pytest.mark.parametrize("decoder", ["opencv", "pillow"])
@pytest.mark.parametrize(("h", "w", "short", "want"), [
    (300, 400, 100, (100, 133)),  # landscape: the height is the short side
    (400, 300, 100, (133, 100)),
    (300, 400, None, (300, 400)),  # full size
    (60, 80, 100, (60, 80)),  # never enlarged
    (1200, 900, 100, (133, 100)),  # (1/8 of 900 is under 100: decoded at 1/4, then resized)
])  # fmt: skip
def test_an_image_is_prepared_whole_with_its_short_side_resized(
    decoder: str, h: int, w: int, short: int | None, want: tuple[int, int]
) -> None:
    a = picture(h, w)
    got = prepare(encoded(a, "JPEG", quality=92), short, decoder=decoder)
    assert got.shape == (*want, 3) and got.dtype == np.uint8
    ref = np.asarray(Image.fromarray(a).resize((want[1], want[0]), Image.Resampling.BOX))
    assert np.abs(got.astype(int) - ref.astype(int)).mean() < 12  # the picture, smaller


def test_modes_and_bad_bytes_as_for_a_decode_of_a_region() -> None:
    a = picture(40, 60)
    cmyk = io.BytesIO()
    Image.fromarray(a).convert("CMYK").save(cmyk, "JPEG")
    sixteen = encoded(a[..., 0].astype(np.uint16) * 257, "PNG")
    for data in (cmyk.getvalue(), sixteen, encoded(a[..., 0], "PNG")):
        assert prepare(data, 20).shape == (20, 30, 3)
    with pytest.raises(ImageError, match="not an image"):
        prepare(b"not an image at all")
    with pytest.raises(ImageError, match="pixels is more than"):
        prepare(encoded(a, "PNG"), max_pixels=100)


def test_a_crop_from_held_pixels_is_the_crop_of_the_image() -> None:
    a = picture(300, 400)
    data = encoded(a, "JPEG", quality=95)
    held = prepare(data)  # full size: the crop then resamples the same pixels as a decode
    for u in augment.uniforms(augment.sample_keys(3, 1, np.arange(10))):
        box = lambda w, h, u=u: augment.crop_box(u, w, h)  # noqa: E731
        flip = augment.flipped(u)
        got = region(held, (48, 48), box, flip)
        assert got.shape == (3, 48, 48)
        direct = decode_region(data, (48, 48), box, flip, decoder="opencv")
        assert np.abs(got.astype(int) - direct.astype(int)).mean() < 10
        if flip:
            assert (region(held, (48, 48), box, False)[:, :, ::-1] == got).all()


def test_a_view_names_what_it_holds_and_is_read_back_or_refused() -> None:
    v = View(hold="images", short_side=256, columns=("label",))
    assert View.from_json(v.to_json()) == v
    k = v.key("abc123")
    assert k.startswith("abc123.i") and k != View(hold="images", short_side=224).key("abc123")
    assert View().key("abc123") == "abc123"  # its blocks as stored: the dataset's own name
    with pytest.raises(ConfigError, match="hold"):
        View(hold="pixels")
    with pytest.raises(ConfigError, match="short_side"):
        View(hold="images", short_side=0)
    for text in ("[]", '{"hold": "images", "colour": 1}', '{"columns": [3]}', "nope"):
        with pytest.raises(ConfigError, match="not a records view"):
            View.from_json(text)
