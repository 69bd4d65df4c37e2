"""`stoker build-tokens` and `stoker inspect`, run as real commands."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from tokenizers import Tokenizer

import stoker
from stoker.cli import main
from stoker.demo import train_tokenizer
from stoker.ingest import SourceOptions

TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "Packing documents across boundaries keeps every token of the corpus.",
    "A shuffle window spans several virtual shards.",
    "Resume state is small: an epoch, a set of positions, a count.",
    "Ünïcödé text survives the byte-level tokenizer.",
] * 20


@pytest.fixture(scope="module")
def tokenizer_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return train_tokenizer(tmp_path_factory.mktemp("tok") / "tokenizer.json", TEXTS, 400)


def expected_stream(tokenizer_file: Path, texts: list[str]) -> np.ndarray:
    tok = Tokenizer.from_file(str(tokenizer_file))
    eos = tok.token_to_id("<|endoftext|>")
    parts = [np.append(tok.encode(t, add_special_tokens=False).ids, eos) for t in texts]
    return np.concatenate(parts)


def write_sources(root: Path) -> tuple[list[str], list[str]]:
    """A .txt (one doc), a .jsonl and a .parquet; returns paths and the documents in order."""
    txt = root / "a.txt"
    txt.write_text(TEXTS[0], encoding="utf-8")
    jl = root / "b.jsonl"
    jl.write_text("".join(json.dumps({"body": t}) + "\n" for t in TEXTS[1:40]), encoding="utf-8")
    pqf = root / "c.parquet"
    pq.write_table(pa.table({"content": TEXTS[40:]}), pqf)
    return [str(txt), str(jl), str(pqf)], TEXTS


def build(sources: list[str], out: Path, tokenizer: Path, *extra: str) -> int:
    """`stoker build-tokens` on the sources of write_sources()."""
    args = ["build-tokens", *sources, "--out", str(out), "--tokenizer", str(tokenizer)]
    args += ["--text-field", "body", "--text-column", "content", "--quiet", *extra]
    return main(args)


@pytest.mark.parametrize("workers", [1, 2])
def test_build_tokens_reads_every_kind_and_appends_eos(
    tmp_path: Path, tokenizer_file: Path, workers: int
) -> None:
    sources, texts = write_sources(tmp_path)
    out = tmp_path / "ds"
    code = build(sources, out, tokenizer_file, "--workers", str(workers), "--block-tokens", "64")
    assert code == 0
    src = stoker.TokenSource(str(out))
    m = src.manifest
    want = expected_stream(tokenizer_file, texts)
    assert m.num_documents == len(texts)
    assert m.num_tokens == len(want)
    assert m.dtype == "uint16" and m.vocab_size == 400
    assert m.tokenizer is not None and m.tokenizer.eos_token == "<|endoftext|>"
    np.testing.assert_array_equal(src.tokens(0, m.num_tokens), want)


def test_inspect_prints_counts_and_decoded_sample(tmp_path: Path, tokenizer_file: Path) -> None:
    sources, _ = write_sources(tmp_path)
    out = tmp_path / "ds"
    assert build(sources, out, tokenizer_file, "--workers", "1") == 0
    result = subprocess.run(
        [sys.executable, "-m", "stoker.cli", "inspect", str(out), "--sample-tokens", "12"],
        capture_output=True,
        text=True,
        check=True,
    )
    m = stoker.TokenSource(str(out)).manifest
    assert f"{m.num_tokens:,}" in result.stdout
    assert f"{m.num_documents:,}" in result.stdout
    assert "compression" in result.stdout
    # the decoded sample is the start of the first document
    assert "The quick brown" in result.stdout


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "stoker.cli", *args], capture_output=True, text=True
    )


def test_empty_input_file_is_named_and_nothing_is_written(
    tmp_path: Path, tokenizer_file: Path
) -> None:
    good = tmp_path / "good.txt"
    good.write_text("some text", encoding="utf-8")
    empty = tmp_path / "empty.jsonl"
    empty.write_bytes(b"")
    out = tmp_path / "ds"
    result = run_cli(
        "build-tokens", str(good), str(empty), "--out", str(out), "--tokenizer", str(tokenizer_file)
    )
    assert result.returncode == 2
    assert "empty.jsonl" in result.stderr and "empty" in result.stderr
    assert not (out / "manifest.json").exists()


def test_tokenizer_that_does_not_load_is_named(tmp_path: Path) -> None:
    src = tmp_path / "a.txt"
    src.write_text("text", encoding="utf-8")
    bad = tmp_path / "broken-tokenizer.json"
    bad.write_text('{"not": "a tokenizer"}', encoding="utf-8")
    result = run_cli(
        "build-tokens", str(src), "--out", str(tmp_path / "ds"), "--tokenizer", str(bad)
    )
    assert result.returncode == 2
    assert "broken-tokenizer.json" in result.stderr and "does not load" in result.stderr


def test_malformed_jsonl_line_is_named_and_leaves_no_dataset(
    tmp_path: Path, tokenizer_file: Path
) -> None:
    src = tmp_path / "docs.jsonl"
    src.write_text('{"text": "fine"}\n{"text": broken\n', encoding="utf-8")
    out = tmp_path / "ds"
    result = run_cli(
        "build-tokens", str(src), "--out", str(out), "--tokenizer", str(tokenizer_file)
    )
    assert result.returncode == 2
    assert "docs.jsonl, line 2" in result.stderr
    assert not (out / "manifest.json").exists()
    assert not list((out / "data").glob("*")) if (out / "data").exists() else True


def test_missing_text_field_is_named(tmp_path: Path, tokenizer_file: Path) -> None:
    src = tmp_path / "docs.jsonl"
    src.write_text('{"body": "x"}\n', encoding="utf-8")
    result = run_cli(
        "build-tokens", str(src), "--out", str(tmp_path / "ds"), "--tokenizer", str(tokenizer_file)
    )
    assert result.returncode == 2
    assert "line 1" in result.stderr and "'text'" in result.stderr


MDS = Path(__file__).resolve().parents[1] / "fixtures" / "peers" / "mds-ndarray"


def test_an_mds_text_column_is_tokenized(tmp_path: Path, tokenizer_file: Path) -> None:
    """A MosaicML Streaming directory (written by Streaming's own MDSWriter: its text
    column is "document J" for sample J, over three shards) as a build-tokens source."""
    out = tmp_path / "ds"
    args = ["build-tokens", str(MDS), "--out", str(out), "--tokenizer", str(tokenizer_file),
            "--text-column", "text", "--quiet"]  # fmt: skip
    assert main(args) == 0
    texts = [f"document {j}" for j in range(120)]
    src = stoker.TokenSource(str(out))
    assert src.manifest.num_documents == len(texts)
    np.testing.assert_array_equal(
        src.tokens(0, src.manifest.num_tokens), expected_stream(tokenizer_file, texts)
    )


def test_a_bad_mds_text_source_is_named_or_skipped(tmp_path: Path, tokenizer_file: Path) -> None:
    import shutil

    with pytest.raises(stoker.InputError, match=r"column 'tokens' is encoded as 'ndarray:uint16'"):
        stoker.build_tokens([str(MDS)], str(tmp_path / "a"), str(tokenizer_file),
                            source_options=SourceOptions(text_column="tokens"))  # fmt: skip
    bad = tmp_path / "mds"
    shutil.copytree(MDS, bad)
    shard = bad / "shard.00000.mds"
    raw = shard.read_bytes()
    at = raw.index(b"document 7")
    shard.write_bytes(raw[:at] + b"\xff" + raw[at + 1 :])  # sample 7's text: not UTF-8
    with pytest.raises(stoker.InputError, match=r"shard.00000.mds: sample 7 .* not UTF-8"):
        stoker.build_tokens([str(bad)], str(tmp_path / "b"), str(tokenizer_file), workers=1)
    _, stats = stoker.build_tokens([str(bad)], str(tmp_path / "c"), str(tokenizer_file),
                                   workers=1, on_error="skip")  # fmt: skip
    assert stats.documents == 119 and stats.skipped == 1
    assert "sample 7" in stats.skipped_reasons[0]
