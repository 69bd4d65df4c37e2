"""``build-records``: image collections into a records dataset, streaming.

Sources (told from what is there, or named with ``source_format``):

- ``imagefolder``: a directory with one folder of images per class (torchvision's
  ImageFolder): ``image`` (the file's bytes), ``label`` (the class's index among the
  folder names, sorted) and ``path`` (the file, relative to the directory); the class
  names go into the manifest's ``metadata``.
- ``webdataset``: tar shards, a sample the members that share a key (the name before
  its first dot): the first ``jpg`` / ``jpeg`` / ``png`` / ``webp`` member is the
  image, a ``cls`` member (an integer) or a ``json`` member's ``label`` the label, the
  key the ``path``.
- ``parquet`` and ``jsonl``: rows with the image's bytes (a binary column) or its path
  (a string column, relative to the file that names it), and a label column.
- ``hf``: a Hugging Face dataset saved to disk (``Dataset.save_to_disk``: a directory
  with ``state.json``), its ``image`` column an ``Image()`` feature (bytes, or a path
  where the bytes were not kept) or binary, its ``label`` an integer or a
  ``ClassLabel`` (whose names go into the manifest's ``metadata``).

Images are stored as they came (never re-encoded). Each is opened (its header read:
not decoded) unless ``check_images=False``, so that a file that is not an image, or a
pixel bomb, is named at build time, not in the middle of a training run. A bad item
(that, a missing file, a row without its label) is an :class:`~stoker.errors.InputError`
naming the file (and the row or tar member); with ``on_error="skip"`` it is left out
and counted. Progress is counted in bytes of the sources (known before any work), so
a progress bar has a total and an ETA.
"""

from __future__ import annotations

import contextlib
import json
import os
import tarfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from stoker.errors import ImageError, InputError
from stoker.formats.records import DEFAULT_BLOCK_BYTES, RecordWriter
from stoker.record_manifest import RecordManifest

FORMATS = ("imagefolder", "webdataset", "parquet", "jsonl", "hf")
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".webp", ".bmp", ".gif", ".tif", ".tiff")
_TAR_IMAGE = ("jpg", "jpeg", "png", "webp")
SCHEMA = {"image": "binary", "label": "int64", "path": "string"}
#: Errors kept by name in the stats (the rest are only counted).
_KEEP_ERRORS = 20

#: Called with (bytes of the sources done, their total).
Progress = Callable[[int, int], None]


@dataclass
class BuildStats:
    """What :func:`build_records` wrote, and what it left out."""

    rows: int = 0
    skipped: int = 0
    errors: list[str] = field(default_factory=list)  # the first of the skipped, named
    source_bytes: int = 0
    seconds: float = 0.0
    manifest: RecordManifest | None = None


@dataclass(frozen=True)
class _Item:
    """A row, or what stops it from being one (``error``), and where it came from."""

    where: str
    row: dict[str, Any] | None = None
    error: str | None = None
    done: int = 0  # bytes of the sources read up to it, where known (for progress)


def kind_of(srcs: Sequence[str]) -> str:
    """The sources' kind, from what is there."""
    first = srcs[0]
    if os.path.isdir(first):
        from stoker.converters.arrow import kind_of as arrow_kind

        if arrow_kind(first) == "hf":  # (a DatasetDict: an error naming its splits)
            return "hf"
        if any(e.endswith(".tar") for e in os.listdir(first)):
            return "webdataset"
        return "imagefolder"
    for ext, kind in ((".tar", "webdataset"), (".parquet", "parquet"), (".jsonl", "jsonl")):
        if first.endswith(ext):
            return kind
    raise InputError(
        f"{first}: cannot tell what this is; name it with --from ({', '.join(FORMATS)})"
    )


