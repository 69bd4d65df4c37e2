"""`build-tokens --on-error skip` (and `stoker.build_tokens(on_error="skip")`): unreadable
documents and empty files are left out and counted, the rest of the corpus is built and
reads back token for token; without it the same inputs stop the build, naming the file."""

from __future__ import annotations

import gzip
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
from stoker.demo import train_tokenizer
from stoker.errors import ConfigError, InputError

WORDS = ["packing", "shuffle", "window", "shard", "resume", "token", "block", "lease"]


@pytest.fixture(scope="module")
def tokenizer_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return train_tokenizer(
        tmp_path_factory.mktemp("tok") / "tokenizer.json", [" ".join(WORDS)] * 10, 300
    )


def good_text(i: int) -> str:
    return " ".join(WORDS[i % len(WORDS) :] + WORDS[: i % 3])


@pytest.fixture
def sources(tmp_path: Path) -> tuple[list[Path], list[str], list[str]]:
    """Input files with 4 bad documents and an empty file among good ones: (paths, the
    good texts in order, what each bad one is)."""
    good: list[str] = []
    lines = []
    for i in range(6):
        good.append(good_text(i))
        lines.append(json.dumps({"text": good[-1]}))
    lines[2:2] = ["{not json", '{"body": "x"}', '{"text": 5}']  # lines 3, 4, 5
    a = tmp_path / "a.jsonl"
    a.write_text("\n".join(lines) + "\n", encoding="utf-8")
    empty = tmp_path / "b.jsonl"
    empty.write_bytes(b"")
    c = tmp_path / "c.txt"  # a whole-file document that is not UTF-8
    c.write_bytes(b"caf\xe9 latin-1 text")
    d = tmp_path / "d.parquet"
    texts = [good_text(10 + i) for i in range(3)]
    pq.write_table(pa.table({"text": texts}), d)
    good += texts
    bad = ["a.jsonl, line 3", "a.jsonl, line 4", "a.jsonl, line 5", "b.jsonl", "c.txt"]
    return [a, empty, c, d], good, bad


def test_skip_leaves_out_and_counts_what_cannot_be_read(
    sources: tuple[list[Path], list[str], list[str]], tokenizer_file: Path, tmp_path: Path
) -> None:
    paths, good, bad = sources
    out = tmp_path / "ds"
    manifest, stats = stoker.build_tokens(
        [str(p) for p in paths], str(out), str(tokenizer_file), workers=1, on_error="skip"
    )
    assert stats.skipped == len(bad) == len(stats.skipped_reasons)
    for reason, where in zip(sorted(stats.skipped_reasons), sorted(bad), strict=True):
        assert where in reason, (reason, where)
    assert manifest.num_documents == stats.documents == len(good)
    # the dataset holds the good documents, in order, each followed by EOS
    tok = Tokenizer.from_file(str(tokenizer_file))
    eos = tok.token_to_id("<|endoftext|>")
    want = np.concatenate([[*tok.encode(t).ids, eos] for t in good])
    src = stoker.TokenSource(str(out))
    assert np.array_equal(src.tokens(0, manifest.num_tokens), want)
    assert stoker.verify(str(out)).ok


def test_without_skip_the_first_bad_document_stops_the_build(
    sources: tuple[list[Path], list[str], list[str]], tokenizer_file: Path, tmp_path: Path
) -> None:
    paths, _, _ = sources
    with pytest.raises(InputError, match=r"b.jsonl: input file is empty"):
        stoker.build_tokens([str(p) for p in paths], str(tmp_path / "ds"), str(tokenizer_file))
    without_empty = [str(p) for p in paths if p.name != "b.jsonl"]
    with pytest.raises(InputError, match=r"a.jsonl, line 3: not valid JSON"):
        stoker.build_tokens(without_empty, str(tmp_path / "ds"), str(tokenizer_file), workers=1)
    with pytest.raises(InputError, match=r"c.txt: not UTF-8 text"):
        stoker.build_tokens([str(paths[2])], str(tmp_path / "ds"), str(tokenizer_file), workers=1)
    assert not (tmp_path / "ds" / "manifest.json").exists()
    with pytest.raises(ConfigError, match="on_error"):
        stoker.build_tokens(without_empty, str(tmp_path / "ds"), str(tokenizer_file), on_error="x")


