"""`stoker convert` from Megatron-LM / NeMo indexed datasets written by Megatron's own
writer (megatron-core, in a process of its own): token for token, document boundaries
kept, and bad inputs named by file and offset."""

from __future__ import annotations

import importlib.util
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import stoker
from stoker.converters import convert
from stoker.errors import InputError

from ._megatron_docs import EOD, documents
from .helpers import read_documents

if importlib.util.find_spec("megatron") is None:  # not imported here: the writer runs apart
    pytest.skip("megatron-core (a test dependency) writes the inputs", allow_module_level=True)

WRITER = Path(__file__).with_name("_megatron_write.py")


def write(
    prefix: Path, seed: int = 3, n: int = 300, vocab: int = 50_000, dtype: str = "int32"
) -> Path:
    subprocess.run([sys.executable, str(WRITER), str(prefix), str(seed), str(n), str(vocab), dtype],
                   check=True, timeout=300)  # fmt: skip
    return prefix


@pytest.fixture(scope="module")
def megatron(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write(tmp_path_factory.mktemp("megatron") / "corpus_text_document")


def expected(seed: int = 3, n: int = 300, vocab: int = 50_000) -> list[np.ndarray]:
    return [
        np.concatenate(seqs) if seqs else np.zeros(0, np.int64)
        for seqs in documents(seed, n, vocab)
    ]


@pytest.mark.parametrize("named", ["prefix", "idx", "bin"])
def test_a_megatron_dataset_converts_token_for_token(
    megatron: Path, tmp_path: Path, named: str
) -> None:
    src = {"prefix": str(megatron), "idx": f"{megatron}.idx", "bin": f"{megatron}.bin"}[named]
    manifest, stats = convert(src, str(tmp_path / "ds"), eos_id=EOD, vocab_size=50_000)
    want = expected()
    nonempty = [d for d in want if len(d)]
    assert stats.documents == len(want) and stats.empty == len(want) - len(nonempty)
    assert manifest.num_documents == len(nonempty)
    assert manifest.num_tokens == sum(len(d) for d in want) == stats.tokens
    assert manifest.vocab_size == 50_000 and manifest.eos_id == EOD
    got = read_documents(str(tmp_path / "ds"))
    assert len(got) == len(nonempty)
    for g, w in zip(got, nonempty, strict=True):  # every document, boundaries included
        assert np.array_equal(g, w)
    assert stoker.verify(str(tmp_path / "ds")).ok


def test_the_cli_converts_and_infers_the_vocabulary(megatron: Path, tmp_path: Path) -> None:
    out = tmp_path / "ds"
    r = subprocess.run([sys.executable, "-m", "stoker.cli", "convert", str(megatron), "--out", str(out),
                        "--quiet", "--block-tokens", "256"],
                       capture_output=True, text=True, timeout=120)  # fmt: skip
    assert r.returncode == 0, r.stderr
    top = max(int(d.max()) for d in expected() if len(d))
    m = stoker.TokenSource(str(out)).manifest
    assert m.vocab_size == top + 1 and m.block_tokens == 256
    assert "empty documents hold no token" in r.stdout
    # a uint16 source: a narrower dtype, the same tokens
    small = write(tmp_path / "u16", seed=5, n=40, vocab=60_000, dtype="uint16")
    manifest, _ = convert(str(small), str(tmp_path / "ds16"), vocab_size=60_000)
    assert manifest.dtype == "uint16"
    got = np.concatenate(read_documents(str(tmp_path / "ds16")))
    assert np.array_equal(got, np.concatenate([d for d in expected(5, 40, 60_000) if len(d)]))


def copy(megatron: Path, dest: Path) -> Path:
    for ext in (".idx", ".bin"):
        (dest.parent / (dest.name + ext)).write_bytes(Path(f"{megatron}{ext}").read_bytes())
    return dest


def test_bad_inputs_are_named_by_file_and_offset(megatron: Path, tmp_path: Path) -> None:
    bad = copy(megatron, tmp_path / "bad")
    idx, bin_ = Path(f"{bad}.idx"), Path(f"{bad}.bin")
    raw = bytearray(idx.read_bytes())
    # a .bin cut short
    bin_.write_bytes(Path(f"{megatron}.bin").read_bytes()[:-8])
    with pytest.raises(InputError, match=r"bad\.bin: \d+ bytes, but its index .* byte \d+"):
        convert(str(bad), str(tmp_path / "o1"))
    bin_.write_bytes(Path(f"{megatron}.bin").read_bytes())
    # not an index
    idx.write_bytes(b"NOTANIDX" + bytes(raw[8:]))
    with pytest.raises(InputError, match=r"bad\.idx: not a Megatron index \(bytes 0-8"):
        convert(str(bad), str(tmp_path / "o2"))
    # a float dtype holds no token ids
    f = bytearray(raw)
    f[17] = 7
    idx.write_bytes(bytes(f))
    with pytest.raises(InputError, match=r"dtype code 7 at byte 17"):
        convert(str(bad), str(tmp_path / "o3"))
    # a sequence offset out of line
    n_seq, _ = struct.unpack_from("<QQ", raw, 18)
    o = bytearray(raw)
    at = 34 + 4 * n_seq + 8 * 10  # sequence 10's pointer
    struct.pack_into("<q", o, at, struct.unpack_from("<q", raw, at)[0] + 4)
    idx.write_bytes(bytes(o))
    with pytest.raises(InputError, match=r"sequence 10 starts at byte \d+ of the \.bin, but"):
        convert(str(bad), str(tmp_path / "o4"))
    # a token outside the vocabulary given: the document and its byte offset
    idx.write_bytes(bytes(raw))
    with pytest.raises(
        InputError, match=r"bad\.bin: document \d+ \(tokens from byte \d+\): .*outside"
    ):
        convert(str(bad), str(tmp_path / "o5"), vocab_size=10)
    for o in ("o1", "o2", "o3", "o4", "o5"):
        assert not (tmp_path / o / "manifest.json").exists()  # nothing half-written
    assert not (tmp_path / "missing.idx").exists()
    with pytest.raises(InputError, match="cannot tell its format"):
        convert(str(tmp_path / "missing"), str(tmp_path / "o6"))
