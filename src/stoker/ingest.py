"""Reading text documents from .txt, .jsonl and .parquet sources (any fsspec URL).

- ``.txt``: one document per file (``txt_split="file"``), per line
  (``"line"``) or per blank-line-separated paragraph (``"blank"``);
- ``.jsonl``: one JSON object per line, its text in ``text_field``;
- ``.parquet``: one document per row of ``text_column``.

Compressed variants (``.gz``, ``.zst``, ``.bz2``, ``.xz``) are read through
fsspec's compression inference. Errors name the file and line or row.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass

import fsspec
from fsspec.utils import infer_compression

from stoker.errors import InputError

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


def check_sources(paths: list[str], storage_options: dict | None = None) -> list[tuple[str, int]]:
    """Fail before any work if a source is missing, empty or of an unknown type."""
    if not paths:
        raise InputError("no input files given")
    out = []
    for path in paths:
        kind_of(path)
        fs, fpath = fsspec.core.url_to_fs(path, **(storage_options or {}))
        try:
            size = fs.size(fpath)
        except FileNotFoundError as exc:
            raise InputError(f"{path}: input file not found") from exc
        if not size:
            raise InputError(f"{path}: input file is empty")
        out.append((path, int(size)))
    return out


def iter_texts(
    path: str, opts: SourceOptions, storage_options: dict | None = None
) -> Iterator[str]:
    """Documents of one source, in order."""
    kind = kind_of(path)
    if kind == ".parquet":
        yield from _parquet(path, opts, storage_options)
        return
    with fsspec.open(
        path, "rt", encoding="utf-8", compression="infer", **(storage_options or {})
    ) as fh:
        if kind == ".jsonl":
            for lineno, line in enumerate(fh, 1):
                if not line.strip():
                    continue
                try:
                    obj = json.loads(line)
                except ValueError as exc:
                    raise InputError(f"{path}, line {lineno}: not valid JSON ({exc})") from exc
                if not isinstance(obj, dict) or opts.text_field not in obj:
                    raise InputError(f"{path}, line {lineno}: no field {opts.text_field!r}")
                text = obj[opts.text_field]
                if not isinstance(text, str):
                    raise InputError(
                        f"{path}, line {lineno}: field {opts.text_field!r} is not a string"
                    )
                yield text
        elif opts.txt_split == "file":
            yield fh.read()
        elif opts.txt_split == "line":
            for line in fh:
                if line.strip():
                    yield line.rstrip("\n")
        elif opts.txt_split == "blank":
            para: list[str] = []
            for line in fh:
                if line.strip():
                    para.append(line)
                elif para:
                    yield "".join(para)
                    para = []
            if para:
                yield "".join(para)
        else:
            raise InputError(f"txt_split must be file, line or blank, got {opts.txt_split!r}")


def _parquet(path: str, opts: SourceOptions, storage_options: dict | None) -> Iterator[str]:
    import pyarrow.parquet as pq

    with fsspec.open(path, "rb", **(storage_options or {})) as fh:
        try:
            pf = pq.ParquetFile(fh)
        except Exception as exc:
            raise InputError(f"{path}: not a readable parquet file ({exc})") from exc
        if opts.text_column not in pf.schema_arrow.names:
            raise InputError(
                f"{path}: no column {opts.text_column!r} (columns: {', '.join(pf.schema_arrow.names)})"
            )
        for batch in pf.iter_batches(columns=[opts.text_column], batch_size=1024):
            for text in batch.column(0).to_pylist():
                if text is not None:
                    yield text
