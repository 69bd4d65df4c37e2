"""Megatron-LM / NeMo indexed datasets (a ``.bin`` of tokens beside a ``.idx``), read
for conversion.

The ``.idx`` holds a 9-byte magic (``MMIDIDX`` and two zero bytes), a version (1,
little-endian uint64), the tokens' dtype code (uint8), the number of sequences and
of document boundaries (uint64 each), then every sequence's length (int32), its
byte offset in the ``.bin`` (int64), and the boundaries: the sequence index where
each document starts, from 0 to the number of sequences (int64). (A multimodal
index adds one mode byte per sequence after them.) A document is the sequences
between two boundaries, its tokens contiguous in the ``.bin``.

Both files are memory-mapped and read a document at a time: nothing is held but
the document being written. Every inconsistency (magic, version, dtype, counts
against the file's size, boundaries or offsets out of order, a ``.bin`` shorter
than the index says) is an :class:`~stoker.errors.InputError` naming the file and
the byte offset or the entry at fault (a ``.bin`` must end where its last
sequence does: one that is longer or shorter belongs to another index).
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from stoker.converters.scan import largest_id
from stoker.errors import InputError

MAGIC = b"MMIDIDX\x00\x00"
#: The dtype codes of Megatron's index; float codes (6, 7) hold no token ids.
DTYPES: dict[int, type[np.integer]] = {
    1: np.uint8, 2: np.int8, 3: np.int16, 4: np.int32, 5: np.int64, 8: np.uint16,
}  # fmt: skip
_HEADER = len(MAGIC) + 8 + 1 + 8 + 8
#: Entries checked at a time when the index is validated (bounded memory).
_CHUNK = 1 << 20


def paths(src: str) -> tuple[str, str]:
    """The ``.idx`` and ``.bin`` of a dataset named by its prefix or by either file."""
    for ext in (".idx", ".bin"):
        if src.endswith(ext):
            src = src[: -len(ext)]
            break  # one suffix: a prefix may end in .bin or .idx itself
    return src + ".idx", src + ".bin"


def is_megatron(src: str) -> bool:
    idx, bin_ = paths(src)
    return os.path.isfile(idx) and os.path.isfile(bin_)


@dataclass(frozen=True)
class MegatronIndex:
    """An opened, validated Megatron index and its token file."""

    idx_path: str
    bin_path: str
    dtype: np.dtype
    lengths: np.ndarray  # int32, tokens per sequence
    pointers: np.ndarray  # int64, byte offset of each sequence in the .bin
    bounds: np.ndarray  # int64, sequence index where each document starts (and the end)
    tokens: np.ndarray  # the .bin, as tokens

    @property
    def num_documents(self) -> int:
        return len(self.bounds) - 1

    @property
    def num_tokens(self) -> int:
        return len(self.tokens)

    @property
    def total_documents(self) -> int:
        return self.num_documents

    def documents(self) -> Iterator[tuple[np.ndarray, str]]:
        """Each document's tokens, in order (views of the mapped ``.bin``), and where it
        is, for messages."""
        item = self.dtype.itemsize
        for d in range(self.num_documents):
            s0, s1 = int(self.bounds[d]), int(self.bounds[d + 1])
            if s0 == s1:
                yield self.tokens[:0], f"{self.bin_path}: document {d}"
                continue
            lo = int(self.pointers[s0]) // item
            hi = int(self.pointers[s1 - 1]) // item + int(self.lengths[s1 - 1])
            yield (
                self.tokens[lo:hi],
                f"{self.bin_path}: document {d} (tokens from byte {lo * item})",
            )

    def largest(self) -> int:
        return largest_id(self.tokens, self.bin_path)


def open_index(src: str) -> MegatronIndex:
    """Open and check the Megatron dataset ``src`` (its prefix, ``.idx`` or ``.bin``)."""
    idx_path, bin_path = paths(src)
    for p in (idx_path, bin_path):
        if not os.path.isfile(p):
            raise InputError(f"{p}: not found (a Megatron dataset is a .bin beside a .idx)")
    size = os.path.getsize(idx_path)
    with open(idx_path, "rb") as f:
        head = f.read(_HEADER)
    if len(head) < _HEADER or head[: len(MAGIC)] != MAGIC:
        raise InputError(
            f"{idx_path}: not a Megatron index (bytes 0-{len(MAGIC) - 1} are "
            f"{head[: len(MAGIC)]!r}, expected {MAGIC!r})"
        )
    (version,) = struct.unpack_from("<Q", head, len(MAGIC))
    if version != 1:
        raise InputError(
            f"{idx_path}: index version {version} at byte {len(MAGIC)}; only 1 is known"
        )
    code = head[len(MAGIC) + 8]
    if code not in DTYPES:
        raise InputError(
            f"{idx_path}: dtype code {code} at byte {len(MAGIC) + 8} is not an integer token "
            f"dtype (known: {', '.join(f'{k} {v.__name__}' for k, v in DTYPES.items())})"
        )
    dtype = np.dtype(DTYPES[code])
    n_seq, n_bounds = struct.unpack_from("<QQ", head, len(MAGIC) + 9)
    need = _HEADER + 4 * n_seq + 8 * n_seq + 8 * n_bounds
    if n_bounds < 1 or size < need:
        raise InputError(
            f"{idx_path}: {size} bytes, but its header (at byte {len(MAGIC) + 9}) counts "
            f"{n_seq} sequences and {n_bounds} document boundaries, which need {need} bytes"
        )
    mm = np.memmap(idx_path, dtype=np.uint8, mode="r")
    lengths = np.frombuffer(mm, np.int32, n_seq, _HEADER)
    pointers = np.frombuffer(mm, np.int64, n_seq, _HEADER + 4 * n_seq)
    bounds = np.frombuffer(mm, np.int64, n_bounds, _HEADER + 12 * n_seq)
    bin_size = os.path.getsize(bin_path)
    if bin_size % dtype.itemsize:
        raise InputError(f"{bin_path}: {bin_size} bytes, not a whole number of {dtype} tokens")
    tokens = np.memmap(bin_path, dtype=dtype, mode="r") if bin_size else np.zeros(0, dtype)
    _check(idx_path, bin_path, lengths, pointers, bounds, dtype.itemsize, bin_size)
    return MegatronIndex(idx_path, bin_path, dtype, lengths, pointers, bounds, tokens)


def _check(
    idx_path: str,
    bin_path: str,
    lengths: np.ndarray,
    pointers: np.ndarray,
    bounds: np.ndarray,
    item: int,
    bin_size: int,
) -> None:
    """The index's entries against each other and the ``.bin``, a chunk at a time."""
    n = len(lengths)
    if int(bounds[0]) != 0 or int(bounds[-1]) != n:
        raise InputError(
            f"{idx_path}: the document boundaries run from {int(bounds[0])} to "
            f"{int(bounds[-1])}, not from 0 to its {n} sequences"
        )
    for lo in range(0, len(bounds), _CHUNK):
        b = bounds[lo : lo + _CHUNK + 1]
        back = np.flatnonzero(np.diff(b) < 0)
        if len(back):
            d = lo + int(back[0]) + 1
            raise InputError(
                f"{idx_path}: document boundary {d} ({int(bounds[d])}) comes before "
                f"boundary {d - 1} ({int(bounds[d - 1])})"
            )
    end = 0  # where the sequences so far end in the .bin, bytes
    for lo in range(0, n, _CHUNK):
        ln = lengths[lo : lo + _CHUNK].astype(np.int64)
        pt = pointers[lo : lo + _CHUNK]
        if len(ln) and int(ln.min()) < 0:
            s = lo + int(np.argmin(ln))
            raise InputError(f"{idx_path}: sequence {s} has length {int(lengths[s])}")
        starts = np.concatenate([[end], pt[:-1] + ln[:-1] * item])
        off = np.flatnonzero(pt != starts)
        if len(off):
            s = lo + int(off[0])
            raise InputError(
                f"{idx_path}: sequence {s} starts at byte {int(pointers[s])} of the .bin, "
                f"but the sequences before it end at byte {int(starts[off[0]])}"
            )
        if len(ln):
            end = int(pt[-1] + ln[-1] * item)
    if end != bin_size:
        raise InputError(
            f"{bin_path}: {bin_size} bytes, but its index ({idx_path}) puts the last "
            f"sequence's end at byte {end}: the two files do not belong together"
        )
