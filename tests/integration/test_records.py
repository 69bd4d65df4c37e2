"""Records datasets (stoker.write_records, stoker.RecordSource): JPEG bytes and labels
written and read back byte for byte, locally and from nginx one range request a block;
bad rows, bad batches and damaged blocks named; an interrupted write leaves nothing;
``stoker inspect`` and ``stoker verify`` on records."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from PIL import Image

import stoker
from stoker.formats.records import RecordWriter
from stoker.formats.verify import verify

from .helpers import photo_jpeg

SCHEMA = {"image": "binary", "label": "int64", "name": "string"}


@pytest.fixture(scope="module")
def rows() -> list[dict]:
    rng = np.random.default_rng(0)
    return [
        {
            "image": photo_jpeg(rng, int(rng.integers(40, 120)), int(rng.integers(40, 120))),
            "label": i % 7,
            "name": f"class{i % 7}/img{i:04d}.jpg",
        }
        for i in range(240)
    ]


def written(rows: list[dict], path: Path, **kw: object) -> stoker.RecordManifest:
    kw.setdefault("compression", "none")  # (blocks of full-size JPEGs are; these are small)
    return stoker.write_records(rows, str(path), schema=SCHEMA, block_bytes=40_000, **kw)


def test_rows_come_back_byte_for_byte_a_block_at_a_time(rows: list[dict], tmp_path: Path) -> None:
    m = written(rows, tmp_path / "ds")
    assert m.num_rows == len(rows) and m.num_blocks > 5
    assert m.statistics["label"] == {"nulls": 0, "min": 0, "max": 6}
    assert m.statistics["image"]["bytes"] == sum(len(r["image"]) for r in rows)
    # images as they came (never re-encoded): stored bytes barely above the JPEG bytes
    assert m.data_bytes <= 1.02 * sum(len(r["image"]) + len(r["name"]) + 8 for r in rows)
    src = stoker.RecordSource(str(tmp_path / "ds"))
    got = []
    for b in range(src.num_blocks):
        batch = src.block(b)
        assert batch.num_rows == int(src.index[b]["rows"])
        got += batch.to_pylist()
    assert got == rows
    picked = [239, 3, 120, 3, 0]
    assert src.rows(picked).to_pylist() == [rows[i] for i in picked]
    assert src.block_of(np.array([0, 239])).tolist() == [0, src.num_blocks - 1]
    with pytest.raises(IndexError):
        src.block_of(np.array([240]))


def test_arrow_batches_and_compression(rows: list[dict], tmp_path: Path) -> None:
    table = pa.Table.from_pylist(rows, schema=pa.schema([("image", pa.binary()),
                                 ("label", pa.int64()), ("name", pa.string())]))  # fmt: skip
    for comp in ("zstd", "lz4"):
        m = stoker.write_records(
            [table.slice(0, 100), *rows[100:150], table.slice(150).to_batches()[0]],
            str(tmp_path / comp),
            schema=table.schema,
            block_bytes=40_000,
            compression=comp,
        )
        assert m.compression == comp and m.num_rows == len(rows)
        src = stoker.RecordSource(str(tmp_path / comp))
        assert src.rows(range(len(rows))).to_pylist() == rows


CAPTIONS = {"id": "int64", "caption": "string", "score": "double"}
VOCABULARY = (
    "a an the photo picture of on in at with near over under two three red small large old "
    "new dog cat bird people man woman child street house tree river sky city night day "
    "painting drawing view close up white black green blue standing sitting"
)
WORDS = np.array(VOCABULARY.split())


def caption_rows(n: int, seed: int = 0) -> list[dict]:
    """Rows of captions (word salad from a small vocabulary: it compresses as text does)
    and numbers."""
    rng = np.random.default_rng(seed)
    return [
        {"id": i, "caption": " ".join(rng.choice(WORDS, int(rng.integers(5, 30)))),
         "score": float(rng.random())}
        for i in range(n)
    ]  # fmt: skip


def stored_blocks(path: Path) -> list[bytes]:
    src = stoker.RecordSource(str(path))
    return [bytes(src.record(b)) for b in range(src.num_blocks)]


def test_auto_compresses_text_and_leaves_full_size_jpegs_as_they_are(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    jpegs = [{"image": photo_jpeg(rng, 200, 200), "label": i} for i in range(40)]
    cases = {
        "jpeg": (jpegs, {"image": "binary", "label": "int64"}, "none"),
        "text": (caption_rows(3000), CAPTIONS, "zstd"),
    }
    for name, (rows, schema, expect) in cases.items():
        m = {
            comp: stoker.write_records(rows, str(tmp_path / f"{name}-{comp}"), schema=schema,
                                       block_bytes=40_000, compression=comp)
            for comp in ("none", "zstd")
        }  # fmt: skip
        auto = stoker.write_records(rows, str(tmp_path / name), schema=schema, block_bytes=40_000)
        assert auto.compression == expect and auto.num_blocks > 3
        # zstd saves >= 10% of the text's bytes, less of the JPEGs'
        saves = m["zstd"].data_bytes <= 0.9 * m["none"].data_bytes
        assert saves == (expect == "zstd")
        # every block as the chosen setting writes it
        assert stored_blocks(tmp_path / name) == stored_blocks(tmp_path / f"{name}-{expect}")
        src = stoker.RecordSource(str(tmp_path / name))
        assert src.rows(range(len(rows))).to_pylist() == rows


def test_auto_decides_once_on_the_first_block(tmp_path: Path) -> None:
    rng = np.random.default_rng(4)
    schema = {"image": "binary", "caption": "string"}
    jpegs = [{"image": photo_jpeg(rng, 200, 200), "caption": None} for _ in range(20)]
    texts = [{"image": None, "caption": r["caption"]} for r in caption_rows(2000)]
    for name, rows, expect in (("text-first", texts + jpegs, "zstd"),
                               ("jpeg-first", jpegs + texts, "none")):  # fmt: skip
        m = stoker.write_records(rows, str(tmp_path / name), schema=schema, block_bytes=40_000)
        assert m.compression == expect
        stoker.write_records(rows, str(tmp_path / f"{name}-{expect}"), schema=schema,
                             block_bytes=40_000, compression=expect)  # fmt: skip
        assert stored_blocks(tmp_path / name) == stored_blocks(tmp_path / f"{name}-{expect}")
        src = stoker.RecordSource(str(tmp_path / name))
        assert src.rows(range(len(rows))).to_pylist() == rows


def test_the_auto_threshold_is_the_share_zstd_must_save(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from stoker.formats import records

    rng = np.random.default_rng(5)
    rows = [{"image": photo_jpeg(rng, 200, 200), "label": i} for i in range(30)]
    schema = {"image": "binary", "label": "int64"}

    def write(name: str, **kw: object) -> stoker.RecordManifest:
        return stoker.write_records(rows, str(tmp_path / name), schema=schema, **kw)

    plain, packed = write("none", compression="none"), write("zstd", compression="zstd")
    assert plain.num_blocks == packed.num_blocks == 1
    saved = 1 - packed.data_bytes / plain.data_bytes
    assert 0 < saved < records.AUTO_MIN_SAVING
    assert write("auto").compression == "none"
    monkeypatch.setattr(records, "AUTO_MIN_SAVING", saved * 0.9)
    assert write("auto-below", compression="auto").compression == "zstd"
    monkeypatch.setattr(records, "AUTO_MIN_SAVING", saved * 1.1)
    assert write("auto-above").compression == "none"


def test_compression_none_and_a_bad_name(tmp_path: Path) -> None:
    rows = caption_rows(300)
    m = stoker.write_records(rows, str(tmp_path / "a"), schema=CAPTIONS, compression=None)
    assert m.compression == "none"
    with pytest.raises(stoker.InputError, match=r"\['none', 'lz4', 'zstd', 'auto'\], got 'snappy'"):
        stoker.write_records(rows, str(tmp_path / "b"), schema=CAPTIONS, compression="snappy")


def test_each_block_is_one_range_request_from_an_http_origin(
    rows: list[dict], tmp_path: Path, serve_dir
) -> None:
    written(rows, tmp_path / "ds")
    origin, url = serve_dir(tmp_path / "ds")
    src = stoker.RecordSource(url)
    picked = [5, 200, 77]
    assert src.rows(picked).to_pylist() == [rows[i] for i in picked]
    reads = [r for r in origin.access_log() if "/data/" in r.path]
    want = []
    for b in sorted(set(src.block_of(np.array(picked)).tolist())):
        lo = int(src.index[b]["offset"])
        want.append(f"bytes={lo}-{lo + int(src.index[b]['nbytes']) - 1}")
    assert sorted(r.range for r in reads) == sorted(want)


def test_a_damaged_block_is_named_by_file_and_block(rows: list[dict], tmp_path: Path) -> None:
    written(rows, tmp_path / "ds")
    src = stoker.RecordSource(str(tmp_path / "ds"))
    ref = src.manifest.block_file(2)
    f = tmp_path / "ds" / ref.path
    data = bytearray(f.read_bytes())
    data[int(src.index[2]["offset"]) + 100] ^= 0xFF
    f.write_bytes(bytes(data))
    with pytest.raises(stoker.ChecksumError) as info:
        src.block(2)
    assert info.value.block == 2 and info.value.file == ref.path and "block 2" in str(info.value)
    assert src.block(1).num_rows > 0  # the others still read
    report = verify(str(tmp_path / "ds"))
    assert [b.block for b in report.bad] == [2] and "checksum" in report.bad[0].reason
    out = subprocess.run(
        [sys.executable, "-m", "stoker.cli", "verify", str(tmp_path / "ds"), "--quiet"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 1 and "block 2" in out.stdout


def test_a_block_that_is_not_its_datasets_is_refused(rows: list[dict], tmp_path: Path) -> None:
    """A block whose checksum was recomputed over other bytes (or a forged index entry)
    still has to be the dataset's schema and rows."""
    written(rows, tmp_path / "ds")
    src = stoker.RecordSource(str(tmp_path / "ds"))
    other = pa.record_batch([pa.array([1, 2])], names=["x"])
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, other.schema) as w:
        w.write_batch(other)
    with pytest.raises(stoker.DatasetError, match="block 0 has the schema"):
        src.decode(0, sink.getvalue())
    with pytest.raises(stoker.DatasetError, match="not an Arrow IPC stream"):
        src.decode(0, b"garbage" * 10)
    with pytest.raises(stoker.DatasetError, match="the index says one of"):
        src.decode(0, src.record(1))


