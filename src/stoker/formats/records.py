"""Writing records datasets and reading their blocks (see :mod:`stoker.record_manifest`).

:class:`RecordWriter` takes rows (dicts of column values) or Arrow record batches of
one schema, cuts them into blocks of about ``block_bytes`` (never splitting a row),
writes each block as an Arrow IPC stream into data files named with a fresh dataset
id, then the index, then the manifest, last and atomically: until it exists nothing
reads as a dataset, and an interrupted write leaves only files no manifest names.
Image and other binary bytes are stored as they came (never re-encoded); by default a
dataset's blocks are zstd-compressed (Arrow's IPC buffer compression) only when that
saves at least ``AUTO_MIN_SAVING`` of its first block, as it does for text columns and
not for JPEGs.

:class:`RecordSource` is a dataset handle: manifest, schema, block index, and
``block(i)`` (one range request, its checksum checked, read by Arrow). It holds no
connection until it reads, so it pickles into DataLoader workers.

Arrow (``pyarrow``) is needed for records: ``pip install 'stoker[records]'``.
"""

from __future__ import annotations

import base64
import datetime as _dt
import math
import uuid
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from stoker.errors import ChecksumError, DatasetError, InputError, ManifestError
from stoker.formats.cache import BlockCache, NullCache
from stoker.formats.codec import checksum
from stoker.formats.writing import DatasetWriter
from stoker.manifest import MANIFEST_NAME, FileRef
from stoker.record_manifest import (
    COMPRESSIONS,
    MAX_BLOCK_BYTES,
    RECORD_INDEX_DTYPE,
    Column,
    RecordManifest,
    first_rows,
    parse_record_index,
)
from stoker.storage import RetryPolicy, Storage

if TYPE_CHECKING:
    import pyarrow as pa

#: A block's target size: a few dozen photographs of ImageNet's sizes (about 110 KB
#: each), one range request each; the unit a node caches and a reader decodes at once.
DEFAULT_BLOCK_BYTES = 4 << 20
#: Rows a block holds at most, however small they are.
DEFAULT_BLOCK_ROWS = 1 << 16
FILE_TARGET_BYTES = 256 << 20
#: ``compression="auto"`` (the default) stores a dataset's blocks zstd-compressed when
#: zstd saves at least this share of its first block's bytes, else uncompressed
#: (docs/benchmarks.md, "Records block compression": zstd saves under 1% of blocks of
#: full-size JPEGs, 28% of 64 x 64 thumbnails, 54% of captions and numbers).
AUTO_MIN_SAVING = 0.10


def _arrow() -> Any:
    try:
        import pyarrow
        import pyarrow.compute
        import pyarrow.ipc
    except ImportError as exc:  # pragma: no cover - pyarrow is in the test environment
        raise ImportError("records datasets need pyarrow: pip install 'stoker[records]'") from exc
    return pyarrow


def _read_options() -> Any:
    """Arrow's IPC read options: no threads of Arrow's own (a block is small, and the
    reader's threads are the parallelism)."""
    return _arrow().ipc.IpcReadOptions(use_threads=False)


def as_schema(schema: Any) -> pa.Schema:
    """An Arrow schema from a ``pyarrow.Schema`` or a mapping of column name to an Arrow
    type or its name (``"binary"``, ``"int64"``, ``"string"``, ``"float32"``, ...)."""
    pa = _arrow()
    if isinstance(schema, pa.Schema):
        out = schema
    elif isinstance(schema, Mapping):
        fields = []
        for name, t in schema.items():
            if isinstance(t, str):
                try:
                    t = pa.type_for_alias(t)
                except ValueError as exc:
                    raise InputError(f"column {name!r}: unknown Arrow type {t!r}") from exc
            if not isinstance(t, pa.DataType):
                raise InputError(f"column {name!r}: {t!r} is not an Arrow type")
            fields.append(pa.field(str(name), t))
        out = pa.schema(fields)
    else:
        raise InputError(
            f"schema must be a pyarrow.Schema or a mapping of column to type, got {schema!r}"
        )
    if not len(out.names):
        raise InputError("a records schema needs at least one column")
    if len(set(out.names)) != len(out.names):
        raise InputError(f"the schema names a column twice: {out.names}")
    return out


