"""Helpers shared by the integration tests: small datasets with a known token stream."""

from __future__ import annotations

import itertools
import json
import shutil
import socket
import stat
import subprocess
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import stoker
from stoker import TokenWriter, WriteOptions


@dataclass(frozen=True)
class Written:
    """A dataset written to ``path`` and the token stream it must read back as."""

    path: Path
    manifest: stoker.Manifest
    stream: np.ndarray  # int64, every token in order (EOS included)
    starts: np.ndarray  # bool, True where a document starts

    def num_samples(self, seq_len: int) -> int:
        return (len(self.stream) - 1) // seq_len

    def sample(self, sample_id: int, seq_len: int) -> tuple[np.ndarray, np.ndarray]:
        """Expected ``tokens`` and ``doc_start_mask`` of a sample."""
        lo = sample_id * seq_len
        return self.stream[lo : lo + seq_len + 1], self.starts[lo : lo + seq_len + 1]

    def blocks_needed(self, seq_len: int) -> int:
        """How many blocks (from block 0) an epoch of ``seq_len`` samples touches."""
        last_token = self.num_samples(seq_len) * seq_len  # last token of the last sample
        return last_token // self.manifest.block_tokens + 1

    def block_range(self, block: int) -> tuple[int, int]:
        bt = self.manifest.block_tokens
        return block * bt, min((block + 1) * bt, len(self.stream))

    def copy_to(self, dest: Path) -> Written:
        """The same dataset in another directory (to corrupt or edit it)."""
        shutil.copytree(self.path, dest)
        return Written(dest, self.manifest, self.stream, self.starts)

    # -- editing --------------------------------------------------------------------
    def manifest_dict(self) -> dict[str, Any]:
        return json.loads((self.path / "manifest.json").read_text())

    def write_manifest(self, raw: dict[str, Any] | str) -> None:
        text = raw if isinstance(raw, str) else json.dumps(raw)
        (self.path / "manifest.json").write_text(text)

    def index(self) -> np.ndarray:
        from stoker.manifest import INDEX_DTYPE

        return np.frombuffer((self.path / self.manifest.index.path).read_bytes(), INDEX_DTYPE)

    def record_span(self, block: int) -> tuple[str, int, int]:
        """(data file, start, stop) of a block's record."""
        entry = self.index()[block]
        start = int(entry["offset"])
        stop = start + int(entry["token_bytes"]) + int(entry["bounds_bytes"])
        return self.manifest.block_file(block).path, start, stop


def make_documents(
    num_docs: int, *, vocab_size: int, seed: int, max_len: int = 300
) -> list[np.ndarray]:
    """Random documents of 0..max_len tokens (some empty) that avoid the EOS id 0."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(0, max_len, size=num_docs)
    return [rng.integers(1, vocab_size, size=n, dtype=np.int64) for n in lengths]


def write_dataset(
    path: Path,
    *,
    num_docs: int = 80,
    vocab_size: int = 50_000,
    seed: int = 0,
    block_tokens: int = 512,
    blocks_per_file: int | None = 4,
    shuffle: bool = False,
    dictionary: bool = False,
    max_len: int = 300,
) -> Written:
    """Write a dataset with a known stream (EOS id 0 after every non-empty document)."""
    docs = make_documents(num_docs, vocab_size=vocab_size, seed=seed, max_len=max_len)
    options = WriteOptions(
        block_tokens=block_tokens,
        blocks_per_file=blocks_per_file,
        shuffle=shuffle,
        dictionary=dictionary,
        dictionary_size=4096,
        threads=2,
    )
    writer = TokenWriter(str(path), vocab_size=vocab_size, eos_id=0, options=options)
    writer.extend(docs)
    manifest = writer.close()
    pieces, starts = [], []
    pos = 0
    for doc in docs:
        # write_tokens appends EOS to every document, so an empty one still
        # contributes a one-token document.
        full = np.append(doc, 0)
        pieces.append(full)
        starts.append(pos)
        pos += len(full)
    stream = np.concatenate(pieces).astype(np.int64)
    mask = np.zeros(len(stream), dtype=bool)
    mask[starts] = True
    assert manifest.num_tokens == len(stream)
    return Written(Path(path), manifest, stream, mask)


def check_samples(written: Written, seq_len: int, items: Iterable[dict[str, Any]]) -> list[int]:
    """Check each item's tokens and mask against the stream; returns the sample ids."""
    ids = []
    for item in items:
        sid = int(item["sample_id"])
        tokens, mask = written.sample(sid, seq_len)
        got = np.asarray(item["tokens"])
        assert got.dtype == np.int64, got.dtype
        np.testing.assert_array_equal(got, tokens, err_msg=f"tokens of sample {sid}")
        if "doc_start_mask" in item:
            np.testing.assert_array_equal(
                np.asarray(item["doc_start_mask"]), mask, err_msg=f"mask of sample {sid}"
            )
        ids.append(sid)
    return ids


