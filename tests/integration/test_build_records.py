"""stoker build-records (stoker.records.build): an ImageFolder tree, WebDataset tar shards,
parquet with a bytes column and jsonl with a path column, each image stored as the bytes
it came in with its label; bad items named, or skipped and counted."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import stoker
from stoker.records.build import build_records

from .helpers import photo_jpeg

CLASSES = ("cat", "dog", "eel")


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("folder") / "train"
    rng = np.random.default_rng(4)
    for c in CLASSES:
        (root / c / "sub").mkdir(parents=True)
        for i in range(6):
            where = root / c / ("sub" if i % 3 == 0 else "") / f"{c}{i}.jpg"
            where.write_bytes(photo_jpeg(rng, 30 + i, 40))
    (root / "dog" / "notes.txt").write_text("not an image, not an image file name")
    return root


def rows_of(url: str) -> list[dict]:
    src = stoker.RecordSource(url)
    return src.rows(range(src.num_rows)).to_pylist()


def test_an_imagefolder_becomes_images_labels_and_paths(folder: Path, tmp_path: Path) -> None:
    stats = build_records(str(folder), str(tmp_path / "ds"), block_bytes=2_000)
    assert stats.rows == 18 and stats.skipped == 0 and stats.manifest is not None
    assert stats.manifest.metadata == {"source": "imagefolder", "classes": list(CLASSES)}
    got = rows_of(str(tmp_path / "ds"))
    files = sorted(p for p in folder.rglob("*.jpg"))
    assert sorted(r["path"] for r in got) == sorted(str(p.relative_to(folder)) for p in files)
    for r in got:
        assert r["image"] == (folder / r["path"]).read_bytes()  # as it came
        assert r["label"] == CLASSES.index(r["path"].split("/")[0])
    ds = stoker.RecordDataset(str(tmp_path / "ds"), image_size=16, batch_size=6)
    batches = list(stoker.TokenLoader(ds, 0))
    assert sum(len(b["label"]) for b in batches) == 18


def test_the_cli_builds_and_names_a_bad_file(folder: Path, tmp_path: Path) -> None:
    bad = tmp_path / "train"
    subprocess.run(["cp", "-r", str(folder), str(bad)], check=True)
    (bad / "eel" / "broken.jpg").write_bytes(b"\xff\xd8 not really")
    run = [sys.executable, "-m", "stoker.cli", "build-records", str(bad), "--out"]
    out = subprocess.run([*run, str(tmp_path / "a"), "--quiet"], capture_output=True, text=True)
    assert out.returncode != 0 and "eel/broken.jpg" in out.stderr
    assert not (tmp_path / "a" / "manifest.json").exists()
    out = subprocess.run([*run, str(tmp_path / "b"), "--quiet", "--on-error", "skip"],
                         capture_output=True, text=True, check=True)  # fmt: skip
    assert "18 images" in out.stdout and "left out 1" in out.stdout and "broken.jpg" in out.stdout
    shown = subprocess.run([sys.executable, "-m", "stoker.cli", "inspect", str(tmp_path / "b")],
                           capture_output=True, text=True, check=True).stdout  # fmt: skip
    assert "0 cat, 1 dog, 2 eel" in shown
    # compression: auto by default (these JPEGs of a few hundred bytes are mostly their
    # headers: zstd is chosen), or as given
    assert stoker.RecordSource(str(tmp_path / "b")).manifest.compression == "zstd"
    subprocess.run([*run, str(tmp_path / "c"), "--quiet", "--on-error", "skip",
                    "--compression", "none"], capture_output=True, check=True)  # fmt: skip
    assert stoker.RecordSource(str(tmp_path / "c")).manifest.compression == "none"


def tar_shard(path: Path, samples: list[tuple[str, dict[str, bytes]]]) -> None:
    """A WebDataset shard as its TarWriter lays one out: a sample's members in a row."""
    with tarfile.open(path, "w") as tf:
        for key, parts in samples:
            for ext, data in parts.items():
                info = tarfile.TarInfo(f"{key}.{ext}")
                info.size = len(data)
                tf.addfile(info, io.BytesIO(data))


def test_webdataset_shards(tmp_path: Path) -> None:
    rng = np.random.default_rng(6)
    shards = tmp_path / "shards"
    shards.mkdir()
    want = []
    for s in range(2):
        samples = []
        for i in range(5):
            key = f"shard{s}/sample{i:03d}"
            img = photo_jpeg(rng, 20, 30)
            label = s * 10 + i
            parts = {"jpg": img, "cls": str(label).encode()} if i % 2 else {
                "jpg": img, "json": json.dumps({"label": label}).encode()}  # fmt: skip
            samples.append((key, parts))
            want.append({"image": img, "label": label, "path": key})
        tar_shard(shards / f"{s:04d}.tar", samples)
    stats = build_records([str(shards)], str(tmp_path / "ds"))
    assert stats.rows == 10 and stats.manifest is not None
    assert stats.manifest.metadata["source"] == "webdataset"
    assert rows_of(str(tmp_path / "ds")) == want
    # a sample without an image member, and one without a label
    tar_shard(shards / "0002.tar", [("x/a", {"cls": b"1"}), ("x/b", {"png": want[0]["image"]})])
    with pytest.raises(stoker.InputError, match=r"0002.tar: sample 'x/a': no image member"):
        build_records([str(shards)], str(tmp_path / "bad"))
    stats = build_records([str(shards)], str(tmp_path / "bad"), on_error="skip")
    assert stats.rows == 10 and stats.skipped == 2
    assert any("'x/b': no label" in e for e in stats.errors)


