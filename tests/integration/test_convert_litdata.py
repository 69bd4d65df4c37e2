"""`stoker convert` from LitData optimized directories written by LitData's own writer
(litdata.optimize with TokensLoader; fixtures committed with the script that made them,
tests/fixtures/peers/make_litdata.py): token for token, a document an item, int32 and
int64 tensors, chunks compressed whole with zstd; pytree datasets refused; bad inputs
named by file and byte."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from stoker.converters import convert, detect
from stoker.errors import InputError

from .helpers import read_documents

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "peers"


def want(name: str) -> list[np.ndarray]:
    with np.load(FIXTURES / f"documents-{name}.npz") as z:
        return [z[f"arr_{i}"] for i in range(len(z.files))]


@pytest.mark.parametrize("name", ["litdata-int32", "litdata-int64", "litdata-zstd"])
def test_a_litdata_dataset_converts_token_for_token(name: str, tmp_path: Path) -> None:
    src = FIXTURES / name
    assert detect(str(src)) == "litdata"
    docs = want(name)
    manifest, stats = convert(str(src), str(tmp_path / "ds"))
    assert stats.documents == stats.total_documents == len(docs)
    assert manifest.num_documents == len(docs)
    assert manifest.vocab_size == max(int(d.max()) for d in docs) + 1
    got = read_documents(str(tmp_path / "ds"))
    assert len(got) == len(docs) and all(
        np.array_equal(g, d) for g, d in zip(got, docs, strict=True)
    )


def test_the_cli_converts_a_litdata_directory(tmp_path: Path) -> None:
    out = tmp_path / "ds"
    got = subprocess.run(
        [sys.executable, "-m", "stoker", "convert", str(FIXTURES / "litdata-int32"),
         "--out", str(out), "--from", "litdata"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert got.returncode == 0, got.stderr
    assert len(read_documents(str(out))) == len(want("litdata-int32"))


def copy(tmp_path: Path, name: str = "litdata-int32") -> Path:
    src = tmp_path / name
    shutil.copytree(FIXTURES / name, src)
    return src


def test_bad_litdata_inputs_are_named(tmp_path: Path) -> None:
    # a chunk cut short
    src = copy(tmp_path)
    chunk = src / "chunk-0-1.bin"
    chunk.write_bytes(chunk.read_bytes()[:-8])
    with pytest.raises(InputError, match=r"chunk-0-1\.bin: \d+ bytes, but index\.json says"):
        convert(str(src), str(tmp_path / "o1"))
    # an item offset pointing past the chunk's end
    src = copy(tmp_path / "b")
    chunk = src / "chunk-0-2.bin"
    raw = bytearray(chunk.read_bytes())
    raw[4 + 4 * 3 : 4 + 4 * 4] = (len(raw) + 400).to_bytes(4, "little")
    chunk.write_bytes(bytes(raw))
    with pytest.raises(InputError, match=r"chunk-0-2\.bin: item offset 3 \(byte 16\)"):
        convert(str(src), str(tmp_path / "o2"))
    # a chunk missing
    src = copy(tmp_path / "c")
    (src / "chunk-0-0.bin").unlink()
    with pytest.raises(InputError, match=r"chunk-0-0\.bin: cannot read"):
        convert(str(src), str(tmp_path / "o3"))
    # a compressed chunk that is not zstd
    src = copy(tmp_path / "d", "litdata-zstd")
    (src / "chunk-0-1.zstd.bin").write_bytes(b"not zstd at all")
    with pytest.raises(InputError, match=r"chunk-0-1\.zstd\.bin: not a zstd-compressed chunk"):
        convert(str(src), str(tmp_path / "o4"))
    # a negative token id (int32 tensors may hold one): its item and byte named
    src = copy(tmp_path / "e")
    chunk = src / "chunk-0-0.bin"
    raw = bytearray(chunk.read_bytes())
    first = int.from_bytes(raw[4:8], "little")  # item 0's first byte
    raw[first : first + 4] = (-5).to_bytes(4, "little", signed=True)
    chunk.write_bytes(bytes(raw))
    with pytest.raises(InputError, match=rf"chunk-0-0\.bin: item 0 \(byte {first}\): a negative"):
        convert(str(src), str(tmp_path / "o5"))
    # nothing of a failed conversion is left as a dataset
    for o in ("o1", "o2", "o3", "o4", "o5"):
        assert not (tmp_path / o / "manifest.json").exists()


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"item_loader": "PyTreeLoader"}, r"'PyTreeLoader' are pytrees .* not read here"),
        ({"data_format": ["pickle"]}, r"data_format \['pickle'\] is not one tensor"),
        ({"data_format": ["no_header_tensor:0"]}, r"not one tensor of integer token ids"),
        ({"encryption": "fernet"}, r"encrypted chunks are not read"),
        ({"compression": "zstd", "compression_level": "batch"}, r"level 'batch'\) is not read"),
    ],
)
def test_a_litdata_index_of_items_that_are_not_token_tensors_is_refused(
    tmp_path: Path, change: dict, match: str
) -> None:
    src = copy(tmp_path)
    index = json.loads((src / "index.json").read_text())
    index["config"].update(change)
    (src / "index.json").write_text(json.dumps(index))
    with pytest.raises(InputError, match=r"index\.json: .*" + match):
        convert(str(src), str(tmp_path / "o"))


def test_a_chunk_named_outside_its_directory_is_refused(tmp_path: Path) -> None:
    src = copy(tmp_path)
    index = json.loads((src / "index.json").read_text())
    index["chunks"][0]["filename"] = "../../etc/passwd"
    (src / "index.json").write_text(json.dumps(index))
    with pytest.raises(InputError, match=r"chunk 0's filename '\.\./\.\./etc/passwd' is not"):
        convert(str(src), str(tmp_path / "o"))
