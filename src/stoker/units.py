"""Byte sizes written the way people write them: ``200G``, ``512MiB``, ``1.5T``, ``4096``."""

from __future__ import annotations

import re

_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40, "p": 1 << 50}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgtp]?)(?:i?b)?\s*$", re.IGNORECASE)


def parse_size(text: str | int) -> int:
    """Bytes in ``text``; the suffixes K, M, G, T, P (with or without ``B``/``iB``) are powers of 1024."""
    if isinstance(text, int):
        return text
    m = _SIZE.match(text)
    if m is None:
        raise ValueError(f"not a size: {text!r} (examples: 4096, 512M, 200G, 1.5TiB)")
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])