def test_parquet_bytes_and_jsonl_paths(folder: Path, tmp_path: Path) -> None:
    files = sorted(folder.rglob("*.jpg"))
    table = pa.table({
        "image": [p.read_bytes() for p in files],
        "label": [CLASSES.index(p.relative_to(folder).parts[0]) for p in files],
    })  # fmt: skip
    pq.write_table(table.slice(0, 10), tmp_path / "a.parquet")
    pq.write_table(table.slice(10), tmp_path / "b.parquet")
    build_records([str(tmp_path / "a.parquet"), str(tmp_path / "b.parquet")], str(tmp_path / "p"))
    got = rows_of(str(tmp_path / "p"))
    assert [r["image"] for r in got] == table.column("image").to_pylist()
    assert [r["label"] for r in got] == table.column("label").to_pylist()
    lines = [
        json.dumps({"path": str(p.relative_to(folder.parent)), "label": i % 3})
        for i, p in enumerate(files)
    ]
    (folder.parent / "list.jsonl").write_text("\n".join(lines) + "\n")
    build_records(str(folder.parent / "list.jsonl"), str(tmp_path / "j"))
    got = rows_of(str(tmp_path / "j"))
    assert [r["image"] for r in got] == [p.read_bytes() for p in files]
    assert [r["label"] for r in got] == [i % 3 for i in range(len(files))]


def test_bad_rows_are_named_by_file_and_row(folder: Path, tmp_path: Path) -> None:
    good = json.dumps({"path": "train/cat/cat1.jpg", "label": 0})
    cases = {
        "missing": (json.dumps({"path": "train/cat/nope.jpg", "label": 0}), r"line 2 \(.*nope.jpg\): cannot be read"),
        "no label": (json.dumps({"path": "train/cat/cat1.jpg"}), "line 2: no label"),
        "bad label": (json.dumps({"path": "train/cat/cat1.jpg", "label": "x"}), "line 2: label 'x' is not an integer"),
        "no path": (json.dumps({"label": 1}), "line 2: column 'path' holds no path"),
        "not json": ("{oops", "line 2 is not JSON"),
    }  # fmt: skip
    for name, (line, match) in cases.items():
        src = folder.parent / f"{name.replace(' ', '_')}.jsonl"
        src.write_text(f"{good}\n{line}\n{good}\n")
        with pytest.raises(stoker.InputError, match=match):
            build_records(str(src), str(tmp_path / "x"))
        assert not (tmp_path / "x" / "manifest.json").exists()
    stats = build_records(
        str(folder.parent / "missing.jsonl"), str(tmp_path / "y"), on_error="skip"
    )
    assert stats.rows == 2 and stats.skipped == 1
    pq.write_table(pa.table({"picture": [b"x"], "label": [1]}), tmp_path / "other.parquet")
    with pytest.raises(stoker.InputError, match=r"other.parquet: no column 'image'"):
        build_records(str(tmp_path / "other.parquet"), str(tmp_path / "z"))


def test_a_saved_hugging_face_dataset(folder: Path, tmp_path: Path) -> None:
    datasets = pytest.importorskip("datasets")
    files = sorted(folder.rglob("*.jpg"))
    names = [p.parent.name if p.parent.name != "sub" else p.parent.parent.name for p in files]
    features = datasets.Features(
        {"image": datasets.Image(), "label": datasets.ClassLabel(names=list(CLASSES))}
    )
    hf = datasets.Dataset.from_dict(
        {"image": [{"bytes": p.read_bytes(), "path": None} for p in files],
         "label": [CLASSES.index(n) for n in names]},
        features=features,
    )  # fmt: skip
    hf.save_to_disk(str(tmp_path / "hf"), num_shards=2)  # the library's own writer
    stats = build_records(str(tmp_path / "hf"), str(tmp_path / "ds"))
    assert stats.rows == len(files) and stats.manifest is not None
    assert stats.manifest.metadata == {"source": "hf", "classes": list(CLASSES)}
    got = rows_of(str(tmp_path / "ds"))
    assert [r["image"] for r in got] == [p.read_bytes() for p in files]  # in order, as stored
    assert [r["label"] for r in got] == [CLASSES.index(n) for n in names]
    # the library embeds an image's file when it saves; a row that kept only its path
    # (written otherwise) is read from the path, and a missing file is named
    from stoker.records.build import _hf_item

    kept = _hf_item("x: row 1", {"bytes": None, "path": str(files[0])}, 0, "image")
    assert kept.row is not None and kept.row["image"] == files[0].read_bytes()
    gone = _hf_item("x: row 2", {"bytes": None, "path": str(tmp_path / "gone.jpg")}, 0, "image")
    assert gone.row is None and gone.error is not None and "cannot be read" in gone.error
    assert "gone.jpg" in gone.where