def test_bad_input_is_named_and_the_write_leaves_nothing(rows: list[dict], tmp_path: Path) -> None:
    out = tmp_path / "ds"
    bad = [*rows[:50], {"image": b"x", "label": "seven", "name": "n"}, *rows[51:]]
    with pytest.raises(stoker.InputError, match=r"row 50, column 'label'"):
        written(bad, out)
    assert not (out / "manifest.json").exists()
    assert not list(out.rglob("*.arrow")) and not list(out.rglob("index-*"))
    with pytest.raises(stoker.InputError, match="row 3: columns \\['extra'\\]"):
        written([*rows[:3], {**rows[3], "extra": 1}], out)
    strict = pa.schema([("image", pa.binary()), ("label", pa.int64(), False)])
    with pytest.raises(stoker.InputError, match="row 2: column 'label' is missing"):
        stoker.write_records(
            [{"image": b"a", "label": 1}, {"image": b"b", "label": 2}, {"image": b"c"}],
            str(out), schema=strict,
        )  # fmt: skip
    wrong = pa.table({"image": pa.array([b"a"]), "label": pa.array([1], pa.int32())})
    with pytest.raises(stoker.InputError, match="column 'label' is int32, the schema's is int64"):
        stoker.write_records([wrong], str(out), schema={"image": "binary", "label": "int64"})
    with pytest.raises(stoker.InputError, match="unknown Arrow type"):
        stoker.write_records([], str(out), schema={"image": "jpeg"})
    with pytest.raises(stoker.InputError, match="no rows"):
        written([], out)
    assert not out.exists() or not any(p.is_file() for p in out.rglob("*"))