def _imagefolder(root: str) -> tuple[Iterator[_Item], int, dict[str, Any]]:
    if not os.path.isdir(root):
        raise InputError(f"{root}: not a directory (an ImageFolder is one folder per class)")
    classes = sorted(
        e
        for e in os.listdir(root)
        if os.path.isdir(os.path.join(root, e)) and not e.startswith(".")
    )
    if not classes:
        raise InputError(f"{root}: no class folders (an ImageFolder is one folder per class)")
    files: list[tuple[str, int]] = []
    for label, c in enumerate(classes):
        for dirpath, dirnames, names in os.walk(os.path.join(root, c)):
            dirnames.sort()
            for n in sorted(names):
                if n.lower().endswith(IMAGE_EXTENSIONS):
                    files.append((os.path.join(dirpath, n), label))
    if not files:
        raise InputError(f"{root}: no image files ({', '.join(IMAGE_EXTENSIONS)}) in its folders")
    sizes = [os.path.getsize(p) for p, _ in files]

    def items() -> Iterator[_Item]:
        done = 0
        for (path, label), size in zip(files, sizes, strict=True):
            rel = os.path.relpath(path, root)
            done += size
            try:
                with open(path, "rb") as f:
                    data = f.read()
            except OSError as exc:
                yield _Item(path, error=f"cannot be read ({exc})", done=done)
                continue
            yield _Item(path, {"image": data, "label": label, "path": rel}, done=done)

    return items(), sum(sizes), {"source": "imagefolder", "classes": classes}


def _webdataset(srcs: Sequence[str]) -> tuple[Iterator[_Item], int, dict[str, Any]]:
    tars = []
    for s in srcs:
        if os.path.isdir(s):
            tars += sorted(os.path.join(s, e) for e in os.listdir(s) if e.endswith(".tar"))
        else:
            tars.append(s)
    for t in tars:
        if not os.path.isfile(t):
            raise InputError(f"{t}: no such tar shard")
    total = sum(os.path.getsize(t) for t in tars)

    def sample(tar: str, key: str, parts: dict[str, bytes]) -> _Item:
        where = f"{tar}: sample {key!r}"
        image = next((parts[e] for e in _TAR_IMAGE if e in parts), None)
        if image is None:
            return _Item(
                where, error=f"no image member ({', '.join(_TAR_IMAGE)}); it has {sorted(parts)}"
            )
        label: Any = None
        if "cls" in parts:
            try:
                label = int(parts["cls"].decode().strip())
            except (UnicodeDecodeError, ValueError):
                return _Item(where, error=f"its cls member {parts['cls'][:40]!r} is not an integer")
        elif "json" in parts:
            try:
                label = json.loads(parts["json"]).get("label")
            except (ValueError, AttributeError):
                label = None
        return _Item(where, {"image": image, "label": label, "path": key})

    def items() -> Iterator[_Item]:
        done = 0
        for tar in tars:
            try:
                with tarfile.open(tar, mode="r|*") as tf:
                    key, parts = None, {}
                    for m in tf:
                        if not m.isfile():
                            continue
                        base = os.path.basename(m.name)
                        k = os.path.join(os.path.dirname(m.name), base.split(".", 1)[0])
                        ext = base.split(".", 1)[1].lower() if "." in base else ""
                        if key is not None and k != key:
                            yield sample(tar, key, parts)
                            parts = {}
                        key = k
                        f = tf.extractfile(m)
                        parts[ext] = f.read() if f is not None else b""
                    if key is not None:
                        yield sample(tar, key, parts)
            except (tarfile.TarError, OSError) as exc:
                raise InputError(f"{tar}: not a readable tar shard ({exc})") from exc
            done += os.path.getsize(tar)
            yield _Item(tar, done=done)  # (progress only)

    return items(), total, {"source": "webdataset"}


