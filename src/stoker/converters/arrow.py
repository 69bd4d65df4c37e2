"""Token-id columns in Arrow data, read for conversion: Hugging Face datasets saved to
disk (``Dataset.save_to_disk``: a directory of Arrow IPC stream files named by its
``state.json``), parquet files (one, or a directory of them) and Arrow IPC files or
streams (``.arrow``).

A document is one row of the column: a list of integer token ids. The files are
read a record batch at a time (memory-mapped where they are Arrow), so nothing is
held but the batch being written. A missing column, a column that is not a list of
integers, or a file that cannot be read is an :class:`~stoker.errors.InputError`
naming the file (and the row, for a row that does not fit). Needs pyarrow
(``stoker[parquet]``).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from stoker.errors import InputError
from stoker.extras import require

#: The column read when none is named: the first of these a source has.
COLUMNS = ("input_ids", "tokens", "token_ids", "ids")


def _pa() -> Any:
    return require("pyarrow", "parquet", "converting Arrow and parquet data", InputError)


def kind_of(src: str) -> str | None:
    """``hf`` (a saved Hugging Face dataset), ``parquet``, ``arrow``, or None."""
    if os.path.isdir(src):
        if os.path.isfile(os.path.join(src, "state.json")):
            return "hf"
        if os.path.isfile(os.path.join(src, "dataset_dict.json")):
            splits = sorted(
                e for e in os.listdir(src) if os.path.isfile(os.path.join(src, e, "state.json"))
            )
            raise InputError(
                f"{src}: a Hugging Face DatasetDict; convert one of its splits "
                f"({', '.join(os.path.join(src, s) for s in splits) or 'none found'})"
            )
        if any(e.endswith(".parquet") for e in os.listdir(src)):
            return "parquet"
        return None
    if src.endswith(".parquet"):
        return "parquet"
    if src.endswith(".arrow"):
        return "arrow"
    return None


@dataclass
class ArrowSource:
    """The token-id column ``column`` of the files ``files`` (in order), of kind ``kind``."""

    src: str
    kind: str
    files: list[str]
    column: str

    @property
    def total_documents(self) -> int | None:
        if self.kind != "parquet":
            return None
        pq = require("pyarrow.parquet", "parquet", "converting parquet data", InputError)
        total = 0
        for f in self.files:
            with pq.ParquetFile(f) as pf:
                total += pf.metadata.num_rows
        return total

    def _batches(self) -> Iterator[tuple[str, int, Any]]:
        """(file, first row, the column's values of a record batch)."""
        pa = _pa()
        for path in self.files:
            row = 0
            try:
                if self.kind == "parquet":
                    pq = require(
                        "pyarrow.parquet", "parquet", "converting parquet data", InputError
                    )
                    with pq.ParquetFile(path) as pf:
                        self._check(path, pf.schema_arrow)
                        for batch in pf.iter_batches(columns=[self.column], batch_size=4096):
                            yield path, row, batch.column(0)
                            row += batch.num_rows
                    continue
                with pa.memory_map(path, "r") as source:
                    try:
                        reader = pa.ipc.open_file(source)
                        batches: Any = (
                            reader.get_batch(i) for i in range(reader.num_record_batches)
                        )
                        schema = reader.schema
                    except pa.ArrowInvalid:
                        source.seek(0)
                        reader = pa.ipc.open_stream(source)
                        batches, schema = reader, reader.schema
                    self._check(path, schema)
                    at = schema.get_field_index(self.column)
                    for batch in batches:
                        yield path, row, batch.column(at)
                        row += batch.num_rows
            except (OSError, pa.ArrowException) as exc:
                raise InputError(f"{path}: cannot be read as {self.kind} ({exc})") from exc

    def _check(self, path: str, schema: Any) -> None:
        pa = _pa()
        if self.column not in schema.names:
            raise InputError(
                f"{path}: no column {self.column!r} (columns: {', '.join(schema.names)}); "
                "name the token-id column with --column"
            )
        t = schema.field(self.column).type
        if not (
            (pa.types.is_list(t) or pa.types.is_large_list(t)) and pa.types.is_integer(t.value_type)
        ):
            raise InputError(
                f"{path}: column {self.column!r} is {t}, not a list of integer token ids"
            )

    def documents(self) -> Iterator[tuple[np.ndarray, str]]:
        """Each row's tokens (a null row: none) and where it is, for messages."""
        for path, first, col in self._batches():
            col = col.combine_chunks() if hasattr(col, "combine_chunks") else col
            offsets = np.asarray(col.offsets)
            values = col.values.to_numpy(zero_copy_only=False)
            valid = np.asarray(col.is_valid())
            base = int(offsets[0]) if len(offsets) else 0
            for i in range(len(col)):
                lo, hi = int(offsets[i]) - base, int(offsets[i + 1]) - base
                # a copy: the batch's memory (a mapped file) goes when the file is done
                doc = values[lo:hi].copy() if valid[i] else values[:0].copy()
                yield doc, f"{path}, row {first + i}"

    def largest(self) -> int:
        """The largest token id (one pass); refuses a negative one."""
        pc = require("pyarrow.compute", "parquet", "converting Arrow data", InputError)
        top = 0
        for path, first, col in self._batches():
            values = col.values if hasattr(col, "values") else col.combine_chunks().values
            if len(values):
                lo = pc.min(values).as_py()
                if lo is not None and lo < 0:
                    raise InputError(f"{path}: a negative token id ({lo}) from row {first} on")
                top = max(top, pc.max(values).as_py() or 0)
        return int(top)


def hf_files(src: str) -> list[str]:
    """The Arrow files of a Hugging Face dataset saved to disk at ``src``, in order (from
    its ``state.json``); InputError when that is not a saved dataset's state."""
    try:
        with open(os.path.join(src, "state.json")) as fh:
            state = json.load(fh)
        return [os.path.join(src, f["filename"]) for f in state["_data_files"]]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise InputError(
            f"{os.path.join(src, 'state.json')}: not a saved dataset's state ({exc})"
        ) from exc


def open_source(src: str, kind: str, column: str | None) -> ArrowSource:
    """The Arrow source at ``src`` (see :func:`kind_of`), reading ``column`` (default: the
    first of :data:`COLUMNS` it has)."""
    _pa()
    if kind == "hf":
        files = hf_files(src)
    elif os.path.isdir(src):
        files = sorted(os.path.join(src, e) for e in os.listdir(src) if e.endswith(".parquet"))
    else:
        files = [src]
    for f in files:
        if not os.path.isfile(f):
            raise InputError(f"{f}: not found")
    if column is None:
        names = _schema(files[0], kind).names if files else []
        column = next((c for c in COLUMNS if c in names), None)
        if column is None:
            raise InputError(
                f"{files[0] if files else src}: none of the columns {', '.join(COLUMNS)} "
                f"(columns: {', '.join(names)}); name the token-id column with --column"
            )
    return ArrowSource(src, kind, files, column)


def _schema(path: str, kind: str) -> Any:
    pa = _pa()
    try:
        if kind == "parquet":
            pq = require("pyarrow.parquet", "parquet", "converting parquet data", InputError)
            with pq.ParquetFile(path) as pf:
                return pf.schema_arrow
        with pa.memory_map(path, "r") as source:
            try:
                return pa.ipc.open_file(source).schema
            except pa.ArrowInvalid:
                source.seek(0)
                return pa.ipc.open_stream(source).schema
    except (OSError, pa.ArrowException) as exc:
        raise InputError(f"{path}: cannot be read as {kind} ({exc})") from exc
