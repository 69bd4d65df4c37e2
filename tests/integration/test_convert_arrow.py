"""`stoker convert` from Arrow data: a Hugging Face dataset saved to disk by the datasets
library itself (in a process of its own), parquet and Arrow IPC files written by
pyarrow: token for token, one document a row, bad inputs named by file."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import stoker
from stoker.converters import convert
from stoker.errors import InputError

from ._megatron_docs import documents
from .helpers import read_documents

HF_WRITER = Path(__file__).with_name("_hf_write.py")


def expected(seed: int, n: int, vocab: int) -> list[np.ndarray]:
    return [np.concatenate(s) if s else np.zeros(0, np.int64) for s in documents(seed, n, vocab)]


def check(url: str, want: list[np.ndarray]) -> None:
    got = read_documents(url)
    nonempty = [d for d in want if len(d)]
    assert len(got) == len(nonempty)
    for g, w in zip(got, nonempty, strict=True):
        assert np.array_equal(g, w)


@pytest.mark.skipif(importlib.util.find_spec("datasets") is None, reason="needs datasets")
def test_a_saved_hugging_face_dataset_converts(tmp_path: Path) -> None:
    src = tmp_path / "hf"
    subprocess.run([sys.executable, str(HF_WRITER), str(src), "7", "200", "30000", "3"],
                   check=True, timeout=300, capture_output=True)  # fmt: skip
    assert len(list(src.glob("*.arrow"))) == 3  # three shards, read in order
    manifest, stats = convert(str(src), str(tmp_path / "ds"), vocab_size=30_000)
    want = expected(7, 200, 30_000)
    assert stats.documents == 200 and stats.empty == sum(not len(d) for d in want)
    assert manifest.num_tokens == sum(len(d) for d in want)
    check(str(tmp_path / "ds"), want)
    # the CLI, the column named, the vocabulary inferred
    r = subprocess.run([sys.executable, "-m", "stoker.cli", "convert", str(src), "--out",
                        str(tmp_path / "ds2"), "--column", "input_ids", "--quiet"],
                       capture_output=True, text=True, timeout=120)  # fmt: skip
    assert r.returncode == 0, r.stderr
    top = max(int(d.max()) for d in want if len(d))
    assert stoker.TokenSource(str(tmp_path / "ds2")).manifest.vocab_size == top + 1


def write_table(want: list[np.ndarray], dtype: pa.DataType) -> pa.Table:
    return pa.table(
        {
            "id": list(range(len(want))),
            "tokens": pa.array([d.tolist() for d in want], pa.list_(dtype)),
        }
    )


@pytest.mark.parametrize("layout", ["file", "directory"])
def test_parquet_with_a_token_column_converts(tmp_path: Path, layout: str) -> None:
    want = expected(11, 150, 60_000)
    table = write_table(want, pa.uint16())
    if layout == "file":
        src = tmp_path / "t.parquet"
        pq.write_table(table, src, row_group_size=40)
    else:
        src = tmp_path / "pq"
        src.mkdir()
        for i, lo in enumerate(range(0, 150, 50)):  # files read in name order
            pq.write_table(table.slice(lo, 50), src / f"part-{i:02d}.parquet")
    _, stats = convert(str(src), str(tmp_path / "ds"))  # the 'tokens' column found
    assert stats.total_documents == 150 == stats.documents
    check(str(tmp_path / "ds"), want)


@pytest.mark.parametrize("ipc", ["file", "stream"])
def test_arrow_ipc_files_and_streams_convert(tmp_path: Path, ipc: str) -> None:
    want = expected(13, 90, 1000)
    table = write_table(want, pa.int64())
    src = tmp_path / "t.arrow"
    with pa.OSFile(str(src), "wb") as sink:
        new = pa.ipc.new_file if ipc == "file" else pa.ipc.new_stream
        with new(sink, table.schema) as w:
            for batch in table.to_batches(max_chunksize=25):
                w.write_batch(batch)
    convert(str(src), str(tmp_path / "ds"), vocab_size=1000)
    check(str(tmp_path / "ds"), want)


def test_bad_arrow_inputs_are_named(tmp_path: Path) -> None:
    want = expected(1, 10, 100)
    t = tmp_path / "t.parquet"
    pq.write_table(
        pa.table(
            {
                "text": ["a"] * 10,
                "tokens": pa.array([d.tolist() for d in want], pa.list_(pa.int32())),
            }
        ),
        t,
    )
    with pytest.raises(
        InputError, match=r"t\.parquet: no column 'input_ids' \(columns: text, tokens\)"
    ):
        convert(str(t), str(tmp_path / "o1"), column="input_ids")
    with pytest.raises(InputError, match=r"column 'text' is string, not a list of integer"):
        convert(str(t), str(tmp_path / "o2"), column="text")
    with pytest.raises(InputError, match=r"t\.parquet, row \d+: .*outside"):
        convert(str(t), str(tmp_path / "o3"), vocab_size=5)
    junk = tmp_path / "junk.parquet"
    junk.write_bytes(b"not parquet at all")
    with pytest.raises(InputError, match=r"junk\.parquet: cannot be read as parquet"):
        convert(str(junk), str(tmp_path / "o4"))
    dd = tmp_path / "dd"
    (dd / "train").mkdir(parents=True)
    (dd / "dataset_dict.json").write_text('{"splits": ["train"]}')
    (dd / "train" / "state.json").write_text("{}")
    with pytest.raises(
        InputError, match=r"a Hugging Face DatasetDict; convert one of its splits \(.*train"
    ):
        convert(str(dd), str(tmp_path / "o5"))
    for o in ("o1", "o2", "o3", "o4", "o5"):
        assert not (tmp_path / o / "manifest.json").exists()
