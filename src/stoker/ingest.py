"""Reading text documents from .txt, .jsonl and .parquet sources (any fsspec URL).

- ``.txt``: one document per file (``txt_split="file"``), per line
  (``"line"``) or per blank-line-separated paragraph (``"blank"``);
- ``.jsonl``: one JSON object per line, its text in ``text_field``;
- ``.parquet``: one document per row of ``text_column``.

Compressed variants (``.gz``, ``.zst``, ``.bz2``, ``.xz``) are read through
fsspec's compression inference. Errors name the file and line or row. Given a
``skip`` callback, an unreadable document (a line that is not the JSON object
asked for, a value that is not text, text that is not UTF-8, a parquet file
that cannot be read) and an empty file are reported to it and left out instead
of raised; a file that is not there, or of an unknown type, always raises.
Reading ``.parquet`` needs ``stoker[parquet]`` (pyarrow), sources on S3
``stoker[s3]``: each is an ``InputError`` naming the extra, before any work.

``progress`` callbacks receive how many bytes of the source file (as stored,
compressed or not) have been read so far, so that a caller can show progress
against the sizes :func:`check_sources` returns.
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import fsspec
from fsspec.compression import compr
from fsspec.utils import infer_compression

from stoker.errors import InputError
from stoker.extras import backend_error, require

Progress = Callable[[int], None]
#: Told what was left out and why (a message naming the file and line, row or byte).
Skip = Callable[[str], None]

KINDS = (".txt", ".jsonl", ".json", ".parquet")


@dataclass(frozen=True)
class SourceOptions:
    text_field: str = "text"
    text_column: str = "text"
    txt_split: str = "file"


def kind_of(path: str) -> str:
    name = path.lower()
    comp = infer_compression(name)
    if comp:
        name = name.rsplit(".", 1)[0]
    for kind in KINDS:
        if name.endswith(kind):
            return ".jsonl" if kind == ".json" else kind
    raise InputError(f"{path}: unsupported input type; expected one of {', '.join(KINDS)}")


def _url_to_fs(path: str, storage_options: dict[str, Any] | None) -> tuple[Any, str]:
    try:
        return fsspec.core.url_to_fs(path, **(storage_options or {}))
    except ImportError as exc:  # the URL's fsspec backend is an extra (stoker[s3], ...)
        protocol = path.split("://", 1)[0] if "://" in path else "file"
        raise InputError(str(backend_error(protocol, path, exc))) from exc


def check_sources(
    paths: list[str], storage_options: dict[str, Any] | None = None, skip: Skip | None = None
) -> list[tuple[str, int]]:
    """Each source and its size; fails before any work if a source is missing, empty
    (unless ``skip`` is given: then it is left out and reported), of an unknown type, or
    needs a package that is not installed."""
    if not paths:
        raise InputError("no input files given")
    out = []
    for path in paths:
        if kind_of(path) == ".parquet":
            require("pyarrow.parquet", "parquet", f"{path}: reading .parquet", InputError)
        fs, fpath = _url_to_fs(path, storage_options)
        try:
            size = fs.size(fpath)
        except FileNotFoundError as exc:
            raise InputError(f"{path}: input file not found") from exc
        if not size:
            if skip is None:
                raise InputError(f"{path}: input file is empty")
            skip(f"{path}: input file is empty")
            continue
        out.append((path, int(size)))
    return out


def iter_texts(
    path: str,
    opts: SourceOptions,
    storage_options: dict[str, Any] | None = None,
    progress: Progress | None = None,
    skip: Skip | None = None,
) -> Iterator[str]:
    """Documents of one source, in order; ``progress(bytes_read)`` as the file is read;
    unreadable documents raise, or go to ``skip`` (see the module's docstring)."""
    kind = kind_of(path)
    if kind == ".parquet":
        yield from _parquet(path, opts, storage_options, progress, skip)
        return
    fs, fpath = _url_to_fs(path, storage_options)
    comp = infer_compression(path)
    with fs.open(fpath, "rb") as raw:
        stream = compr[comp](raw, mode="rb") if comp else raw
        with io.TextIOWrapper(stream, encoding="utf-8") as fh:
            try:
                yield from _read_text(path, fh, kind, opts, raw.tell, progress, skip)
            except UnicodeDecodeError as exc:  # the rest of the file cannot be read as text
                what = (
                    f"{path}: not UTF-8 text (near byte {raw.tell():,} of the file: {exc.reason})"
                )
                if skip is None:
                    raise InputError(what) from exc
                skip(f"{what}; the rest of the file is left out")


def _read_text(
    path: str,
    fh: io.TextIOWrapper,
    kind: str,
    opts: SourceOptions,
    tell: Callable[[], int],
    progress: Progress | None,
    skip: Skip | None = None,
) -> Iterator[str]:
    """The documents of one opened text source (``tell``: bytes of the file read)."""
    if kind == ".jsonl":
        for lineno, line in enumerate(fh, 1):
            if progress is not None:
                progress(tell())
            if not line.strip():
                continue
            try:
                text = _json_text(path, lineno, line, opts.text_field)
            except InputError as exc:
                if skip is None:
                    raise
                skip(str(exc))
                continue
            yield text
    elif opts.txt_split == "file":
        yield fh.read()
    elif opts.txt_split == "line":
        for line in fh:
            if progress is not None:
                progress(tell())
            if line.strip():
                yield line.rstrip("\n")
    elif opts.txt_split == "blank":
        para: list[str] = []
        for line in fh:
            if progress is not None:
                progress(tell())
            if line.strip():
                para.append(line)
            elif para:
                yield "".join(para)
                para = []
        if para:
            yield "".join(para)
    else:
        raise InputError(f"txt_split must be file, line or blank, got {opts.txt_split!r}")
    if progress is not None:
        progress(tell())


def _json_text(path: str, lineno: int, line: str, field: str) -> str:
    """The text of one .jsonl line."""
    try:
        obj = json.loads(line)
    except ValueError as exc:
        raise InputError(f"{path}, line {lineno}: not valid JSON ({exc})") from exc
    if not isinstance(obj, dict):
        raise InputError(
            f"{path}, line {lineno}: a JSON {type(obj).__name__}, not an object with a "
            f"{field!r} field"
        )
    if field not in obj:
        fields = ", ".join(repr(k) for k in obj) or "none"
        raise InputError(
            f"{path}, line {lineno}: no field {field!r} (fields: {fields}); "
            "name the text field with --text-field"
        )
    text = obj[field]
    if not isinstance(text, str):
        raise InputError(
            f"{path}, line {lineno}: field {field!r} is a {type(text).__name__}, not a string"
        )
    return text


def _parquet(
    path: str,
    opts: SourceOptions,
    storage_options: dict[str, Any] | None,
    progress: Progress | None,
    skip: Skip | None = None,
) -> Iterator[str]:
    pq = require("pyarrow.parquet", "parquet", f"{path}: reading .parquet", InputError)
    fs, fpath = _url_to_fs(path, storage_options)
    size = int(fs.size(fpath))
    with fs.open(fpath, "rb") as fh:
        try:
            pf = pq.ParquetFile(fh)
        except Exception as exc:
            what = f"{path}: not a readable parquet file ({exc})"
            if skip is None:
                raise InputError(what) from exc
            skip(what)
            return
        if opts.text_column not in pf.schema_arrow.names:
            raise InputError(
                f"{path}: no column {opts.text_column!r} (columns: {', '.join(pf.schema_arrow.names)})"
            )
        rows = max(1, pf.metadata.num_rows)
        done = 0
        for batch in pf.iter_batches(columns=[opts.text_column], batch_size=1024):
            for row, text in enumerate(batch.column(0).to_pylist(), done):
                if text is None:
                    continue
                if not isinstance(text, str):
                    what = (
                        f"{path}, row {row}: column {opts.text_column!r} holds a "
                        f"{type(text).__name__}, not text"
                    )
                    if skip is None:
                        raise InputError(what)
                    skip(what)
                    continue
                yield text
            done += batch.num_rows
            if progress is not None:
                progress(size * done // rows)  # bytes in proportion to the rows read
