"""Optional packages missing: the error names the extra to install, where the URL or the
command is first used. The packages are hidden from this process (as if not installed);
tests/integration/test_core_install.py checks a real install without them."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

import stoker
from stoker.cli import main
from stoker.errors import ConfigError, InputError
from stoker.ingest import check_sources
from stoker.storage import RetryPolicy, Storage
from stoker.tokenizing import load_tokenizer


def hide(monkeypatch: pytest.MonkeyPatch, *modules: str) -> None:
    """Make ``import module`` fail with ImportError, as when it is not installed."""
    for name in list(sys.modules):
        if any(name == m or name.startswith(m + ".") for m in modules):
            monkeypatch.delitem(sys.modules, name)
    for m in modules:
        monkeypatch.setitem(sys.modules, m, None)
    # fsspec keeps the classes it imported, and its HTTP module imports aiohttp
    monkeypatch.delitem(sys.modules, "fsspec.implementations.http", raising=False)
    registry = importlib.import_module("fsspec.registry")._registry
    for protocol in ("s3", "s3a", "http", "https"):
        monkeypatch.delitem(registry, protocol, raising=False)


def test_an_s3_dataset_without_s3fs_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    hide(monkeypatch, "s3fs")
    with pytest.raises(ConfigError, match=r"s3://bucket/ds: .*pip install 'stoker\[s3\]'"):
        stoker.TokenDataset("s3://bucket/ds", 8, agent=False)


def test_http_with_storage_options_without_aiohttp_names_the_extra(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    hide(monkeypatch, "aiohttp")
    storage = Storage("http://127.0.0.1:1/ds", storage_options={"headers": {"a": "b"}})
    with pytest.raises(ConfigError, match=r"pip install 'stoker\[http\]'"):
        storage.read("manifest.json")


def test_an_s3_source_without_s3fs_is_an_input_error(monkeypatch: pytest.MonkeyPatch) -> None:
    hide(monkeypatch, "s3fs")
    with pytest.raises(InputError, match=r"s3://bucket/a.jsonl: .*stoker\[s3\]"):
        check_sources(["s3://bucket/a.jsonl"])


def test_a_parquet_source_without_pyarrow_names_the_extra(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    src = tmp_path / "docs.parquet"
    src.write_bytes(b"PAR1")
    hide(monkeypatch, "pyarrow")
    with pytest.raises(InputError, match=r"docs.parquet: reading .parquet .*stoker\[parquet\]"):
        check_sources([str(src)])


def test_building_without_tokenizers_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    hide(monkeypatch, "tokenizers")
    with pytest.raises(
        InputError, match=r"build-tokens needs the tokenizers package.*stoker\[build\]"
    ):
        load_tokenizer("tokenizer.json")


def test_the_cli_says_which_extra_build_tokens_needs(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    hide(monkeypatch, "tqdm")
    src = tmp_path / "a.txt"
    src.write_text("text", encoding="utf-8")
    code = main(["build-tokens", str(src), "--out", str(tmp_path / "ds"), "--tokenizer", "t.json"])
    assert code == 2
    assert "pip install 'stoker[build]'" in capsys.readouterr().err


def test_a_missing_backend_is_not_retried(monkeypatch: pytest.MonkeyPatch) -> None:
    hide(monkeypatch, "s3fs")
    storage = Storage("s3://bucket/ds", retry=RetryPolicy(attempts=3, backoff=0.001))
    # exists() and writes meet the error inside the retry loop: it gives up at once
    with pytest.raises(stoker.ConfigError, match=r"s3://bucket/ds: .*pip install 'stoker\[s3\]'"):
        storage.exists("manifest.json")
    assert storage.stats.retries == 0
    with pytest.raises(stoker.ConfigError, match=r"pip install 'stoker\[s3\]'"):
        stoker.write_tokens([[1, 2, 3]], "s3://bucket/ds", vocab_size=10, eos_id=0)


def test_inspect_without_tokenizers_prints_token_ids_and_the_extra(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=280, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)  # fmt: skip
    tok.train_from_iterator(["a small corpus of words"] * 5, trainer)
    tok.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "a.txt").write_text("a small corpus", encoding="utf-8")
    out = str(tmp_path / "ds")
    assert main(["build-tokens", str(tmp_path / "a.txt"), "--out", out, "--quiet",
                 "--tokenizer", str(tmp_path / "tokenizer.json"), "--workers", "1"]) == 0  # fmt: skip
    capsys.readouterr()
    hide(monkeypatch, "tokenizers")
    assert main(["inspect", out]) == 0
    printed = capsys.readouterr().out
    assert "sample (tokens 0.." in printed and ", decoded):" not in printed
    assert "pip install 'stoker[build]'" in printed