def _table(
    srcs: Sequence[str], kind: str, image_column: str | None, path_column: str | None,
    label_column: str,
) -> tuple[Iterator[_Item], int, dict[str, Any]]:  # fmt: skip
    for s in srcs:
        if not os.path.isfile(s):
            raise InputError(f"{s}: no such file")
    total = sum(os.path.getsize(s) for s in srcs)

    def rows_of(src: str) -> Iterator[tuple[int, dict[str, Any]]]:
        if kind == "jsonl":
            with open(src, "rb") as f:
                for n, line in enumerate(f, 1):
                    if not line.strip():
                        continue
                    try:
                        obj = json.loads(line)
                    except ValueError as exc:
                        raise InputError(f"{src}: line {n} is not JSON ({exc})") from exc
                    if not isinstance(obj, dict):
                        raise InputError(f"{src}: line {n} is not a JSON object")
                    yield n, obj
            return
        import pyarrow.parquet as pq

        try:
            pf = pq.ParquetFile(src)
        except Exception as exc:
            raise InputError(f"{src}: not a readable parquet file ({exc})") from exc
        names = pf.schema_arrow.names
        wanted = [c for c in (image_column, path_column, label_column) if c]
        missing = [c for c in wanted if c not in names]
        if missing:
            raise InputError(f"{src}: no column {missing[0]!r} (it has {names})")
        n = 0
        for batch in pf.iter_batches(columns=wanted):
            for r in batch.to_pylist():
                n += 1
                yield n, r

    def items() -> Iterator[_Item]:
        done = 0
        for src in srcs:
            base = os.path.dirname(os.path.abspath(src))
            what = "line" if kind == "jsonl" else "row"
            for n, r in rows_of(src):
                where = f"{src}: {what} {n}"
                if image_column is not None:
                    data = r.get(image_column)
                    if not isinstance(data, (bytes, bytearray)):
                        yield _Item(
                            where,
                            error=f"column {image_column!r} is not bytes ({type(data).__name__})",
                        )
                        continue
                    path = str(r.get(path_column) or "") if path_column else ""
                else:
                    assert path_column is not None
                    named = r.get(path_column)
                    if not isinstance(named, str) or not named:
                        yield _Item(
                            where, error=f"column {path_column!r} holds no path ({named!r})"
                        )
                        continue
                    path = named
                    full = path if os.path.isabs(path) else os.path.join(base, path)
                    try:
                        with open(full, "rb") as f:
                            data = f.read()
                    except OSError as exc:
                        yield _Item(f"{where} ({full})", error=f"cannot be read ({exc})")
                        continue
                yield _Item(
                    where, {"image": bytes(data), "label": r.get(label_column), "path": path}
                )
            done += os.path.getsize(src)
            yield _Item(src, done=done)

    return items(), total, {"source": kind}


def _hf(
    src: str, image_column: str | None, label_column: str
) -> tuple[Iterator[_Item], int, dict[str, Any]]:
    """A saved Hugging Face dataset's rows: the image's bytes (an ``Image()`` feature's
    ``bytes``, else the file at its ``path``) and the label."""
    import pyarrow as pa

    from stoker.converters.arrow import hf_files

    files = hf_files(src)
    for f in files:
        if not os.path.isfile(f):
            raise InputError(f"{f}: not found (listed in {src}/state.json)")
    total = sum(os.path.getsize(f) for f in files)
    metadata: dict[str, Any] = {"source": "hf"}
    column = image_column or "image"
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError, AttributeError):
        with open(os.path.join(src, "dataset_info.json")) as fh:
            feature = json.load(fh)["features"][label_column]
        if feature.get("_type") == "ClassLabel" and isinstance(feature.get("names"), list):
            metadata["classes"] = [str(n) for n in feature["names"]]

    def items() -> Iterator[_Item]:
        done = 0
        for f in files:
            n = 0
            try:
                with pa.memory_map(f, "r") as mm:
                    reader = pa.ipc.open_stream(mm)
                    names = reader.schema.names
                    for c in (column, label_column):
                        if c not in names:
                            raise InputError(f"{f}: no column {c!r} (it has {names})")
                    for batch in reader:
                        images = batch.column(column).to_pylist()
                        labels = batch.column(label_column).to_pylist()
                        for image, label in zip(images, labels, strict=True):
                            n += 1
                            yield _hf_item(f"{f}: row {n}", image, label, column)
            except pa.ArrowException as exc:
                raise InputError(f"{f}: not an Arrow stream a saved dataset holds ({exc})") from exc
            done += os.path.getsize(f)
            yield _Item(f, done=done)

    return items(), total, metadata


