"""The decoded-block file: how the node agent's memory tier lays out a decoded block.

One file per block in shared memory: the tokens in the dataset's dtype, zero
padding to a multiple of 8 bytes, then one byte per token, 1 where a document
starts. The agent writes it (:func:`write_decoded`, aside and renamed, so a
reader never maps half a file); every local process maps it read-only
(:func:`map_block`) and reads windows straight out of it.
"""

from __future__ import annotations

import mmap
import os
from pathlib import Path

import numpy as np


def flags_offset(tokens: int, itemsize: int) -> int:
    """Where the flag bytes start: after the tokens, padded to 8 bytes."""
    return -(-tokens * itemsize // 8) * 8


def decoded_size(tokens: int, itemsize: int) -> int:
    """Bytes of a decoded block file of ``tokens`` tokens of ``itemsize`` bytes."""
    return flags_offset(tokens, itemsize) + tokens


def write_decoded(path: Path, toks: np.ndarray, starts: np.ndarray) -> None:
    """Write a decoded block file (tokens, padding to 8 bytes, flags) aside, then rename it.

    Raises OSError (ENOSPC when the filesystem is full) and leaves nothing behind.
    """
    n = len(toks)
    flags = np.zeros(n, dtype=np.uint8)
    flags[starts] = 1
    pad = flags_offset(n, toks.dtype.itemsize) - n * toks.dtype.itemsize
    data = memoryview(
        b"".join([np.ascontiguousarray(toks).tobytes(), b"\0" * pad, flags.tobytes()])
    )
    tmp = path.with_name(path.name + ".tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            while data:
                data = data[os.write(fd, data) :]
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except OSError:
        tmp.unlink(missing_ok=True)
        raise


def map_block(path: str | Path, tokens: int, dtype: np.dtype) -> tuple[np.ndarray, np.ndarray]:
    """Read-only views of a decoded block file: its tokens and its document-start flags."""
    fd = os.open(path, os.O_RDONLY)
    try:
        mm = mmap.mmap(fd, 0, prot=mmap.PROT_READ)
    finally:
        os.close(fd)
    toks = np.frombuffer(mm, dtype=dtype, count=tokens)
    flags = np.frombuffer(
        mm, dtype=np.bool_, count=tokens, offset=flags_offset(tokens, dtype.itemsize)
    )
    return toks, flags