class RecordWriter(DatasetWriter):
    """Streams rows into a new records dataset at ``url``."""

    suffix = ".arrow"

    def __init__(
        self,
        url: str,
        schema: Any,
        *,
        block_bytes: int = DEFAULT_BLOCK_BYTES,
        block_rows: int = DEFAULT_BLOCK_ROWS,
        compression: str | None = "auto",
        storage_options: dict[str, Any] | None = None,
        overwrite: bool = False,
        metadata: dict[str, Any] | None = None,
    ) -> None:
        pa = _arrow()
        self.metadata = dict(metadata or {})
        self.schema = as_schema(schema)
        if not 1 <= block_bytes <= MAX_BLOCK_BYTES // 2:
            raise InputError(
                f"block_bytes must be in [1, {MAX_BLOCK_BYTES // 2}], got {block_bytes}"
            )
        if block_rows < 1:
            raise InputError(f"block_rows must be >= 1, got {block_rows}")
        comp = compression or "none"
        if comp not in (*COMPRESSIONS, "auto"):
            raise InputError(
                f"compression must be one of {[*COMPRESSIONS, 'auto']}, got {compression!r}"
            )
        #: "auto" until the first block is written, then what it chose (the manifest's)
        self.compression = comp
        self.block_bytes, self.block_rows = block_bytes, block_rows
        self.storage = Storage(url, storage_options)
        self.old: RecordManifest | None = None
        if self.storage.exists(MANIFEST_NAME):
            if not overwrite:
                raise InputError(
                    f"{self.storage.url_of(MANIFEST_NAME)} exists; pass overwrite=True "
                    "(--overwrite) to replace the dataset"
                )
            try:
                self.old = read_record_manifest(self.storage)
            except Exception:
                self.old = None  # (not a records dataset, or unreadable: its files stay)
        self.id = uuid.uuid4().hex[:16]
        self.blocks_per_file = max(1, FILE_TARGET_BYTES // block_bytes)
        # rows given to add() and not yet in a block, column by column
        self._columns: dict[str, list[Any]] = {n: [] for n in self.schema.names}
        self._pending_rows = 0
        self._pending_bytes = 0
        self._binary = [
            n for n, t in zip(self.schema.names, self.schema.types, strict=True)
            if pa.types.is_binary(t) or pa.types.is_large_binary(t)
            or pa.types.is_string(t) or pa.types.is_large_string(t)
        ]  # fmt: skip
        self._stats: dict[str, dict[str, Any]] = {n: {"nulls": 0} for n in self.schema.names}
        self._index: list[tuple[int, int, int, int]] = []
        self._start_files()
        self.num_rows = 0  # rows in blocks written
        self.rows_seen = 0  # rows given (numbering errors)
        self.data_bytes = 0
        self.manifest: RecordManifest | None = None

    # -- input ---------------------------------------------------------------
    def add(self, row: Mapping[str, Any]) -> None:
        """One row: a value per column of the schema (None for a missing, nullable one)."""
        if not isinstance(row, Mapping):
            raise InputError(
                f"row {self.rows_seen}: expected a mapping of column to value, got {type(row).__name__}"
            )
        extra = set(row) - set(self._columns)
        if extra:
            raise InputError(
                f"row {self.rows_seen}: columns {sorted(extra)} are not in the schema "
                f"({self.schema.names})"
            )
        size = 8 * len(self._columns)
        for name in self._binary:  # (checked before any value is taken: rows stay in step)
            v = row.get(name)
            if isinstance(v, str):
                size += len(v.encode())
            elif isinstance(v, (bytes, bytearray, memoryview)):
                size += len(v)
            elif v is not None:
                raise InputError(
                    f"row {self.rows_seen}, column {name!r}: expected bytes or text, got "
                    f"{type(v).__name__}"
                )
        for name, values in self._columns.items():
            values.append(row.get(name))
        self._pending_bytes += size
        self._pending_rows += 1
        self.rows_seen += 1
        if self._pending_bytes >= self.block_bytes or self._pending_rows >= self.block_rows:
            self._flush_rows()

    def extend(self, rows: Iterable[Any]) -> None:
        """Rows (mappings), or Arrow record batches / tables of the schema, in order."""
        pa = _arrow()
        for item in rows:
            if isinstance(item, (pa.RecordBatch, pa.Table)):
                self.add_batch(item)
            else:
                self.add(item)

    def add_batch(self, batch: pa.RecordBatch | pa.Table) -> None:
        """Rows as an Arrow record batch or table with the writer's schema (its columns
        by name; their types must be the schema's)."""
        pa = _arrow()
        self._flush_rows()
        table = batch if isinstance(batch, pa.Table) else pa.Table.from_batches([batch])
        for f in self.schema:
            if f.name not in table.column_names:
                raise InputError(
                    f"rows {self.rows_seen}..{self.rows_seen + table.num_rows}: no column "
                    f"{f.name!r} (they have {table.column_names})"
                )
            got = table.schema.field(f.name).type
            if got != f.type:
                raise InputError(
                    f"rows {self.rows_seen}..{self.rows_seen + table.num_rows}: column "
                    f"{f.name!r} is {got}, the schema's is {f.type}"
                )
        for f in self.schema:
            col = table.column(f.name)
            if not f.nullable and col.null_count:
                at = int(np.flatnonzero(col.is_null().to_numpy(zero_copy_only=False))[0])
                raise InputError(
                    f"row {self.rows_seen + at}: column {f.name!r} is missing (not nullable)"
                )
        table = table.select(self.schema.names).cast(self.schema)
        start = 0
        while start < table.num_rows:
            n = self._rows_for(table, start)
            part = table.slice(start, n).combine_chunks().to_batches()
            self._write_block(part[0] if part else pa.record_batch([], schema=self.schema))
            start += n
        self.rows_seen += table.num_rows

    def _rows_for(self, table: pa.Table, start: int) -> int:
        """How many rows from ``start`` the next block of ``table`` takes: about
        ``block_bytes``, at most ``block_rows``, at least one."""
        n = min(self.block_rows, int(table.num_rows) - start)
        while n > 1 and table.slice(start, n).nbytes > self.block_bytes:
            n = max(1, n // 2)
        return n

    def _flush_rows(self) -> None:
        """The rows given to :meth:`add` since the last block, as a block."""
        if not self._pending_rows:
            return
        pa = _arrow()
        first = self.rows_seen - self._pending_rows
        try:
            batch = pa.record_batch(
                [pa.array(self._columns[f.name], type=f.type) for f in self.schema],
                schema=self.schema,
            )
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, OverflowError) as exc:
            raise self._bad_row(first, exc) from exc
        for values in self._columns.values():
            values.clear()
        self._pending_rows = self._pending_bytes = 0
        self._write_block(batch)

    def _bad_row(self, first: int, exc: Exception) -> InputError:
        """The error naming the first row and column of the pending rows Arrow refuses."""
        pa = _arrow()
        for f in self.schema:
            values = self._columns[f.name]
            for i, v in enumerate(values):
                try:
                    pa.array([v], type=f.type)
                except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, OverflowError) as e:
                    return InputError(
                        f"row {first + i}, column {f.name!r} ({f.type}): {v!r:.80} ({e})"
                    )
                if v is None and not f.nullable:
                    return InputError(
                        f"row {first + i}: column {f.name!r} is missing (not nullable)"
                    )
        return InputError(f"rows {first}..{first + self._pending_rows}: {exc}")

    def _write_block(self, batch: pa.RecordBatch) -> None:
        if not batch.num_rows:
            return
        for f in self.schema:
            if not f.nullable and batch.column(f.name).null_count:
                at = self.num_rows + int(np.flatnonzero(batch.column(f.name).is_null())[0])
                raise InputError(f"row {at}: column {f.name!r} is missing (not nullable)")
        if self.compression == "auto":
            plain, packed = self._ipc(batch, "none"), self._ipc(batch, "zstd")
            saves = len(packed) <= (1 - AUTO_MIN_SAVING) * len(plain)
            self.compression = "zstd" if saves else "none"
            data = packed if saves else plain
        else:
            data = self._ipc(batch, self.compression)
        if len(data) > MAX_BLOCK_BYTES:
            raise InputError(
                f"rows {self.num_rows}..{self.num_rows + batch.num_rows}: a block of "
                f"{len(data)} bytes is over {MAX_BLOCK_BYTES} (a row is too large)"
            )
        self._account(batch)
        if self._file is None or len(self._index) % self.blocks_per_file == 0:
            self._roll_file()
        self._index.append((self._file_pos, len(data), batch.num_rows, checksum(data)))
        self._file.write(memoryview(data))
        self._file_pos += len(data)
        self.data_bytes += len(data)
        self.num_rows += batch.num_rows

    def _ipc(self, batch: pa.RecordBatch, compression: str) -> pa.Buffer:
        """``batch`` as a block: an Arrow IPC stream of the schema and the batch, its
        buffers compressed with ``compression`` (or not: "none")."""
        pa = _arrow()
        options = pa.ipc.IpcWriteOptions(compression=None if compression == "none" else compression)
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, self.schema, options=options) as w:
            w.write_batch(batch)
        return sink.getvalue()

    def _account(self, batch: pa.RecordBatch) -> None:
        """Add a block's figures to each column's statistics."""
        pa = _arrow()
        pc = pa.compute
        for f in self.schema:
            col = batch.column(f.name)
            s = self._stats[f.name]
            s["nulls"] += col.null_count
            t = f.type
            if pa.types.is_integer(t) or pa.types.is_floating(t):
                mm = pc.min_max(col)
                lo, hi = mm["min"].as_py(), mm["max"].as_py()
                if lo is not None and math.isfinite(lo) and math.isfinite(hi):  # (JSON has no NaN)
                    s["min"] = lo if s.get("min") is None else min(s["min"], lo)
                    s["max"] = hi if s.get("max") is None else max(s["max"], hi)
            elif f.name in self._binary:
                n = pc.sum(pc.binary_length(col)).as_py()
                s["bytes"] = s.get("bytes", 0) + int(n or 0)

    # -- finish --------------------------------------------------------------
    def close(self) -> RecordManifest:
        """Flush, write the index and the manifest; returns the manifest."""
        if self._closed:
            raise InputError("writer already closed")
        try:
            self._flush_rows()
            self._finish_file()
            if self.num_rows == 0:
                raise InputError(f"no rows to write to {self.storage.url}")
            self.manifest = self._commit()
            return self.manifest
        except BaseException:
            self.abort()
            raise
        finally:
            self._closed = True

    def _commit(self) -> RecordManifest:
        from stoker import __version__

        st = self.storage
        index = np.array(self._index, dtype=RECORD_INDEX_DTYPE)
        index_bytes = index.tobytes()
        index_path = f"index-{self.id}.bin"
        self._written.append(index_path)
        st.write_atomic(index_path, index_bytes)
        manifest = RecordManifest(
            dataset_id=self.id,
            schema=base64.b64encode(self.schema.serialize().to_pybytes()).decode(),
            columns=tuple(Column(f.name, str(f.type), f.nullable) for f in self.schema),
            num_rows=self.num_rows,
            num_blocks=len(self._index),
            blocks_per_file=self.blocks_per_file,
            files=tuple(self._files),
            index=FileRef(index_path, len(index_bytes), f"{checksum(index_bytes):016x}"),
            compression=self.compression,
            statistics={n: dict(s) for n, s in self._stats.items()},
            metadata=self.metadata,
            data_bytes=self.data_bytes,
            block_bytes=self.block_bytes,
            created=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            writer=f"stoker {__version__}",
        ).sealed()
        old = [] if self.old is None else [f.path for f in self.old.files] + [self.old.index.path]
        self._publish(manifest, {f.path for f in manifest.files} | {manifest.index.path}, old)
        return manifest


