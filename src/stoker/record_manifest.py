"""The records dataset manifest and its block index (pure: no I/O).

A records dataset (images, audio, any rows of named columns) is a directory (any
fsspec URL) holding::

    manifest.json                 this module's RecordManifest, written last
    index-<id>.bin                the block index: one 32-byte entry per block
    data/<id>-00000.arrow ...     data files: blocks back to back

A block is one Arrow IPC stream: its schema, one record batch, the end-of-stream
marker. One range request reads it, and Arrow reads it where it lies (its buffers
are used in place unless they are compressed), so a block in shared memory is read
by every local process without a copy. A block's rows are a stretch of the
dataset's, in order; the index stores where each block lives, how many rows it
holds and the xxh64 of its bytes. The manifest is of the token manifest's family
(``format``, ``format_version``, ``dataset_id``, files, index, ``decode_xxh64``) with
the records' own fields: the Arrow schema (serialised, and spelled out per column),
the row count, per-column statistics and the writer's settings.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from stoker.errors import ManifestError
from stoker.manifest import SEGMENT, Fields, FileRef, JSONManifest, file_ref

FORMAT = "stoker-records"
FORMAT_VERSION = 1
KIND = "records"
#: Arrow IPC buffer compressions a writer may choose ("none": buffers as they are).
COMPRESSIONS = ("none", "lz4", "zstd")
#: The largest block a reader will take (a block is read whole, in one request).
MAX_BLOCK_BYTES = 1 << 30
#: One entry per block, little-endian.
RECORD_INDEX_DTYPE = np.dtype(
    [
        ("offset", "<u8"),  # byte offset of the block in its data file
        ("nbytes", "<u8"),  # length of the block (its IPC stream)
        ("rows", "<u8"),  # rows it holds
        ("xxh64", "<u8"),  # xxh64 of its bytes
    ]
)
#: Fields that do not change how the data is read (left out of ``decode_xxh64``).
_INFORMATIONAL = (
    "statistics",
    "metadata",
    "data_bytes",
    "block_bytes",
    "created",
    "writer",
    "decode_xxh64",
)


@dataclass(frozen=True)
class Column:
    """A column of the schema, as a reader of the manifest sees it."""

    name: str
    type: str  # Arrow's name of the type: binary, int64, string, list<item: float>, ...
    nullable: bool = True


@dataclass(frozen=True)
class RecordManifest(JSONManifest):
    """What a reader needs to know about a records dataset."""

    dataset_id: str
    schema: str  # the Arrow schema, serialised as an IPC message, base64
    columns: tuple[Column, ...]
    num_rows: int
    num_blocks: int
    blocks_per_file: int
    files: tuple[FileRef, ...]
    index: FileRef
    compression: str = "none"
    #: Per column: ``nulls``, and ``min`` / ``max`` (numbers) or ``bytes`` (binary, text).
    statistics: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: What the writer was told of the rows (``stoker build-records``: the source's kind,
    #: an ImageFolder's class names by label); informational.
    metadata: dict[str, Any] = field(default_factory=dict)
    data_bytes: int = 0
    block_bytes: int = 0  # the writer's target size of a block
    created: str = ""
    writer: str = ""
    format: str = FORMAT
    format_version: int = FORMAT_VERSION
    kind: str = KIND
    decode_xxh64: str | None = None

    @property
    def schema_bytes(self) -> bytes:
        return base64.b64decode(self.schema)

    def column(self, name: str) -> Column:
        for c in self.columns:
            if c.name == name:
                return c
        raise KeyError(f"no column {name!r}; the columns are {[c.name for c in self.columns]}")

    def block_file(self, block: int) -> FileRef:
        if not 0 <= block < self.num_blocks:
            raise IndexError(f"block {block} out of range [0, {self.num_blocks})")
        return self.files[block // self.blocks_per_file]

    informational = _INFORMATIONAL

    @classmethod
    def from_dict(cls, raw: dict[str, Any], where: str = "manifest.json") -> RecordManifest:
        cls.check_format(raw, where, FORMAT, FORMAT_VERSION)
        get = Fields(raw, where)
        if get.text("kind", default=KIND) != KIND:
            raise ManifestError(f"{where}: field 'kind' is {raw['kind']!r}, expected {KIND!r}")
        schema = get.text("schema")
        try:
            base64.b64decode(schema, validate=True)
        except (binascii.Error, ValueError) as exc:
            raise ManifestError(f"{where}: field 'schema' is not base64 ({exc})") from exc
        compression = get.text("compression", default="none")
        if compression not in COMPRESSIONS:
            raise ManifestError(
                f"{where}: field 'compression' is {compression!r}, expected one of "
                f"{list(COMPRESSIONS)}"
            )
        columns = tuple(
            _column(c, f"{where}: columns[{i}]") for i, c in enumerate(get.items("columns"))
        )
        stats = raw.get("statistics", {})
        if not isinstance(stats, dict):
            raise ManifestError(f"{where}: field 'statistics' must be an object")
        for name, s in stats.items():
            _check_stats(s, f"{where}: statistics of {name!r}")
        metadata = raw.get("metadata", {})
        if not isinstance(metadata, dict):
            raise ManifestError(f"{where}: field 'metadata' must be an object")
        num_rows = get.integer("num_rows", minimum=1, maximum=1 << 62)
        manifest = cls(
            dataset_id=get.text("dataset_id", pattern=SEGMENT),
            schema=schema,
            columns=columns,
            num_rows=num_rows,
            num_blocks=get.integer("num_blocks", minimum=1, maximum=num_rows),
            blocks_per_file=get.integer("blocks_per_file", minimum=1, maximum=1 << 32),
            files=tuple(
                file_ref(f, f"{where}: files[{i}]") for i, f in enumerate(get.items("files"))
            ),
            index=file_ref(get.obj("index"), f"{where}: index"),
            compression=compression,
            statistics=stats,
            metadata=metadata,
            data_bytes=get.integer("data_bytes", minimum=0, default=0),
            block_bytes=get.integer("block_bytes", minimum=0, default=0),
            created=get.text("created", default=""),
            writer=get.text("writer", default=""),
            decode_xxh64=get.opt_hex("decode_xxh64"),
        )
        manifest.validate(where)
        manifest.check_seal(
            where,
            "dataset_id, schema, columns, num_rows, num_blocks, blocks_per_file, files, "
            "index, compression",
        )
        return manifest

    def validate(self, where: str = "manifest.json") -> None:
        names = [c.name for c in self.columns]
        if not names:
            raise ManifestError(f"{where}: field 'columns' lists no column")
        if len(set(names)) != len(names):
            raise ManifestError(f"{where}: field 'columns' names a column twice: {names}")
        expected_files = -(-self.num_blocks // self.blocks_per_file)
        if len(self.files) != expected_files:
            raise ManifestError(
                f"{where}: {len(self.files)} data files listed, but {self.num_blocks} blocks "
                f"of {self.blocks_per_file} per file need {expected_files}"
            )
        if self.index.bytes != self.num_blocks * RECORD_INDEX_DTYPE.itemsize:
            raise ManifestError(
                f"{where}: index {self.index.path} has {self.index.bytes} bytes, expected "
                f"{self.num_blocks * RECORD_INDEX_DTYPE.itemsize} for {self.num_blocks} blocks"
            )
        unknown = sorted(set(self.statistics) - set(names))
        if unknown:
            raise ManifestError(f"{where}: field 'statistics' names unknown columns {unknown}")


def _check_stats(raw: Any, where: str) -> None:
    """A column's statistics: ``nulls`` (and ``bytes``) counts, ``min`` with ``max``."""
    if not isinstance(raw, dict):
        raise ManifestError(f"{where}: must be an object, got {type(raw).__name__}")
    get = Fields(raw, where)
    get.integer("nulls", minimum=0, default=0)
    if "bytes" in raw:
        get.integer("bytes", minimum=0)
    if ("min" in raw) != ("max" in raw):
        raise ManifestError(f"{where}: 'min' and 'max' come together")
    for k in ("min", "max"):
        v = raw.get(k)
        if k in raw and (isinstance(v, bool) or not isinstance(v, (int, float))):
            raise ManifestError(f"{where}: field {k!r} must be a number, got {v!r}")


