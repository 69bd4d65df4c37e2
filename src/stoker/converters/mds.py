"""MosaicML Streaming (MDS) datasets, read for conversion: a directory with an
``index.json`` and its shards (``shard.NNNNN.mds``, or ``.mds.zstd`` when written
with zstd compression).

A shard holds its sample count (uint32), every sample's start and the end of the
last as absolute byte offsets (uint32), its own config (JSON) and the samples;
a sample holds a uint32 size for each column of no fixed size, in column order,
then every column's bytes in order. The token column is an ``ndarray`` encoding
(``ndarray``, ``ndarray:DTYPE``, ``ndarray:DTYPE:SHAPE``: a dtype byte and a shape
header where the encoding does not fix them) or ``bytes`` of a dtype you name; each
sample is one document (an array of several dimensions is read flat). A shard is
read (and decompressed) whole: at most its size limit, 64 MB by default. A column
that holds no token ids (``pkl``, ``str``, ...) is refused, never unpickled. A text
(``str``) column is a source of ``stoker build-tokens`` instead (:meth:`MDSSource.texts`,
through :mod:`stoker.ingest`), which tokenizes it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import zstandard

from stoker.converters.arrow import COLUMNS
from stoker.converters.scan import largest_of
from stoker.errors import InputError

#: The ndarray encoding's value dtype codes, and its shape dtypes by code.
_VALUE = {8: "uint8", 9: "int8", 16: "uint16", 17: "int16", 32: "uint32", 33: "int32",
          64: "uint64", 65: "int64"}  # fmt: skip
_SHAPE = {0: "uint8", 1: "uint16", 2: "uint32", 3: "uint64"}


def is_mds(src: str) -> bool:
    index = os.path.join(src, "index.json")
    if not os.path.isfile(index):
        return False
    try:
        with open(index) as f:
            shards = json.load(f).get("shards")
    except (OSError, ValueError, AttributeError):
        return False
    return isinstance(shards, list) and all(
        isinstance(s, dict) and s.get("format") == "mds" for s in shards
    )


@dataclass(frozen=True)
class _Shard:
    path: str  # the file read
    compressed: bool
    names: list[str]
    encodings: list[str]
    sizes: list[int | None]
    samples: int


@dataclass
class MDSSource:
    src: str
    shards: list[_Shard]
    column: str
    dtype: str | None  # of a ``bytes`` column

    @property
    def total_documents(self) -> int:
        return sum(s.samples for s in self.shards)

    def largest(self) -> int:
        """The largest token id (a pass over the shards); refuses a negative one."""
        return largest_of(self.documents())

    def _data(self, shard: _Shard) -> bytes:
        with open(shard.path, "rb") as f:
            raw = f.read()
        if not shard.compressed:
            return raw
        try:
            return zstandard.ZstdDecompressor().decompressobj().decompress(raw)
        except zstandard.ZstdError as exc:
            raise InputError(f"{shard.path}: not a zstd-compressed shard ({exc})") from exc

    def documents(self) -> Iterator[tuple[np.ndarray, str]]:
        for shard, buf, at in self.values():
            col = shard.names.index(self.column)
            yield _tokens(buf, shard.encodings[col], self.dtype, at), at

    def values(self) -> Iterator[tuple[_Shard, bytes, str]]:
        """Every sample's value of the column, raw: ``(shard, bytes, where)``."""
        for shard in self.shards:
            data = self._data(shard)
            where = f"{shard.path}"
            if len(data) < 4:
                raise InputError(f"{where}: {len(data)} bytes, too short for a shard")
            (n,) = np.frombuffer(data, np.uint32, 1)
            if int(n) != shard.samples:
                raise InputError(
                    f"{where}: holds {int(n)} samples at byte 0, its index entry says {shard.samples}"
                )
            if len(data) < 4 * (int(n) + 2):
                raise InputError(f"{where}: {len(data)} bytes, too short for {int(n)} offsets")
            offsets = np.frombuffer(data, np.uint32, int(n) + 1, 4).astype(np.int64)
            if int(offsets[-1]) > len(data) or bool((np.diff(offsets) < 0).any()):
                raise InputError(
                    f"{where}: its sample offsets (from byte 4) run past its {len(data)} bytes "
                    "or go back"
                )
            col = shard.names.index(self.column)
            dynamic = [i for i, s in enumerate(shard.sizes) if s is None]
            for j in range(int(n)):
                lo, hi = int(offsets[j]), int(offsets[j + 1])
                at = f"{where}: sample {j} (byte {lo})"
                yield shard, self._value(data, lo, hi, col, dynamic, shard, at), at

    def _value(
        self, data: bytes, lo: int, hi: int, col: int, dynamic: list[int], shard: _Shard, at: str
    ) -> bytes:
        head = 4 * len(dynamic)
        if hi - lo < head:
            raise InputError(f"{at}: {hi - lo} bytes, shorter than its size header")
        dyn = np.frombuffer(data, np.uint32, len(dynamic), lo).tolist() if dynamic else []
        sizes = list(shard.sizes)
        for i, s in zip(dynamic, dyn, strict=True):
            sizes[i] = int(s)
        start = lo + head + sum(int(s or 0) for s in sizes[:col])
        end = start + int(sizes[col] or 0)
        if end > hi:
            raise InputError(f"{at}: its columns need {end - lo} bytes, it has {hi - lo}")
        return data[start:end]

    def texts(self, skip: Callable[[str], None] | None = None) -> Iterator[tuple[str, int]]:
        """A ``str`` column's documents, with the bytes of the shard files read before
        each (progress); a value that is not UTF-8 raises, or goes to ``skip``."""
        for shard in self.shards:
            enc = shard.encodings[shard.names.index(self.column)]
            if enc != "str":
                raise InputError(
                    f"{shard.path}: column {self.column!r} is encoded as {enc!r}, not text "
                    "(str); convert a token-id column with stoker convert"
                )
        done, last = 0, None
        for shard, buf, at in self.values():
            if shard is not last:
                if last is not None:
                    done += os.path.getsize(last.path)
                last = shard
            try:
                yield buf.decode("utf-8"), done
            except UnicodeDecodeError as exc:
                what = f"{at}: not UTF-8 text (byte {exc.start:,} of the value: {exc.reason})"
                if skip is None:
                    raise InputError(what) from exc
                skip(what)


