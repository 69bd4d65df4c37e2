"""What the node agent holds of a records dataset, and how a reader reads it back.

A records dataset can be held two ways in the agent's memory tier (a
:class:`View` says which, sent to the agent with the dataset's URL):

* ``"blocks"``: each block's stored bytes, verified (one Arrow IPC stream). Fetched
  once per node; every process decodes its images itself.
* ``"images"``: each block's images decoded, before the random part of the
  augmentation (:func:`~stoker.records.image.prepare`: RGB, the short side resized
  to ``short_side`` when given), as one Arrow IPC stream of its own: ``pixels``
  (large_binary, each an image's ``height x width x 3`` uint8 bytes), ``height``,
  ``width``, ``error`` (null, or why the row's image did not decode) and the block's
  other columns the reader needs. Decoded once per node; every local process maps the
  file read-only and crops from it in place, without a copy.

A row whose image does not decode does not fail its block in the agent: its error is
kept in the row and raised, named, by the reader that makes the sample (as a reader
decoding for itself would). The file is written aside and renamed, so a reader never
maps half of one.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from stoker.errors import ConfigError, DatasetError, ImageError
from stoker.formats.codec import checksum
from stoker.records.image import DECODERS, MAX_PIXELS, prepare

HOLDS = ("blocks", "images")


@dataclass(frozen=True)
class View:
    """How the agent holds a records dataset: ``hold`` ``"blocks"`` or ``"images"``; for
    images, the column they are in, ``short_side`` (None: full size), the pixel limit
    and decoder of :func:`~stoker.records.image.prepare`, and the ``columns`` kept
    beside them (the label)."""

    hold: str = "blocks"
    image_column: str = "image"
    short_side: int | None = None
    max_pixels: int = MAX_PIXELS
    decoder: str = "auto"
    columns: tuple[str, ...] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        if self.hold not in HOLDS:
            raise ConfigError(f"hold must be one of {list(HOLDS)}, got {self.hold!r}")
        if self.short_side is not None and self.short_side < 1:
            raise ConfigError(f"short_side must be >= 1 (or None), got {self.short_side}")
        if self.decoder not in DECODERS or self.max_pixels < 1:
            raise ConfigError(
                f"not a records view: decoder {self.decoder!r}, max_pixels {self.max_pixels}"
            )

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> View:
        """The view a reader sent (ConfigError when it is not one)."""
        bad = ConfigError(f"not a records view: {text[:200]!r}")
        try:
            raw = json.loads(text)
        except ValueError as exc:
            raise bad from exc
        if not isinstance(raw, dict) or not set(raw) <= {f for f in cls.__dataclass_fields__}:
            raise bad
        columns = raw.get("columns", [])
        short = raw.get("short_side")
        if not (
            isinstance(raw.get("hold", ""), str)
            and isinstance(raw.get("image_column", ""), str)
            and isinstance(raw.get("decoder", ""), str)
            and (short is None or type(short) is int)
            and type(raw.get("max_pixels", 1)) is int
            and isinstance(columns, list)
            and all(isinstance(c, str) for c in columns)
        ):
            raise bad
        raw["columns"] = tuple(columns)
        return cls(**raw)

    def check(self, schema: Any, where: str) -> None:
        """ConfigError unless the columns this view reads are in ``schema``."""
        missing = [c for c in (self.image_column, *self.columns) if c not in schema.names]
        if missing:
            raise ConfigError(f"{where}: the view reads columns {missing} the dataset lacks")

    def key(self, dataset_id: str) -> str:
        """The name the agent keeps this view of ``dataset_id`` under (its blocks: the
        dataset's id; its images: the id and a digest of the view)."""
        if self.hold == "blocks":
            return dataset_id
        return f"{dataset_id}.i{checksum(self.to_json().encode()):016x}"


def held_schema(source_schema: Any, columns: tuple[str, ...]) -> Any:
    """The schema of a held-images block: pixels, height, width, error, ``columns``."""
    import pyarrow as pa

    kept = [source_schema.field(c) for c in columns]
    return pa.schema(
        [
            pa.field("pixels", pa.large_binary()),
            pa.field("height", pa.int32()),
            pa.field("width", pa.int32()),
            pa.field("error", pa.string()),
            *kept,
        ]
    )


def prepare_block(batch: Any, view: View) -> tuple[Any, int]:
    """A records block's images prepared as ``view`` says: the held block (a record
    batch) and how many images decoded."""
    import pyarrow as pa

    images = batch.column(view.image_column)
    pixels: list[np.ndarray] = []
    heights: list[int] = []
    widths: list[int] = []
    problems: list[str | None] = []
    for data in images.to_pylist():
        try:
            if data is None:
                raise ImageError(f"column {view.image_column!r} is empty (null)")
            a = prepare(data, view.short_side, view.max_pixels, view.decoder)
        except Exception as exc:  # (any failure of one image is that row's, not the block's)
            a = np.zeros((0, 0, 3), np.uint8)
            problems.append(str(exc) if isinstance(exc, ImageError) else
                            f"does not decode ({type(exc).__name__}: {exc})")  # fmt: skip
        else:
            problems.append(None)
        pixels.append(a.reshape(-1))
        heights.append(a.shape[0])
        widths.append(a.shape[1])
    offsets = np.zeros(len(pixels) + 1, dtype=np.int64)
    np.cumsum([len(p) for p in pixels], out=offsets[1:])
    values = np.concatenate(pixels) if pixels else np.zeros(0, np.uint8)  # (one copy)
    column = pa.LargeBinaryArray.from_buffers(
        pa.large_binary(), len(pixels), [None, pa.py_buffer(offsets), pa.py_buffer(values)]
    )
    schema = held_schema(batch.schema, view.columns)
    arrays = [
        column,
        pa.array(heights, pa.int32()),
        pa.array(widths, pa.int32()),
        pa.array(problems, pa.string()),
        *(batch.column(c) for c in view.columns),
    ]
    decoded = sum(p is None for p in problems)
    return pa.RecordBatch.from_arrays(arrays, schema=schema), decoded


def write_batch(path: Path, batch: Any) -> int:
    """Write ``batch`` as one Arrow IPC stream to ``path`` (aside, then renamed); its bytes.
    Raises OSError (ENOSPC when the filesystem is full) and leaves nothing behind."""
    import pyarrow as pa

    tmp = path.with_name(path.name + ".tmp")
    try:
        with pa.OSFile(str(tmp), "wb") as f, pa.ipc.new_stream(f, batch.schema) as w:
            w.write_batch(batch)
        os.chmod(tmp, 0o600)
        os.replace(tmp, path)
    except (OSError, pa.ArrowException) as exc:
        tmp.unlink(missing_ok=True)
        if isinstance(exc, OSError):
            raise
        raise OSError(str(exc)) from exc
    return path.stat().st_size


def map_file(path: str | Path) -> Any:
    """A memory-tier file mapped read-only, as an Arrow buffer (no copy)."""
    import pyarrow as pa

    with pa.memory_map(str(path), "r") as mm:
        return mm.read_buffer()


def read_held(buffer: Any, rows: int, schema: Any, where: str) -> Any:
    """A held-images block's record batch from its mapped buffer, checked: its schema is
    ``schema`` (:func:`held_schema`: names and types), it holds ``rows`` rows, and every
    row's pixels are inside the buffer and of its height x width x 3 bytes, height and
    width not negative (DatasetError naming ``where`` otherwise)."""
    import pyarrow as pa

    try:
        reader = pa.ipc.open_stream(buffer)
        batches = list(reader)
    except (pa.ArrowException, OSError) as exc:
        raise DatasetError(
            f"{where}: the agent's decoded block is not an Arrow stream ({exc})"
        ) from exc
    if len(batches) != 1 or batches[0].num_rows != rows:
        raise DatasetError(f"{where}: the agent's decoded block does not hold {rows} rows")
    batch = batches[0]
    if not batch.schema.equals(schema):
        raise DatasetError(
            f"{where}: the agent's decoded block has the schema {batch.schema}, not {schema}"
        )
    try:
        batch.validate(full=True)
    except pa.ArrowException as exc:
        raise DatasetError(f"{where}: the agent's decoded block is not valid ({exc})") from exc
    # (by position: a kept column may share a name with one of the first four)
    h = batch.column(1).to_numpy(zero_copy_only=False)
    w = batch.column(2).to_numpy(zero_copy_only=False)
    if batch.column(1).null_count or batch.column(2).null_count or np.any(h < 0) or np.any(w < 0):
        raise DatasetError(f"{where}: the agent's decoded block has a negative or missing size")
    offsets = _offsets(batch.column(0))
    # (int32 sizes, not negative: the product fits in int64)
    if np.any(np.diff(offsets) != h.astype(np.int64) * w.astype(np.int64) * 3):
        raise DatasetError(f"{where}: the agent's decoded block's pixels do not match their sizes")
    return batch


def _offsets(col: Any) -> np.ndarray:
    """A large_binary column's value offsets (int64, rows + 1), as a view."""
    buf = col.buffers()[1]
    return np.frombuffer(buf, dtype=np.int64, count=len(col) + 1, offset=col.offset * 8)


#: The key of a held row's ``(pixels, error)`` (not a string: no column's name).
HELD: Any = ("stoker", "held")


def held_rows(batch: Any, columns: tuple[str, ...]) -> Callable[[int], dict[str, Any]]:
    """Row ``r`` of a held-images block: ``columns``, and under :data:`HELD` its
    ``(pixels, error)``: a read-only ``(height, width, 3)`` view of the mapped file, or
    None and why the image did not decode."""
    col = batch.column(0)
    offsets = _offsets(col)
    values = np.frombuffer(col.buffers()[2], dtype=np.uint8) if len(col) else np.zeros(0, np.uint8)
    heights = batch.column(1).to_numpy(zero_copy_only=False)
    widths = batch.column(2).to_numpy(zero_copy_only=False)
    problems = batch.column(3)
    kept = {c: batch.column(4 + i) for i, c in enumerate(columns)}

    def row(r: int) -> dict[str, Any]:
        out: dict[Any, Any] = {c: v[r].as_py() for c, v in kept.items()}
        problem = problems[r].as_py()
        pixels = None
        if problem is None:
            px = values[offsets[r] : offsets[r + 1]]
            pixels = px.reshape(int(heights[r]), int(widths[r]), 3)
        out[HELD] = (pixels, problem)
        return out

    return row
