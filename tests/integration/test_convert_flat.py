"""`stoker convert` from flat token arrays (numpy's .npy, raw .bin) with a document
offsets file or split at an end-of-document id: token for token, documents kept."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from stoker.converters import convert
from stoker.errors import InputError

from .helpers import read_documents

EOT = 50256


def corpus(seed: int = 2, n: int = 120) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, EOT, size=int(rng.integers(1, 60))) for _ in range(n)]


@pytest.mark.parametrize("offsets_kind", ["starts", "bounds", "bin"])
def test_a_npy_array_with_offsets_converts(tmp_path: Path, offsets_kind: str) -> None:
    docs = corpus()
    tokens = np.concatenate(docs).astype(np.uint16)
    np.save(tmp_path / "tokens.npy", tokens)
    starts = np.concatenate([[0], np.cumsum([len(d) for d in docs])[:-1]])
    if offsets_kind == "starts":
        off = tmp_path / "off.npy"
        np.save(off, starts)
    elif offsets_kind == "bounds":
        off = tmp_path / "off.npy"
        np.save(off, np.append(starts, len(tokens)))
    else:
        off = tmp_path / "off.bin"
        starts.astype(np.int64).tofile(off)
    _, stats = convert(str(tmp_path / "tokens.npy"), str(tmp_path / "ds"), offsets=str(off),
                       vocab_size=EOT + 1)  # fmt: skip
    assert stats.documents == len(docs) == stats.total_documents
    got = read_documents(str(tmp_path / "ds"))
    assert len(got) == len(docs) and all(
        np.array_equal(g, d) for g, d in zip(got, docs, strict=True)
    )


def test_a_raw_bin_split_at_the_end_of_text_token(tmp_path: Path) -> None:
    # nanoGPT's train.bin: uint16 tokens, an end-of-text token after every document
    docs = [np.append(d, EOT) for d in corpus(4, 80)]
    docs.append(np.array([5, 6, 7]))  # a last document without one
    np.concatenate(docs).astype(np.uint16).tofile(tmp_path / "train.bin")
    with pytest.raises(InputError, match="needs its dtype"):
        convert(str(tmp_path / "train.bin"), str(tmp_path / "x"), eos_id=EOT)
    with pytest.raises(InputError, match=r"an offsets file .* or the end-of-document id"):
        convert(str(tmp_path / "train.bin"), str(tmp_path / "x"), dtype="uint16")
    manifest, _ = convert(str(tmp_path / "train.bin"), str(tmp_path / "ds"), dtype="uint16",
                          eos_id=EOT)  # fmt: skip
    assert manifest.eos_id == EOT and manifest.vocab_size == EOT + 1
    got = read_documents(str(tmp_path / "ds"))
    assert len(got) == len(docs) and all(
        np.array_equal(g, d) for g, d in zip(got, docs, strict=True)
    )


def test_bad_offsets_are_named(tmp_path: Path) -> None:
    np.save(tmp_path / "t.npy", np.arange(100, dtype=np.int32))
    cases = {
        "start.npy": (np.array([3, 10]), "must start at 0"),
        "back.npy": (np.array([0, 20, 10]), r"offset 2 \(10\) comes before offset 1 \(20\)"),
        "past.npy": (np.array([0, 50, 101]), r"offset 2 \(101\) is past the 100 tokens"),
        "float.npy": (np.array([0.0, 1.0]), "must be integers"),
    }
    for name, (arr, match) in cases.items():
        np.save(tmp_path / name, arr)
        with pytest.raises(InputError, match=match):
            convert(str(tmp_path / "t.npy"), str(tmp_path / "o"), offsets=str(tmp_path / name))
    assert not (tmp_path / "o" / "manifest.json").exists()
