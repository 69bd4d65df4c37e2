"""Passes for the largest token id: over a mapped token array (pure numpy, bounded
memory), or over a converter's documents."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from stoker.errors import InputError

#: Tokens looked at a time.
CHUNK = 1 << 24


def largest_id(tokens: np.ndarray, where: str) -> int:
    """The largest token id in ``tokens`` (0 for none), a chunk at a time; a negative id
    is an :class:`~stoker.errors.InputError` naming ``where`` and the token's index and
    byte."""
    top = 0
    for lo in range(0, len(tokens), CHUNK):
        part = tokens[lo : lo + CHUNK]
        if len(part):
            if int(part.min()) < 0:
                at = lo + int(np.argmin(part))
                raise InputError(
                    f"{where}: token {at} (byte {at * tokens.dtype.itemsize}) is "
                    f"{int(tokens[at])}, a negative id"
                )
            top = max(top, int(part.max()))
    return top


def largest_of(documents: Iterator[tuple[np.ndarray, str]]) -> int:
    """The largest token id of ``documents`` (``(tokens, where)`` pairs; 0 for none); a
    negative id is an :class:`~stoker.errors.InputError` naming its document."""
    top = 0
    for doc, where in documents:
        if len(doc):
            if int(doc.min()) < 0:
                raise InputError(f"{where}: a negative token id ({int(doc.min())})")
            top = max(top, int(doc.max()))
    return top