def unbatch(batches: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Collated batches -> per-sample dicts of numpy arrays."""
    out = []
    for batch in batches:
        ids = batch["sample_id"].tolist()
        for i, sid in enumerate(ids):
            item = {"sample_id": sid, "tokens": batch["tokens"][i].numpy()}
            if "doc_start_mask" in batch:
                item["doc_start_mask"] = batch["doc_start_mask"][i].numpy()
            out.append(item)
    return out


def assert_exactly_once(ids: Iterable[int], num_samples: int) -> None:
    counts = Counter(ids)
    dupes = {k: v for k, v in counts.items() if v != 1}
    missing = set(range(num_samples)) - set(counts)
    extra = set(counts) - set(range(num_samples))
    assert not dupes and not missing and not extra, (
        f"duplicates {sorted(dupes.items())[:10]}, missing {sorted(missing)[:10]} "
        f"({len(missing)}), out of range {sorted(extra)[:10]}"
    )


def dir_bytes(path: Path) -> int:
    """Bytes of every file under ``path`` (temporary files included); a file removed
    while the tree is walked (another thread may be evicting) counts as gone."""
    total = 0
    for p in Path(path).rglob("*"):
        try:
            st = p.stat()
        except FileNotFoundError:
            continue
        if stat.S_ISREG(st.st_mode):
            total += st.st_size
    return total


def closed_by_peer(s: socket.socket, timeout: float = 60.0) -> bool:
    """Whether the server closes ``s`` within ``timeout`` (reading what it sends first)."""
    s.settimeout(timeout)
    try:
        while s.recv(65536):
            pass
    except TimeoutError:
        return False
    except ConnectionResetError:
        pass
    return True


def reap(proc: subprocess.Popen[Any], timeout: float | None = None) -> int:
    """Kill ``proc`` unless it has exited, close its pipes and wait for it; its exit code."""
    if proc.poll() is None:
        proc.kill()
    try:
        with proc:  # closes stdout, stderr and stdin, then waits
            pass
    except BrokenPipeError:
        pass  # what was left to write to its stdin: it is gone
    return proc.wait(timeout)


def read_documents(url: str) -> list[np.ndarray]:
    """The documents of a token dataset, by its recorded document starts."""
    src = stoker.TokenSource(url)
    m = src.manifest
    toks = src.tokens(0, m.num_tokens)
    bounds = [int(s) + b * m.block_tokens for b in range(m.num_blocks) for s in src.block(b)[1]]
    return [toks[lo:hi] for lo, hi in itertools.pairwise([*bounds, m.num_tokens])]


def photo_jpeg(rng: np.random.Generator, h: int, w: int, quality: int | None = None) -> bytes:
    """A small photograph-like JPEG: smooth gradients with noise (not pure noise)."""
    import io

    from PIL import Image

    y, x = np.mgrid[0:h, 0:w]
    base = np.stack([x * 255 // max(w, 1), y * 255 // max(h, 1), (x + y) % 256], axis=-1)
    img = np.clip(base + rng.normal(0, 12, size=base.shape), 0, 255).astype(np.uint8)
    out = io.BytesIO()
    q = quality if quality is not None else int(rng.integers(75, 96))
    Image.fromarray(img).save(out, format="JPEG", quality=q)
    return out.getvalue()


@pytest.fixture
def one_rank(monkeypatch: pytest.MonkeyPatch) -> None:
    """No torchrun or coordinator variables from the environment (a test's one rank)."""
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "STOKER_COORDINATOR"):
        monkeypatch.delenv(name, raising=False)


def photo_records(
    out: Path, n: int, seed: int, sides: tuple[int, int], labels: tuple[int, int], block_bytes: int
) -> Path:
    """A records dataset of ``n`` photo-like JPEGs (each side in ``sides``), row ``i``
    labelled ``(i * labels[0]) % labels[1]``; uncompressed, as datasets of full-size JPEGs
    are stored ("auto" would compress these small ones: their headers are a large share)."""
    import stoker

    rng = np.random.default_rng(seed)
    lo, hi = sides
    rows = [
        {"image": photo_jpeg(rng, int(rng.integers(lo, hi)), int(rng.integers(lo, hi))),
         "label": (i * labels[0]) % labels[1]}
        for i in range(n)
    ]  # fmt: skip
    stoker.write_records(rows, str(out), schema={"image": "binary", "label": "int64"},
                         block_bytes=block_bytes, compression="none")  # fmt: skip
    return out


def same_batches(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> bool:
    """The same batches: the same fields, equal tensors, in the same order."""
    import torch

    return len(a) == len(b) and all(
        set(x) == set(y) and all(torch.equal(x[k], y[k]) for k in x) for x, y in zip(a, b)
    )
