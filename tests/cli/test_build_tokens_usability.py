"""What a user of `stoker build-tokens` sees: --version, progress with a total and an ETA,
a missing tokenizer said plainly, a .jsonl line without the text field named with its fields."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import stoker
from stoker.demo import train_tokenizer
from stoker.errors import InputError
from stoker.tokenizing import _BATCH_DOCS, BuildStats, build_tokens

WORDS = [
    "packing",
    "shuffle",
    "window",
    "shard",
    "resume",
    "token",
    "block",
    "agent",
    "lease",
    "epoch",
]


@pytest.fixture(scope="module")
def tokenizer_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return train_tokenizer(
        tmp_path_factory.mktemp("tok") / "tokenizer.json", [" ".join(WORDS)] * 10, 300
    )


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "stoker.cli", *args], capture_output=True, text=True, timeout=120
    )


def jsonl_sources(root: Path, files: int, docs_per_file: int) -> list[Path]:
    paths = []
    for f in range(files):
        path = root / f"part-{f}.jsonl"
        lines = (
            json.dumps({"text": " ".join(WORDS[(i + f) % len(WORDS) :] + WORDS[:3])})
            for i in range(docs_per_file)
        )
        path.write_text("\n".join(lines) + "\n", encoding="utf-8")
        paths.append(path)
    return paths


def test_version_flag_prints_the_version() -> None:
    result = run_cli("--version")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"stoker {stoker.__version__}"


def test_progress_counts_source_bytes_against_a_total_known_up_front(
    tmp_path: Path, tokenizer_file: Path
) -> None:
    # several batches per file, so progress is reported within files as well as between them
    paths = jsonl_sources(tmp_path, files=3, docs_per_file=3 * _BATCH_DOCS + 7)
    total = sum(p.stat().st_size for p in paths)
    seen: list[BuildStats] = []

    def progress(stats: BuildStats) -> None:
        seen.append(BuildStats(**vars(stats)))

    build_tokens(
        [str(p) for p in paths],
        str(tmp_path / "ds"),
        str(tokenizer_file),
        workers=1,
        progress=progress,
    )
    assert seen[0].total_bytes == total and seen[0].source_bytes == 0  # before any work
    assert all(s.total_bytes == total for s in seen)
    done = [s.source_bytes for s in seen]
    assert done == sorted(done) and done[-1] == total
    inside = [d for d in done if 0 < d < total and d not in (total // 3, 2 * total // 3)]
    assert len(inside) >= 6  # batches within each file moved the count, not only file ends


def test_the_progress_bar_shows_a_total_and_an_eta(tmp_path: Path, tokenizer_file: Path) -> None:
    paths = jsonl_sources(tmp_path, files=2, docs_per_file=2 * _BATCH_DOCS)
    result = run_cli(
        "build-tokens",
        *map(str, paths),
        "--out",
        str(tmp_path / "ds"),
        "--tokenizer",
        str(tokenizer_file),
        "--workers",
        "1",
    )
    assert result.returncode == 0, result.stderr
    final = result.stderr.replace("\r", "\n").strip().splitlines()[-1]
    # tqdm with a total: "100%|...| 60.0k/60.0k [00:01<00:00, ...]"; without one: no % and no ETA
    assert "100%" in final, result.stderr
    assert "<" in final.split("[", 1)[1], final
    assert f"{2 * 2 * _BATCH_DOCS:,} docs" in final


def test_a_missing_tokenizer_file_says_where_to_get_one(tmp_path: Path) -> None:
    src = tmp_path / "a.txt"
    src.write_text("some text", encoding="utf-8")
    missing = tmp_path / "nowhere" / "tokenizer.json"
    result = run_cli(
        "build-tokens", str(src), "--out", str(tmp_path / "ds"), "--tokenizer", str(missing)
    )
    assert result.returncode == 2
    err = result.stderr
    assert str(missing) in err and "not found" in err
    assert "tokenizer.json" in err and "train" in err and "BpeTrainer" in err
    assert "Traceback" not in err


def test_a_tokenizer_directory_points_at_the_file_inside(
    tmp_path: Path, tokenizer_file: Path
) -> None:
    with pytest.raises(InputError, match=f"use {tokenizer_file.parent / 'tokenizer.json'}"):
        build_tokens(["unused.txt"], str(tmp_path / "ds"), str(tokenizer_file.parent))


def test_a_jsonl_line_without_the_text_field_lists_the_fields_it_has(
    tmp_path: Path, tokenizer_file: Path
) -> None:
    src = tmp_path / "docs.jsonl"
    src.write_text('{"text": "fine"}\n{"body": "x", "id": 7}\n', encoding="utf-8")
    out = tmp_path / "ds"
    result = run_cli(
        "build-tokens",
        str(src),
        "--out",
        str(out),
        "--tokenizer",
        str(tokenizer_file),
        "--workers",
        "1",
    )
    assert result.returncode == 2
    err = result.stderr
    assert f"{src}, line 2" in err
    assert "no field 'text'" in err and "'body', 'id'" in err and "--text-field" in err
    assert not (out / "manifest.json").exists()


def test_a_jsonl_line_that_is_not_an_object_is_named(tmp_path: Path, tokenizer_file: Path) -> None:
    src = tmp_path / "docs.jsonl"
    src.write_text('["a", "list"]\n', encoding="utf-8")
    with pytest.raises(InputError, match=r"docs.jsonl, line 1: a JSON list, not an object"):
        build_tokens([str(src)], str(tmp_path / "ds"), str(tokenizer_file), workers=1)
