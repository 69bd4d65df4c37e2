"""Flat token arrays, read for conversion: a ``.npy`` array (or a raw ``.bin`` of a
given dtype) of every token in order, with the documents given by an offsets file
(``.npy``, or a raw ``.bin`` of int64) or by an end-of-document token.

Offsets are either every document's first token (starting at 0) or the boundaries
too (starting at 0 and ending at the number of tokens); they must not go back or
past the end. Split at an end-of-document id, each document ends with it (a last
document without one keeps what is left). The token file is memory-mapped and read
a document at a time.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from stoker.converters.scan import largest_id
from stoker.errors import InputError


def _array(path: str, dtype: str | None, what: str) -> np.ndarray:
    if not os.path.isfile(path):
        raise InputError(f"{path}: not found")
    if path.endswith(".npy"):
        try:
            arr = np.load(path, mmap_mode="r", allow_pickle=False)
        except (ValueError, OSError) as exc:
            raise InputError(f"{path}: not a readable .npy file ({exc})") from exc
    else:
        if dtype is None:
            raise InputError(f"{path}: a raw {what} file needs its dtype (--dtype)")
        try:
            dt = np.dtype(dtype)
        except TypeError as exc:
            raise InputError(f"{dtype!r} is not a numpy dtype") from exc
        size = os.path.getsize(path)
        if size % dt.itemsize:
            raise InputError(f"{path}: {size} bytes, not a whole number of {dt} values")
        arr = np.memmap(path, dtype=dt, mode="r") if size else np.zeros(0, dt)
    if arr.ndim != 1:
        raise InputError(f"{path}: a {arr.ndim}-D array; {what} must be 1-D")
    if not np.issubdtype(arr.dtype, np.integer):
        raise InputError(f"{path}: dtype {arr.dtype}; {what} must be integers")
    return np.asarray(arr)


@dataclass
class FlatSource:
    tokens_path: str
    tokens: np.ndarray
    bounds: np.ndarray | None  # document boundaries, 0 .. len(tokens); None: split at eos
    eos_id: int | None

    @property
    def total_documents(self) -> int | None:
        return None if self.bounds is None else len(self.bounds) - 1

    def documents(self) -> Iterator[tuple[np.ndarray, str]]:
        item = self.tokens.dtype.itemsize
        if self.bounds is not None:
            for d in range(len(self.bounds) - 1):
                lo, hi = int(self.bounds[d]), int(self.bounds[d + 1])
                yield self.tokens[lo:hi], f"{self.tokens_path}: document {d} (byte {lo * item})"
            return
        assert self.eos_id is not None
        lo, d, chunk = 0, 0, 1 << 22
        for start in range(0, len(self.tokens), chunk):
            part = self.tokens[start : start + chunk]
            for end in np.flatnonzero(part == self.eos_id) + start + 1:
                yield self.tokens[lo:end], f"{self.tokens_path}: document {d} (byte {lo * item})"
                lo, d = int(end), d + 1
        if lo < len(self.tokens):
            yield self.tokens[lo:], f"{self.tokens_path}: document {d} (byte {lo * item})"

    def largest(self) -> int:
        return largest_id(self.tokens, self.tokens_path)


def open_flat(
    tokens_path: str, offsets_path: str | None, dtype: str | None, eos_id: int | None
) -> FlatSource:
    """The flat token array at ``tokens_path`` with its documents from ``offsets_path``,
    or split at ``eos_id`` when there is no offsets file."""
    tokens = _array(tokens_path, dtype, "tokens")
    if offsets_path is None:
        if eos_id is None:
            raise InputError(
                f"{tokens_path}: a flat token array needs its documents: an offsets file "
                "(--offsets) or the end-of-document id to split at (--eos-id)"
            )
        return FlatSource(tokens_path, tokens, None, eos_id)
    offs = np.asarray(_array(offsets_path, "int64", "offsets"), dtype=np.int64)
    n = len(tokens)
    if not len(offs) or int(offs[0]) != 0:
        raise InputError(
            f"{offsets_path}: offsets must start at 0 (the first document's first token)"
        )
    back = np.flatnonzero(np.diff(offs) < 0)
    if len(back):
        i = int(back[0]) + 1
        raise InputError(
            f"{offsets_path}: offset {i} ({int(offs[i])}) comes before offset {i - 1} ({int(offs[i - 1])})"
        )
    if int(offs[-1]) > n:
        i = int(np.argmax(offs > n))
        raise InputError(
            f"{offsets_path}: offset {i} ({int(offs[i])}) is past the {n} tokens of {tokens_path}"
        )
    bounds = offs if int(offs[-1]) == n and len(offs) > 1 else np.append(offs, n)
    return FlatSource(tokens_path, tokens, bounds, eos_id)
