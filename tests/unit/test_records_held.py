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
        pil = region(held, (48, 48), box, flip, decoder="pillow")  # Pillow's resize, as asked
        assert np.abs(pil.astype(int) - got.astype(int)).mean() < 10


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


def _stream(batch: object) -> object:
    import pyarrow as pa

    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as w:  # type: ignore[attr-defined]
        w.write_batch(batch)
    return sink.getvalue()


def test_a_held_block_of_other_types_or_negative_sizes_is_refused_named() -> None:
    import pyarrow as pa

    from stoker.errors import DatasetError
    from stoker.records.held import held_schema, read_held

    schema = held_schema(pa.schema([pa.field("label", pa.int64())]), ("label",))

    def batch(pixels, h, w, types=None):  # type: ignore[no-untyped-def]
        t = types or {}
        return pa.RecordBatch.from_arrays(
            [pa.array(pixels, t.get("pixels", pa.large_binary())),
             pa.array(h, t.get("size", pa.int32())), pa.array(w, t.get("size", pa.int32())),
             pa.array([None] * len(h), pa.string()), pa.array([3] * len(h), pa.int64())],
            names=["pixels", "height", "width", "error", "label"],
        )  # fmt: skip

    assert read_held(_stream(batch([b"\1" * 12], [2], [2])), 1, schema, "B").num_rows == 1
    for forged in (
        batch([b"\1" * 3], [-1], [-1]),  # -1 x -1 x 3 = 3 bytes
        batch([b""], [2**40], [2**40], {"size": pa.int64()}),  # wraps to 0 bytes
        batch([b"\1" * 12, b"\1" * 12], [2, 2], [2, 2], {"pixels": pa.binary()}),
        batch([b"\1" * 12], ["2"], ["2"], {"size": pa.string()}),
        batch([b"\1" * 12], [None], [2]),
    ):
        with pytest.raises(DatasetError, match=r"^B: the agent's decoded block"):
            read_held(_stream(forged), forged.num_rows, schema, "B")


@pytest.mark.parametrize("name", ["error", "pixels", "height"])
def test_a_label_named_as_a_held_column_is_a_label(tmp_path, name: str) -> None:  # type: ignore[no-untyped-def]
    import stoker
    from stoker.records.held import HELD, held_rows, prepare_block, read_held

    data = encoded(picture(30, 40), "PNG")
    rows = [{"image": data, name: i} for i in range(3)]
    stoker.write_records(rows, str(tmp_path / "ds"), schema={"image": "binary", name: "int64"})
    # without the agent: the reader prepares the image itself
    ds = stoker.RecordDataset(str(tmp_path / "ds"), image_size=8, batch_size=3, shuffle=False,
                              label_column=name, short_side=20)  # fmt: skip
    assert next(iter(stoker.TokenLoader(ds, 0)))["label"].tolist() == [0, 1, 2]
    # the agent's held block of it, read back
    view = ds.view()
    held, decoded = prepare_block(ds.source.block(0), view)
    assert decoded == 3
    back = read_held(_stream(held), 3, held.schema, "B")
    row = held_rows(back, view.columns)(1)
    assert row[name] == 1 and row[HELD][0].shape == (20, 27, 3) and row[HELD][1] is None


def test_a_view_of_columns_the_dataset_lacks_is_refused() -> None:
    import pyarrow as pa

    schema = pa.schema([("image", pa.binary()), ("label", pa.int64())])
    View(hold="images", columns=("label",)).check(schema, "ds")
    for view in (View(hold="images", image_column="jpeg"), View(hold="images", columns=("y",))):
        with pytest.raises(ConfigError, match="lacks"):
            view.check(schema, "ds")
