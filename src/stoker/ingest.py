"""Reading text documents from .txt, .jsonl and .parquet sources (any fsspec URL) and
MDS directories.

- ``.txt``: one document per file (``txt_split="file"``), per line
  (``"line"``) or per blank-line-separated paragraph (``"blank"``);
- ``.jsonl``: one JSON object per line, its text in ``text_field``;
- ``.parquet``: one document per row of ``text_column``;
- a MosaicML Streaming (MDS) directory (local): one document per sample of its
  ``str`` column ``text_column``.

Compressed variants (``.gz``, ``.zst``, ``.bz2``, ``.xz``) are read through
fsspec's compression inference. Errors name the file and line or row. Given a
``skip`` callback, an unreadable document (a line that is not the JSON object
asked for, a value that is not text, text that is not UTF-8, a parquet file
that cannot be read) and an empty file are reported to it and left out instead
of raised; a file that is not there, or of an unknown type, always raises. Lines
are decoded one by one, so a line that is not UTF-8 costs that line (a paragraph
in ``"blank"`` mode, the file in ``"file"`` mode) and is named with its number and
byte; a compressed file cut short keeps the documents read before the cut.
Reading ``.parquet`` needs ``stoker[parquet]`` (pyarrow), sources on S3
``stoker[s3]``: each is an ``InputError`` naming the extra, before any work.

``progress`` callbacks receive how many bytes of the source file (as stored,
compressed or not) have been read so far, so that a caller can show progress
against the sizes :func:`check_sources` returns.
"""

from __future__ import annotations

import json
import os
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
    from stoker.converters import mds

    if mds.is_mds(path):  # a local MosaicML Streaming directory: its text column
        return "mds"
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
        kind = kind_of(path)
        if kind == "mds":
            from stoker.converters import mds

            out.append((path, sum(os.path.getsize(s.path) for s in mds.read_index(path))))
            continue
        if kind == ".parquet":
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
    if kind == "mds":
        from stoker.converters import mds

        for text, done in mds.open_mds(path, opts.text_column, None).texts(skip):
            if progress is not None:
                progress(done)
            yield text
        return
    fs, fpath = _url_to_fs(path, storage_options)
    comp = infer_compression(path)
    with fs.open(fpath, "rb") as raw:
        stream = compr[comp](raw, mode="rb") if comp else raw
        try:
            yield from _read_text(path, stream, kind, opts, raw.tell, progress, skip)
        except (EOFError, OSError, ValueError) as exc:  # a cut or damaged compressed file
            if isinstance(exc, InputError):
                raise
            what = f"{path}: cannot be read to its end ({type(exc).__name__}: {exc})"
            if skip is None:
                raise InputError(what) from exc
            skip(f"{what}; the rest of the file is left out")


class _Lines:
    """The lines of a binary stream as text, each decoded on its own (so a line that is
    not UTF-8 is that line's fault alone), with its number and first byte."""

    def __init__(self, path: str, stream: Any) -> None:
        self.path, self.stream = path, stream

    def __iter__(self) -> Iterator[tuple[int, int, str | InputError]]:
        at = 0
        for lineno, raw in enumerate(self.stream, 1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                yield (
                    lineno,
                    at,
                    InputError(
                        f"{self.path}, line {lineno}: not UTF-8 text (byte {at + exc.start:,}: "
                        f"{exc.reason})"
                    ),
                )
            else:
                yield lineno, at, line[:-2] + "\n" if line.endswith("\r\n") else line
            at += len(raw)


def _read_text(
    path: str,
    stream: Any,
    kind: str,
    opts: SourceOptions,
    tell: Callable[[], int],
    progress: Progress | None,
    skip: Skip | None = None,
) -> Iterator[str]:
    """The documents of one opened (binary) text source (``tell``: bytes of the file
    read)."""

    def bad(err: InputError) -> None:
        if skip is None:
            raise err
        skip(str(err))

    if kind == ".jsonl":
        for lineno, _, line in _Lines(path, stream):
            if progress is not None:
                progress(tell())
            if isinstance(line, InputError):
                bad(line)
                continue
            if not line.strip():
                continue
            try:
                text = _json_text(path, lineno, line, opts.text_field)
            except InputError as exc:
                bad(exc)
                continue
            yield text
    elif opts.txt_split == "file":
        data = stream.read()
        try:
            yield data.decode("utf-8")
        except UnicodeDecodeError as exc:
            bad(InputError(f"{path}: not UTF-8 text (byte {exc.start:,}: {exc.reason})"))
    elif opts.txt_split == "line":
        for _, _, line in _Lines(path, stream):
            if progress is not None:
                progress(tell())
            if isinstance(line, InputError):
                bad(line)
            elif line.strip():
                yield line.rstrip("\n")
    elif opts.txt_split == "blank":
        para: list[str] = []
        broken: InputError | None = None  # a line of this paragraph is not text
        for _, _, line in _Lines(path, stream):
            if progress is not None:
                progress(tell())
            if isinstance(line, InputError):
                broken = broken or line
            elif line.strip():
                para.append(line)
            elif para or broken:
                if broken:
                    bad(InputError(f"{broken}; its paragraph is left out"))
                else:
                    yield "".join(para)
                para, broken = [], None
        if broken:
            bad(InputError(f"{broken}; its paragraph is left out"))
        elif para:
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
        batches = pf.iter_batches(columns=[opts.text_column], batch_size=1024)
        while True:
            try:
                batch = next(batches, None)
            except (OSError, ValueError) as exc:  # a damaged row group
                what = f"{path}: rows from {done} on cannot be read ({exc})"
                if skip is None:
                    raise InputError(what) from exc
                skip(f"{what}; the rest of the file is left out")
                return
            if batch is None:
                break
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