def _column(raw: Any, where: str) -> Column:
    if not isinstance(raw, dict):
        raise ManifestError(f"{where}: a column is {type(raw).__name__}, expected an object")
    get = Fields(raw, where)
    return Column(get.text("name"), get.text("type"), get.boolean("nullable", default=True))


def parse_record_index(data: bytes, manifest: RecordManifest, where: str) -> np.ndarray:
    """Decode the block index and check every entry against the manifest: each block
    lies inside its data file, holds at least one row and is no larger than
    :data:`MAX_BLOCK_BYTES`, and the blocks' rows add up to the manifest's."""
    m = manifest
    if len(data) != m.num_blocks * RECORD_INDEX_DTYPE.itemsize:
        raise ManifestError(
            f"{where}: {len(data)} bytes, expected {m.num_blocks * RECORD_INDEX_DTYPE.itemsize}"
        )
    index = np.frombuffer(data, dtype=RECORD_INDEX_DTYPE)
    blocks = np.arange(m.num_blocks)
    sizes = np.array([f.bytes for f in m.files], dtype=np.uint64)[blocks // m.blocks_per_file]
    end = index["offset"] + index["nbytes"]
    bad = (
        (index["nbytes"] == 0)
        | (index["nbytes"] > MAX_BLOCK_BYTES)
        | (index["rows"] == 0)
        | (index["rows"] > np.uint64(m.num_rows))  # (and no sum of them wraps around)
        | (index["offset"] > sizes)
        | (end > sizes)
        | (end < index["offset"])  # (wrapped around)
    )
    if bad.any():
        b = int(np.flatnonzero(bad)[0])
        e = index[b]
        ref = m.block_file(b)
        raise ManifestError(
            f"{where}: entry of block {b} does not fit the manifest: bytes "
            f"[{int(e['offset'])}, {int(e['offset']) + int(e['nbytes'])}) in {ref.path} "
            f"({ref.bytes} bytes), {int(e['rows'])} rows"
        )
    total = sum(int(r) for r in index["rows"].tolist())
    if total != m.num_rows:
        raise ManifestError(
            f"{where}: the blocks hold {total} rows, the manifest says num_rows {m.num_rows}"
        )
    return index


def first_rows(index: np.ndarray) -> np.ndarray:
    """Each block's first row, and the row count after the last: ``num_blocks + 1``
    int64 values (the block of row ``r`` is ``searchsorted(first, r, 'right') - 1``)."""
    out = np.zeros(len(index) + 1, dtype=np.int64)
    np.cumsum(index["rows"].astype(np.int64), out=out[1:])
    return out
