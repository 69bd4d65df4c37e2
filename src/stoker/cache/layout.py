"""The decoded-block file: how the node agent's memory tier lays out a decoded block.

One file per block in shared memory: the tokens in the dataset's dtype, zero
padding to a multiple of 8 bytes, then the block's document starts as
little-endian uint32 offsets, ascending (the rest of the file: as many as the
block has, none for a block without one). The agent writes it
(:func:`write_decoded`, aside and renamed, so a reader never maps half a file);
every local process maps it read-only (:func:`map_block`) and reads windows
straight out of it. (Until protocol 2 the starts were one byte per token, half
again the tokens' bytes; as offsets a block takes a third less shared memory and
a third less writing and mapping.)
"""

from __future__ import annotations

import mmap
import os
from pathlib import Path

import numpy as np


def starts_offset(tokens: int, itemsize: int) -> int:
    """Where the document starts begin: after the tokens, padded to 8 bytes."""
    return -(-tokens * itemsize // 8) * 8


def decoded_size(tokens: int, itemsize: int, starts: int) -> int:
    """Bytes of a decoded block file of ``tokens`` tokens of ``itemsize`` bytes and
    ``starts`` document starts."""
    return starts_offset(tokens, itemsize) + 4 * starts


def write_decoded(path: Path, toks: np.ndarray, starts: np.ndarray) -> None:
    """Write a decoded block file (tokens, padding to 8 bytes, starts) aside, then rename it.

    The parts go to the kernel as they are (one ``writev``, the interpreter lock released):
    no joined copy of the block is made. Raises OSError (ENOSPC when the filesystem is
    full) and leaves nothing behind.
    """
    n = len(toks)
    toks = np.ascontiguousarray(toks)
    offsets = np.ascontiguousarray(starts, dtype="<u4")
    pad = starts_offset(n, toks.dtype.itemsize) - n * toks.dtype.itemsize
    parts = [p for p in (toks.data.cast("B"), memoryview(_ZEROS)[:pad], offsets.data.cast("B"))
             if len(p)]  # fmt: skip
    write_parts(path, parts)


def write_parts(path: Path, parts: list[memoryview]) -> None:
    """Write ``parts`` back to back to ``path``, aside and then renamed (``writev``, the
    interpreter lock released; no joined copy). Raises OSError and leaves nothing behind."""
    parts = list(parts)
    tmp = path.with_name(path.name + ".tmp")
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


_ZEROS = bytes(8)
_POPULATE = getattr(mmap, "MAP_POPULATE", 0)


def map_block(path: str | Path, tokens: int, dtype: np.dtype) -> tuple[np.ndarray, np.ndarray]:
    """Read-only views of a decoded block file: its tokens and its document starts."""
    fd = os.open(path, os.O_RDONLY)
    try:
        # populated now, on the thread that maps it: the reader's copies take no page faults
        mm = mmap.mmap(fd, 0, flags=mmap.MAP_SHARED | _POPULATE, prot=mmap.PROT_READ)
    finally:
        os.close(fd)
    toks = np.frombuffer(mm, dtype=dtype, count=tokens)
    at = starts_offset(tokens, dtype.itemsize)
    starts = np.frombuffer(mm, dtype="<u4", count=(len(mm) - at) // 4, offset=at)
    return toks, starts
