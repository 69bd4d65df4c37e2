"""`stoker convert` from MosaicML Streaming (MDS) datasets written by Streaming's own
MDSWriter (fixtures committed with the script that made them,
tests/fixtures/peers/make_mds.py): token for token, a document a sample, plain and
zstd-compressed shards, ndarray and bytes columns; bad inputs named."""

from __future__ import annotations

import json
import shutil
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


@pytest.mark.parametrize(
    ("name", "options"),
    [
        ("mds-ndarray", {}),  # ndarray:uint16 beside str and int columns, three shards
        ("mds-dynamic-zstd", {}),  # dtype and shape in each value, zstd shards
        ("mds-bytes", {"dtype": "int32"}),  # raw bytes of int32 tokens
    ],
)
def test_an_mds_dataset_converts_token_for_token(name: str, options: dict, tmp_path: Path) -> None:
    src = FIXTURES / name
    assert detect(str(src)) == "mds"
    docs = want(name)
    manifest, stats = convert(str(src), str(tmp_path / "ds"), vocab_size=30000, **options)
    assert stats.documents == stats.total_documents == len(docs)
    assert manifest.num_documents == len(docs)
    got = read_documents(str(tmp_path / "ds"))
    assert len(got) == len(docs) and all(
        np.array_equal(g, d) for g, d in zip(got, docs, strict=True)
    )


def test_bad_mds_inputs_are_named(tmp_path: Path) -> None:
    src = tmp_path / "mds"
    shutil.copytree(FIXTURES / "mds-ndarray", src)
    with pytest.raises(InputError, match=r"a 'bytes' token column needs its dtype"):
        convert(str(FIXTURES / "mds-bytes"), str(tmp_path / "o1"))
    with pytest.raises(InputError, match=r"encoding 'str' holds no token ids"):
        convert(str(src), str(tmp_path / "o2"), column="text", vocab_size=10)
    with pytest.raises(InputError, match=r"no column 'nope'"):
        convert(str(src), str(tmp_path / "o3"), column="nope")
    # a shard cut short
    shard = src / "shard.00001.mds"
    shard.write_bytes(shard.read_bytes()[:-10])
    with pytest.raises(InputError, match=r"shard\.00001\.mds: its sample offsets .* run past"):
        convert(str(src), str(tmp_path / "o4"), vocab_size=30000)
    # an index that names a file that is not there
    index = json.loads((src / "index.json").read_text())
    index["shards"][2]["raw_data"]["basename"] = "gone.mds"
    (src / "index.json").write_text(json.dumps(index))
    with pytest.raises(InputError, match=r"shard 2 names no file that is there"):
        convert(str(src), str(tmp_path / "o5"))
    for o in ("o1", "o2", "o3", "o4", "o5"):
        assert not (tmp_path / o / "manifest.json").exists()