def test_an_existing_dataset_is_kept_unless_overwritten(rows: list[dict], tmp_path: Path) -> None:
    first = written(rows[:100], tmp_path / "ds")
    with pytest.raises(stoker.InputError, match="exists"):
        written(rows, tmp_path / "ds")
    assert stoker.RecordSource(str(tmp_path / "ds")).num_rows == 100
    second = written(rows, tmp_path / "ds", overwrite=True)
    assert stoker.RecordSource(str(tmp_path / "ds")).num_rows == len(rows)
    left = {p.name for p in (tmp_path / "ds").rglob("*") if p.is_file()}
    assert not any(first.dataset_id in name for name in left)  # the old files went
    assert any(second.dataset_id in name for name in left)


def test_a_token_reader_on_records_says_what_the_dataset_is(
    rows: list[dict], tmp_path: Path
) -> None:
    written(rows, tmp_path / "ds")
    with pytest.raises(stoker.ManifestError, match="records dataset"):
        stoker.TokenSource(str(tmp_path / "ds"))
    manifest = json.loads((tmp_path / "ds" / "manifest.json").read_text())
    manifest["columns"][0]["name"] = "picture"
    manifest["statistics"]["picture"] = manifest["statistics"].pop("image")
    manifest.pop("decode_xxh64")
    (tmp_path / "ds" / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(stoker.ManifestError, match="does not match the schema"):
        stoker.RecordSource(str(tmp_path / "ds"))


def test_inspect_shows_the_schema_and_a_decoded_sample(rows: list[dict], tmp_path: Path) -> None:
    written(rows, tmp_path / "ds")
    out = subprocess.run(
        [sys.executable, "-m", "stoker.cli", "inspect", str(tmp_path / "ds"), "--offset", "9"],
        capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    with Image.open(io.BytesIO(rows[9]["image"])) as img:
        size = f"{img.width} x {img.height}"
    assert "rows          240" in out.stdout
    assert "column label  int64; 0..6" in out.stdout
    assert f"image: JPEG image, {size} RGB" in out.stdout
    assert "label: 2" in out.stdout and "class2/img0009.jpg" in out.stdout


def test_a_writer_used_as_a_context_aborts_on_error(tmp_path: Path) -> None:
    with (
        pytest.raises(RuntimeError, match="boom"),
        RecordWriter(str(tmp_path / "ds"), SCHEMA, block_bytes=10) as w,
    ):
        for i in range(20):
            w.add({"image": b"x" * 20, "label": i, "name": "n"})
        assert list((tmp_path / "ds").rglob("*.arrow"))  # blocks were written
        raise RuntimeError("boom")
    assert not [p for p in (tmp_path / "ds").rglob("*") if p.is_file()]


def test_a_block_whose_offsets_point_outside_it_is_refused(
    rows: list[dict], tmp_path: Path
) -> None:
    """Arrow's reader checks buffer sizes, not the offsets inside them: a block whose
    checksum was made over forged offsets would hand out other memory (or crash)."""
    written(rows, tmp_path / "ds")
    src = stoker.RecordSource(str(tmp_path / "ds"))
    n = int(src.index[0]["rows"])
    data = pa.py_buffer(b"abcdefgh")
    offsets = np.full(n + 1, 8, dtype=np.int32)
    offsets[:2] = [0, 4000]  # the first image would be 4,000 bytes of whatever lies there
    image = pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(offsets.tobytes()), data])
    names = pa.array(["a"] * n)
    batch = pa.record_batch([image, pa.array(range(n)), names], schema=src.schema)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, src.schema) as w:
        w.write_batch(batch)
    with pytest.raises(stoker.DatasetError, match="not a valid record batch"):
        src.decode(0, sink.getvalue())