def _tokens(buf: bytes, encoding: str, dtype: str | None, at: str) -> np.ndarray:
    """The token ids of one column value."""
    name, _, rest = encoding.partition(":")
    if name == "bytes":
        if dtype is None:
            raise InputError(f"{at}: a 'bytes' token column needs its dtype (--dtype)")
        dt = np.dtype(dtype)
        if len(buf) % dt.itemsize:
            raise InputError(f"{at}: {len(buf)} bytes, not a whole number of {dt} tokens")
        return np.array(np.frombuffer(buf, dt))
    if name != "ndarray":
        raise InputError(f"{at}: the token column's encoding {encoding!r} holds no token ids")
    args = rest.split(":") if rest else []
    i = 0
    if args:
        value = args[0]
        if value not in _VALUE.values():
            raise InputError(f"{at}: encoding {encoding!r}: {value} is not an integer token dtype")
    else:
        if not buf:
            raise InputError(f"{at}: an empty ndarray value")
        if buf[0] not in _VALUE:
            raise InputError(f"{at}: dtype code {buf[0]} is not an integer token dtype")
        value, i = _VALUE[buf[0]], 1
    if len(args) < 2:  # the shape is in the value
        if i >= len(buf):
            raise InputError(f"{at}: its ndarray value ends before its shape")
        ndim, code = buf[i] >> 2, buf[i] & 3
        i += 1 + ndim * (1 << code)
    dt = np.dtype(value)
    if (len(buf) - i) % dt.itemsize or i > len(buf):
        raise InputError(f"{at}: {len(buf) - i} value bytes, not a whole number of {dt} tokens")
    return np.array(np.frombuffer(buf, dt, offset=i))


def open_mds(src: str, column: str | None, dtype: str | None) -> MDSSource:
    """The MDS dataset at ``src``, read through ``column`` (default: a token-id column
    of :data:`~stoker.converters.arrow.COLUMNS`)."""
    index = os.path.join(src, "index.json")
    shards = read_index(src)
    names = shards[0].names if shards else []
    if column is None:
        column = next((c for c in COLUMNS if c in names), None)
        if column is None:
            raise InputError(
                f"{index}: none of the columns {', '.join(COLUMNS)} (columns: "
                f"{', '.join(names)}); name the token-id column with --column"
            )
    for s in shards:
        if column not in s.names:
            raise InputError(f"{s.path}: no column {column!r} (columns: {', '.join(s.names)})")
    return MDSSource(src, shards, column, dtype)


def read_index(src: str) -> list[_Shard]:
    """The shards ``src/index.json`` lists, each checked to be there."""
    index = os.path.join(src, "index.json")
    try:
        with open(index) as f:
            obj: Any = json.load(f)
        entries = obj["shards"]
        shards = []
        for k, e in enumerate(entries):
            if e.get("format") != "mds":
                raise InputError(f"{index}: shard {k} is in format {e.get('format')!r}, not mds")
            raw, zipped = e.get("raw_data") or {}, e.get("zip_data") or {}
            raw_path = os.path.join(src, raw.get("basename", ""))
            if raw.get("basename") and os.path.isfile(raw_path):
                path, compressed = raw_path, False
            elif zipped.get("basename"):
                path, compressed = os.path.join(src, zipped["basename"]), True
                if (e.get("compression") or "").split(":")[0] != "zstd":
                    raise InputError(
                        f"{index}: shard {k} is compressed with {e.get('compression')!r}; "
                        "only zstd is read"
                    )
            else:
                raise InputError(f"{index}: shard {k} names no file that is there")
            if not os.path.isfile(path):
                raise InputError(f"{path}: not found (shard {k} of {index})")
            shards.append(_Shard(path, compressed, list(e["column_names"]),
                                 list(e["column_encodings"]), list(e["column_sizes"]),
                                 int(e["samples"])))  # fmt: skip
    except InputError:
        raise
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise InputError(
            f"{index}: not a readable MDS index ({type(exc).__name__}: {exc})"
        ) from exc
    return shards