def write_records(
    rows: Iterable[Any],
    url: str,
    *,
    schema: Any,
    block_bytes: int = DEFAULT_BLOCK_BYTES,
    block_rows: int = DEFAULT_BLOCK_ROWS,
    compression: str | None = "auto",
    storage_options: dict[str, Any] | None = None,
    overwrite: bool = False,
) -> RecordManifest:
    """Write ``rows`` (mappings of column to value, or Arrow record batches / tables) as
    a records dataset at ``url`` with ``schema`` (a ``pyarrow.Schema``, or a mapping of
    column to an Arrow type or its name: ``{"image": "binary", "label": "int64"}``).

    ``compression``: Arrow's IPC buffer compression of every block (all its columns):
    ``"auto"`` (default) is ``"zstd"`` when zstd saves at least ``AUTO_MIN_SAVING`` (10%)
    of the first block's bytes, else none: blocks of full-size JPEGs stay as they are
    (zstd saves under 1% of them and would cost their in-place reads), blocks of text and
    numbers are compressed (to about half their bytes). ``"none"`` (or None), ``"lz4"`` or
    ``"zstd"`` set it; the manifest says which was used."""
    writer = RecordWriter(
        url,
        schema,
        block_bytes=block_bytes,
        block_rows=block_rows,
        compression=compression,
        storage_options=storage_options,
        overwrite=overwrite,
    )
    with writer:
        writer.extend(rows)
    assert writer.manifest is not None
    return writer.manifest


