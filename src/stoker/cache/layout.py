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
import threading
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

    The parts go to the kernel as they are (one ``writev``, the interpreter lock released):
    no joined copy of the block is made, and the flags come from a buffer this thread
    reuses. Raises OSError (ENOSPC when the filesystem is full) and leaves nothing behind.
    """
    n = len(toks)
    toks = np.ascontiguousarray(toks)
    flags = _flags(n)
    pad = flags_offset(n, toks.dtype.itemsize) - n * toks.dtype.itemsize
    parts = [toks.data.cast("B"), memoryview(_ZEROS)[:pad], flags.data]
    tmp = path.with_name(path.name + ".tmp")
    flags[starts] = 1
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            while parts:
                done = os.writev(fd, parts)
                while parts and done >= len(parts[0]):
                    done -= len(parts[0])
                    parts.pop(0)
                if parts and done:
                    parts[0] = parts[0][done:]
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except OSError:
        tmp.unlink(missing_ok=True)
        raise
    finally:
        flags[starts] = 0  # the buffer is all zeros again for the next block


_ZEROS = bytes(8)
_POPULATE = getattr(mmap, "MAP_POPULATE", 0)
_local = threading.local()


def _flags(n: int) -> np.ndarray:
    """This thread's zeroed flag buffer of ``n`` bytes (grown when a block is longer)."""
    buf: np.ndarray | None = getattr(_local, "flags", None)
    if buf is None or len(buf) < n:
        buf = _local.flags = np.zeros(n, dtype=np.uint8)
    return buf[:n]


def map_block(path: str | Path, tokens: int, dtype: np.dtype) -> tuple[np.ndarray, np.ndarray]:
    """Read-only views of a decoded block file: its tokens and its document-start flags."""
    fd = os.open(path, os.O_RDONLY)
    try:
        # populated now, on the thread that maps it: the reader's copies take no page faults
        mm = mmap.mmap(fd, 0, flags=mmap.MAP_SHARED | _POPULATE, prot=mmap.PROT_READ)
    finally:
        os.close(fd)
    toks = np.frombuffer(mm, dtype=dtype, count=tokens)
    flags = np.frombuffer(
        mm, dtype=np.bool_, count=tokens, offset=flags_offset(tokens, dtype.itemsize)
    )
    return toks, flags