def _hf_item(where: str, image: Any, label: Any, column: str) -> _Item:
    path = ""
    if isinstance(image, dict):  # an Image() feature: {"bytes": ..., "path": ...}
        path = str(image.get("path") or "")
        data = image.get("bytes")
        if data is None and path:
            try:
                with open(path, "rb") as fh:
                    data = fh.read()
            except OSError as exc:
                return _Item(f"{where} ({path})", error=f"cannot be read ({exc})")
    else:
        data = image
    if not isinstance(data, (bytes, bytearray)):
        return _Item(where, error=f"column {column!r} holds no image bytes ({type(data).__name__})")
    return _Item(where, {"image": bytes(data), "label": label, "path": path})


def build_records(
    srcs: Sequence[str] | str,
    url: str,
    *,
    source_format: str | None = None,
    image_column: str | None = None,
    path_column: str | None = None,
    label_column: str = "label",
    on_error: str = "raise",
    check_images: bool = True,
    block_bytes: int = DEFAULT_BLOCK_BYTES,
    compression: str | None = "auto",
    storage_options: dict[str, Any] | None = None,
    overwrite: bool = False,
    progress: Progress | None = None,
) -> BuildStats:
    """Write the images of ``srcs`` (see the module docstring) as a records dataset at
    ``url`` with the columns ``image`` (bytes), ``label`` (int64) and ``path`` (string).

    ``image_column`` / ``path_column``: where parquet or jsonl rows hold the image's
    bytes or its path (default: ``image`` if the rows have it, else ``path``); a saved
    Hugging Face dataset's image column (default ``image``).
    ``on_error="skip"`` leaves out (and counts) an item that cannot be read, is not an
    image, or has no label; the default raises naming it."""
    if on_error not in ("raise", "skip"):
        raise InputError(f"on_error must be 'raise' or 'skip', got {on_error!r}")
    sources = [srcs] if isinstance(srcs, str) else list(srcs)
    if not sources:
        raise InputError("no sources to build from")
    kind = source_format or kind_of(sources)
    if kind not in FORMATS:
        raise InputError(f"--from must be one of {', '.join(FORMATS)}, got {kind!r}")
    t0 = time.perf_counter()
    if kind == "imagefolder":
        if len(sources) != 1:
            raise InputError("an ImageFolder source is one directory")
        items, total, metadata = _imagefolder(sources[0])
    elif kind == "webdataset":
        items, total, metadata = _webdataset(sources)
    elif kind == "hf":
        if len(sources) != 1:
            raise InputError("a saved Hugging Face dataset is one directory")
        items, total, metadata = _hf(sources[0], image_column, label_column)
    else:
        if image_column is None and path_column is None:
            image_column = "image" if kind == "parquet" else None
            path_column = None if kind == "parquet" else "path"
        items, total, metadata = _table(sources, kind, image_column, path_column, label_column)
    stats = BuildStats(source_bytes=total)
    writer = RecordWriter(
        url,
        SCHEMA,
        block_bytes=block_bytes,
        compression=compression,
        storage_options=storage_options,
        overwrite=overwrite,
        metadata=metadata,
    )
    with writer:
        for item in items:
            if item.done and progress is not None:
                progress(item.done, total)
            if item.row is None and item.error is None:  # (a source finished: progress only)
                continue
            error = item.error or _problem(item.row, check_images)
            if error is not None:
                if on_error == "raise":
                    raise InputError(f"{item.where}: {error}")
                stats.skipped += 1
                if len(stats.errors) < _KEEP_ERRORS:
                    stats.errors.append(f"{item.where}: {error}")
            else:
                assert item.row is not None
                writer.add(item.row)
                stats.rows += 1
        if stats.rows == 0:
            raise InputError(
                f"no images to write to {url}"
                + (f" ({stats.skipped} skipped)" if stats.skipped else "")
            )
    stats.manifest = writer.manifest
    stats.seconds = time.perf_counter() - t0
    return stats


def _problem(row: dict[str, Any] | None, check: bool) -> str | None:
    """Why ``row`` cannot be written (None: it can)."""
    assert row is not None
    label = row.get("label")
    if label is None:
        return "no label"
    if isinstance(label, bool) or not isinstance(label, int):
        try:
            row["label"] = int(label)
        except (TypeError, ValueError):
            return f"label {label!r} is not an integer"
    if check:
        from stoker.records.image import open_image

        try:
            open_image(row["image"]).close()
        except ImageError as exc:
            return str(exc)
    return None