def test_the_cli_says_what_it_left_out(
    sources: tuple[list[Path], list[str], list[str]], tokenizer_file: Path, tmp_path: Path
) -> None:
    paths, good, bad = sources
    out = tmp_path / "ds"
    args = [str(p) for p in paths] + ["--out", str(out), "--tokenizer", str(tokenizer_file)]
    result = subprocess.run(
        [sys.executable, "-m", "stoker.cli", "build-tokens", *args, "--workers", "1",
         "--quiet", "--on-error", "skip"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert f"{len(good):,} documents" in result.stdout
    assert f"left out {len(bad)} unreadable document(s) or empty file(s)" in result.stdout
    for where in bad:
        assert where in result.stdout
    stopped = subprocess.run(
        [sys.executable, "-m", "stoker.cli", "build-tokens", *args, "--workers", "1",
         "--quiet", "--overwrite"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert stopped.returncode == 2 and "b.jsonl: input file is empty" in stopped.stderr


def test_nothing_left_to_build_is_said_plainly(tmp_path: Path, tokenizer_file: Path) -> None:
    empty = tmp_path / "e.jsonl"
    empty.write_bytes(b"")
    with pytest.raises(InputError, match=r"no input left to build from: .*e\.jsonl"):
        stoker.build_tokens(
            [str(empty)], str(tmp_path / "ds"), str(tokenizer_file), on_error="skip"
        )


def test_a_line_that_is_not_utf8_costs_that_line_alone(
    tmp_path: Path, tokenizer_file: Path
) -> None:
    # the bad line sits among good ones in the same 8 KiB of the file
    good = [good_text(i) for i in range(100)]
    lines = [json.dumps({"text": t}).encode() for t in good]
    lines.insert(50, b'{"text": "caf\xe9"}')
    src = tmp_path / "docs.jsonl"
    src.write_bytes(b"\n".join(lines) + b"\n")
    at = sum(len(x) + 1 for x in lines[:50]) + len(b'{"text": "caf')
    _, stats = stoker.build_tokens([str(src)], str(tmp_path / "ds"), str(tokenizer_file),
                                   workers=1, on_error="skip")  # fmt: skip
    assert stats.documents == 100 and stats.skipped == 1
    assert f"docs.jsonl, line 51: not UTF-8 text (byte {at:,}" in stats.skipped_reasons[0]
    with pytest.raises(InputError, match=rf"docs\.jsonl, line 51: not UTF-8 text \(byte {at:,}"):
        stoker.build_tokens([str(src)], str(tmp_path / "ds2"), str(tokenizer_file), workers=1)


def test_a_cut_compressed_file_keeps_what_came_before(tmp_path: Path, tokenizer_file: Path) -> None:
    good = [good_text(i) for i in range(400)]
    whole = gzip.compress(("\n".join(json.dumps({"text": t}) for t in good) + "\n").encode())
    src = tmp_path / "docs.jsonl.gz"
    src.write_bytes(whole[: len(whole) * 2 // 3])
    with pytest.raises(InputError, match=r"docs\.jsonl\.gz: cannot be read to its end \(EOFError"):
        stoker.build_tokens([str(src)], str(tmp_path / "ds"), str(tokenizer_file), workers=1)
    _, stats = stoker.build_tokens([str(src)], str(tmp_path / "ds2"), str(tokenizer_file),
                                   workers=1, on_error="skip")  # fmt: skip
    assert stats.skipped == 1 and "the rest of the file is left out" in stats.skipped_reasons[0]
    assert 0 < stats.documents < len(good)