def test_a_bad_value_is_named_and_the_rows_stay_in_step(rows: list[dict], tmp_path: Path) -> None:
    w = RecordWriter(str(tmp_path / "ds"), SCHEMA)
    w.add(rows[0])
    with pytest.raises(stoker.InputError, match=r"row 1, column 'image': expected bytes"):
        w.add({"image": 7, "label": 1, "name": "n"})
    w.add(rows[1])  # the refused row left nothing behind
    w.close()
    assert stoker.RecordSource(str(tmp_path / "ds")).rows([0, 1]).to_pylist() == rows[:2]
    strict = pa.schema([("image", pa.binary()), ("label", pa.int64(), False)])
    table = pa.table({"image": [b"a", b"b", b"c"], "label": [1, None, 3]})
    with pytest.raises(stoker.InputError, match="row 1: column 'label' is missing"):
        stoker.write_records([table], str(tmp_path / "t"), schema=strict)


def test_a_failure_after_the_manifest_keeps_the_new_dataset(
    rows: list[dict], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from stoker.storage import Storage

    written(rows[:50], tmp_path / "ds")
    real = Storage.remove

    def refuse(self: Storage, path: str) -> None:
        raise PermissionError(f"{path}: read-only")

    monkeypatch.setattr(Storage, "remove", refuse)
    with pytest.warns(UserWarning, match="was not removed"):
        written(rows, tmp_path / "ds", overwrite=True)
    monkeypatch.setattr(Storage, "remove", real)
    assert stoker.RecordSource(str(tmp_path / "ds")).num_rows == len(rows)  # the new one


def test_a_plan_read_to_its_end_fetches_nothing_again(rows: list[dict], tmp_path: Path) -> None:
    from stoker.records.reader import RecordReader

    written(rows, tmp_path / "ds")
    ds = stoker.RecordDataset(str(tmp_path / "ds"), image_size=8, batch_size=8)
    reader = ds.open_reader(0, decoding=1)
    assert isinstance(reader, RecordReader)
    fetched: list[int] = []
    block = reader.source.block
    reader.source.block = lambda b: (fetched.append(b), block(b))[1]  # type: ignore[method-assign]
    ids = np.arange(100)
    reader.plan(ids)
    out = ds.layout.allocate(100)
    out["sample_id"][...] = ids
    for lo in range(0, 100, 10):
        part = {k: v[lo : lo + 10] for k, v in out.items()}
        reader.fill(ids[lo : lo + 10], part)
    reader.close()
    assert sorted(fetched) == sorted(set(fetched))  # each block once
    assert set(fetched) == set(reader.source.block_of(ids).tolist())


@pytest.mark.parametrize("order", ["forward", "reversed"])
def test_decoding_threads_raise_the_first_bad_row_of_a_batch(
    rows: list[dict], tmp_path: Path, order: str
) -> None:
    # rows 3 and 6 are not images; decoded on two threads (every other row each), the
    # error named is that of the one that comes first in the batch, as row by row
    bad = [dict(r) for r in rows[:10]]
    for i in (3, 6):
        bad[i]["image"] = b"not an image"
    written(bad, tmp_path / "ds")
    ds = stoker.RecordDataset(str(tmp_path / "ds"), image_size=8, batch_size=10)
    ids = np.arange(10) if order == "forward" else np.arange(10)[::-1].copy()
    for decoding in (1, 2):
        reader = ds.open_reader(0, decoding=decoding)
        out = ds.layout.allocate(10)
        with pytest.raises(stoker.ImageError, match=r": row (\d+) ") as info:
            reader.fill(ids, out)
        reader.close()
        assert f": row {3 if order == 'forward' else 6} (block" in str(info.value)
