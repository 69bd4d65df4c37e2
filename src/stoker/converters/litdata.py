"""LitData optimized directories of token tensors, read for conversion: a directory with
an ``index.json`` written by ``litdata.optimize(..., item_loader=TokensLoader())`` and
its chunks (``chunk-W-N.bin``, or ``chunk-W-N.zstd.bin`` compressed whole with zstd).

A chunk holds its item count (uint32), every item's start and the end of the last as
absolute byte offsets (uint32), then the items: each a token tensor's raw values
(``no_header_tensor:CODE``, CODE LitData's dtype number), one document. The index
gives each chunk's file, items, tokens and uncompressed size, all checked. A chunk is
read (and decompressed) whole: at most its size limit. Other item loaders store
pytrees of pickled or encoded items, and are refused, never unpickled; so are
encrypted chunks and zstd frames inside a chunk (``compression_level="batch"``).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import zstandard

from stoker.converters.scan import largest_of
from stoker.errors import InputError

#: LitData's integer tensor dtypes by its dtype number (``litdata.constants``).
_DTYPES = {11: "uint8", 12: "int8", 13: "int16", 14: "int16", 15: "int32", 16: "int32",
           17: "int64", 18: "int64", 20: "uint16"}  # fmt: skip
_MAX_CHUNK = 1 << 31  # bytes of a chunk read at most (uint32 offsets)


def _index(src: str) -> dict[str, Any] | None:
    path = os.path.join(src, "index.json")
    if not os.path.isfile(path):
        return None
    try:
        with open(path) as f:
            index = json.load(f)
    except (OSError, ValueError):
        return None
    return index if isinstance(index, dict) else None


def is_litdata(src: str) -> bool:
    index = _index(src)
    if index is None:
        return False
    config, chunks = index.get("config"), index.get("chunks")
    return (
        isinstance(config, dict)
        and "item_loader" in config
        and "data_format" in config
        and isinstance(chunks, list)
    )


@dataclass(frozen=True)
class _Chunk:
    path: str
    items: int
    tokens: int
    size: int  # uncompressed bytes


@dataclass
class LitDataSource:
    src: str
    chunks: list[_Chunk]
    dtype: np.dtype[Any]
    compressed: bool

    @property
    def total_documents(self) -> int:
        return sum(c.items for c in self.chunks)

    def largest(self) -> int:
        """The largest token id (a pass over the chunks); refuses a negative one."""
        return largest_of(self.documents())

    def documents(self) -> Iterator[tuple[np.ndarray, str]]:
        for c in self.chunks:
            raw = self._read(c)
            offsets = self._offsets(c, raw)
            for i in range(c.items):
                a, b = int(offsets[i]), int(offsets[i + 1])
                yield (
                    np.frombuffer(raw, self.dtype, (b - a) // self.dtype.itemsize, a),
                    f"{c.path}: item {i} (byte {a})",
                )

    def _read(self, c: _Chunk) -> bytes:
        try:
            with open(c.path, "rb") as f:
                raw = f.read(_MAX_CHUNK + 1)
        except OSError as exc:
            raise InputError(f"{c.path}: cannot read this chunk ({exc})") from exc
        if self.compressed:
            try:
                raw = zstandard.ZstdDecompressor().decompress(raw, max_output_size=c.size)
            except zstandard.ZstdError as exc:
                raise InputError(f"{c.path}: not a zstd-compressed chunk ({exc})") from exc
        if len(raw) != c.size:
            raise InputError(
                f"{c.path}: {len(raw)} bytes, but index.json says the chunk holds {c.size}"
            )
        return raw

    def _offsets(self, c: _Chunk, raw: bytes) -> np.ndarray:
        head = 4 * (c.items + 2)
        if len(raw) < head:
            raise InputError(f"{c.path}: {len(raw)} bytes, too few for its item offsets")
        count = int(np.frombuffer(raw, "<u4", 1)[0])
        if count != c.items:
            raise InputError(
                f"{c.path}: byte 0 counts {count} items, but index.json says {c.items}"
            )
        offsets = np.frombuffer(raw, "<u4", count + 1, 4).astype(np.int64)
        sizes = np.diff(offsets)
        bad = np.flatnonzero((sizes < 0) | (sizes % self.dtype.itemsize != 0))
        if offsets[0] != head or offsets[-1] != len(raw) or len(bad):
            i = int(bad[0]) if len(bad) else (0 if offsets[0] != head else count)
            raise InputError(
                f"{c.path}: item offset {i} (byte {4 + 4 * i}) is {int(offsets[i])}: the "
                f"offsets must run from {head} to the chunk's end ({len(raw)}) in whole "
                f"{self.dtype} values"
            )
        if int(offsets[-1] - offsets[0]) // self.dtype.itemsize != c.tokens:
            raise InputError(
                f"{c.path}: {int(offsets[-1] - offsets[0]) // self.dtype.itemsize} tokens, "
                f"but index.json says {c.tokens}"
            )
        return offsets


def open_litdata(src: str) -> LitDataSource:
    """The token documents of a LitData optimized directory (``TokensLoader`` chunks)."""
    index = _index(src)
    where = os.path.join(src, "index.json")
    if index is None:
        raise InputError(f"{where}: not a LitData index (missing or not a JSON object)")
    config, chunks = index.get("config"), index.get("chunks")
    if not isinstance(config, dict) or not isinstance(chunks, list):
        raise InputError(f"{where}: a LitData index needs 'config' and 'chunks'")
    loader = config.get("item_loader")
    if loader != "TokensLoader":
        raise InputError(
            f"{where}: items of {loader!r} are pytrees of encoded (often pickled) values, "
            "not read here; only a TokensLoader dataset of token tensors converts"
        )
    if config.get("encryption"):
        raise InputError(f"{where}: encrypted chunks are not read")
    fmt = config.get("data_format")
    code = None
    if isinstance(fmt, list) and len(fmt) == 1 and isinstance(fmt[0], str):
        kind, _, num = fmt[0].partition(":")
        if kind == "no_header_tensor" and num.isdigit():
            code = int(num)
    if code not in _DTYPES:
        raise InputError(
            f"{where}: data_format {fmt!r} is not one tensor of integer token ids "
            "(no_header_tensor of an integer dtype)"
        )
    compression = config.get("compression")
    level = config.get("compression_level")
    if compression is not None and (
        not str(compression).startswith("zstd") or level not in (None, "chunk")
    ):
        raise InputError(
            f"{where}: compression {compression!r} (level {level!r}) is not read; whole-chunk "
            "zstd is"
        )
    out: list[_Chunk] = []
    for i, c in enumerate(chunks):
        ok = isinstance(c, dict) and isinstance(c.get("filename"), str)
        vals = [c.get(k) for k in ("chunk_size", "dim", "chunk_bytes")] if ok else []
        if not ok or not all(isinstance(v, int) and v >= 0 for v in vals):
            raise InputError(
                f"{where}: chunk {i} needs a filename and chunk_size, dim, chunk_bytes >= 0"
            )
        name = c["filename"]
        if os.path.basename(name) != name:
            raise InputError(f"{where}: chunk {i}'s filename {name!r} is not a file name")
        if vals[2] > _MAX_CHUNK:
            raise InputError(f"{where}: chunk {i} of {vals[2]} bytes is larger than 2 GiB")
        out.append(_Chunk(os.path.join(src, name), vals[0], vals[1], vals[2]))
    return LitDataSource(
        src, out, np.dtype(_DTYPES[code]).newbyteorder("<"), compression is not None
    )