def read_record_manifest(storage: Storage) -> RecordManifest:
    from stoker.formats.kinds import manifest_bytes

    return RecordManifest.from_json(*manifest_bytes(storage))


class RecordSource:
    """A records dataset on storage: its manifest, schema and block index, and its
    blocks as Arrow record batches."""

    def __init__(
        self,
        url: str,
        storage_options: dict[str, Any] | None = None,
        storage: Storage | None = None,
        retry: RetryPolicy | None = None,
        cache: BlockCache | None = None,
    ) -> None:
        pa = _arrow()
        self.storage = storage or Storage(url, storage_options, retry=retry)
        self.cache: BlockCache = cache if cache is not None else NullCache()
        self.url = self.storage.url
        self.manifest = m = read_record_manifest(self.storage)
        where = self.storage.url_of(MANIFEST_NAME)
        try:
            self.schema = pa.ipc.read_schema(pa.py_buffer(m.schema_bytes))
        except (pa.ArrowException, OSError) as exc:
            raise ManifestError(f"{where}: field 'schema' is not an Arrow schema ({exc})") from exc
        spelled = [(f.name, str(f.type), f.nullable) for f in self.schema]
        if spelled != [(c.name, c.type, c.nullable) for c in m.columns]:
            raise ManifestError(
                f"{where}: field 'columns' ({[c.name for c in m.columns]}) does not match "
                f"the schema ({self.schema.names})"
            )
        index_where = self.storage.url_of(m.index.path)
        try:
            index_bytes = self.storage.read(m.index.path)
        except FileNotFoundError as exc:
            raise ManifestError(
                f"{index_where}: block index listed in the manifest is missing"
            ) from exc
        if m.index.xxh64 is not None and f"{checksum(index_bytes):016x}" != m.index.xxh64:
            raise ChecksumError(
                f"{index_where}: block index checksum mismatch", file=m.index.path, block=-1
            )
        self.index = parse_record_index(index_bytes, m, index_where)
        self.first_rows = first_rows(self.index)

    @property
    def num_rows(self) -> int:
        return self.manifest.num_rows

    @property
    def num_blocks(self) -> int:
        return self.manifest.num_blocks

    def block_of(self, rows: np.ndarray) -> np.ndarray:
        """The block of each row."""
        r = np.asarray(rows, dtype=np.int64)
        if r.size and (int(r.min()) < 0 or int(r.max()) >= self.num_rows):
            raise IndexError(f"row outside [0, {self.num_rows}) of {self.url}")
        return np.searchsorted(self.first_rows, r, side="right") - 1

    def where(self, row: int, block: int | None = None) -> str:
        """Row ``row`` named for an error: its file, the row and its block."""
        b = int(self.block_of(np.array([row]))[0]) if block is None else block
        ref = self.manifest.block_file(b)
        return f"{self.storage.url_of(ref.path)}: row {row} (block {b})"

    def record(self, block: int) -> bytes:
        """The stored bytes of ``block``, checked against its checksum: from the cache when
        it holds them (the node agent's disk tier), else from storage (then cached)."""
        m = self.manifest
        ref = m.block_file(block)
        e = self.index[block]
        key = f"{m.dataset_id}/{block}"
        data = self.cache.get(key)
        if data is not None and len(data) == int(e["nbytes"]) and checksum(data) == int(e["xxh64"]):
            return data
        if data is not None:
            self.cache.discard(key)
        start = int(e["offset"])
        data = self.storage.read_range(ref.path, start, start + int(e["nbytes"]))
        if len(data) != int(e["nbytes"]) or checksum(data) != int(e["xxh64"]):
            raise ChecksumError(
                f"{self.storage.url_of(ref.path)}: block {block} (bytes {start}.."
                f"{start + int(e['nbytes'])}) does not match its checksum",
                file=ref.path,
                block=block,
            )
        self.cache.put(key, data)
        return data

    def decode(self, block: int, data: Any) -> pa.RecordBatch:
        """``block``'s record batch from its bytes (any buffer: Arrow reads them in place
        unless they are compressed)."""
        pa = _arrow()
        ref = self.manifest.block_file(block)
        where = f"{self.storage.url_of(ref.path)}: block {block}"
        try:
            reader = pa.ipc.open_stream(pa.py_buffer(data), options=_read_options())
            batches = list(reader)
        except (pa.ArrowException, OSError) as exc:  # (a forged buffer length: MemoryError)
            raise DatasetError(f"{where} is not an Arrow IPC stream ({exc})") from exc
        if not reader.schema.equals(self.schema):
            raise DatasetError(f"{where} has the schema {reader.schema}, not the dataset's")
        rows = int(self.index[block]["rows"])
        if len(batches) != 1 or batches[0].num_rows != rows:
            got = sum(b.num_rows for b in batches)
            raise DatasetError(
                f"{where} holds {len(batches)} record batches of {got} rows, the index says "
                f"one of {rows}"
            )
        try:  # every offset inside its buffer: the checksum covers bytes, not their sense
            batches[0].validate(full=True)
        except pa.ArrowException as exc:
            raise DatasetError(f"{where} is not a valid record batch ({exc})") from exc
        return batches[0]

    def block(self, block: int) -> pa.RecordBatch:
        """``block``'s rows: read in one range request, checked, as a record batch."""
        return self.decode(block, self.record(block))

    def rows(self, rows: Iterable[int]) -> pa.Table:
        """The rows ``rows`` (any order), as a table in that order (each block read once)."""
        pa = _arrow()
        r = np.asarray(list(rows), dtype=np.int64)
        blocks = self.block_of(r)
        out = []
        for b in np.unique(blocks).tolist():
            sel = np.flatnonzero(blocks == b)
            batch = self.block(b)
            out.append((sel, batch.take(pa.array(r[sel] - self.first_rows[b]))))
        order = np.empty(len(r), dtype=np.int64)
        tables, at = [], 0
        for sel, taken in out:
            order[sel] = np.arange(at, at + len(sel))
            tables.append(pa.Table.from_batches([taken]))
            at += len(sel)
        if not tables:
            return self.schema.empty_table()
        return pa.concat_tables(tables).take(pa.array(order))
