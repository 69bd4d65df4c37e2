"""Converting datasets teams already have into stoker token datasets
(``stoker convert``, :func:`convert`).

Each format has a reader here that yields documents one at a time, so a conversion
streams: nothing is held but the document being written and the writer's current
block. Document boundaries are kept as the source has them; tokens are copied as
they are (an end-of-document token the source stored stays, none is added).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from stoker.errors import ConfigError, InputError
from stoker.formats.token_writer import TokenWriter, WriteOptions
from stoker.manifest import Manifest

FORMATS = ("megatron", "mds", "litdata", "hf", "parquet", "arrow", "flat")


class Documents(Protocol):
    """What a converter reads: documents in order, each with where it is."""

    @property
    def total_documents(self) -> int | None: ...

    def documents(self) -> Iterator[tuple[np.ndarray, str]]: ...

    def largest(self) -> int: ...


@dataclass
class ConvertStats:
    """Progress of a conversion: ``documents`` read (of ``total_documents``, when the
    source says); ``empty`` documents hold no token (nothing is stored for them);
    ``tokens`` and ``input_bytes`` (the tokens as the source stores them) read."""

    documents: int = 0
    total_documents: int | None = None
    tokens: int = 0
    empty: int = 0
    input_bytes: int = 0
    seconds: float = 0.0


def detect(src: str) -> str:
    """The format of ``src``, from what is there."""
    from stoker.converters import arrow, litdata, mds, megatron

    if megatron.is_megatron(src):
        return "megatron"
    if mds.is_mds(src):
        return "mds"
    if litdata.is_litdata(src):
        return "litdata"
    kind = arrow.kind_of(src)
    if kind is not None:
        return kind
    if src.endswith((".npy", ".bin")):
        return "flat"
    raise InputError(
        f"{src}: cannot tell its format (known: {', '.join(FORMATS)}); a Megatron dataset "
        "is named by its prefix, its .idx or its .bin, a Hugging Face dataset by the "
        "directory save_to_disk wrote; or pass --from"
    )


def open_documents(
    src: str,
    source_format: str | None = None,
    column: str | None = None,
    *,
    offsets: str | None = None,
    dtype: str | None = None,
    eos_id: int | None = None,
) -> Documents:
    """The documents of ``src`` in ``source_format`` (default: told from what is there)."""
    fmt = source_format or detect(src)
    if fmt not in FORMATS:
        raise ConfigError(f"unknown source format {fmt!r} (known: {', '.join(FORMATS)})")
    if fmt == "flat":
        from stoker.converters import flat

        return flat.open_flat(src, offsets, dtype, eos_id)
    if fmt == "mds":
        from stoker.converters import mds

        return mds.open_mds(src, column, dtype)
    if fmt == "litdata":
        from stoker.converters import litdata

        return litdata.open_litdata(src)
    if fmt == "megatron":
        from stoker.converters import megatron

        return megatron.open_index(src)
    from stoker.converters import arrow

    return arrow.open_source(src, fmt, column)


def convert(
    src: str,
    out: str,
    *,
    source_format: str | None = None,
    column: str | None = None,
    offsets: str | None = None,
    dtype: str | None = None,
    vocab_size: int | None = None,
    eos_id: int | None = None,
    write_options: WriteOptions | None = None,
    storage_options: dict[str, Any] | None = None,
    overwrite: bool = False,
    progress: Callable[[ConvertStats], None] | None = None,
) -> tuple[Manifest, ConvertStats]:
    """Convert the dataset at ``src`` into a token dataset at ``out``; its manifest and
    the conversion's counts.

    ``source_format``: ``megatron`` (a ``.bin`` + ``.idx``), ``mds`` (a MosaicML
    Streaming directory), ``litdata`` (a LitData optimized directory of
    ``TokensLoader`` chunks), ``hf`` (a Hugging Face
    dataset saved to disk), ``parquet``, ``arrow`` or ``flat`` (a ``.npy`` or raw
    ``.bin`` token array); by default told from what is there. ``column``: the token-id
    column of Arrow and parquet data (default: the first of ``input_ids``, ``tokens``,
    ``token_ids``, ``ids``). A flat array's documents come from ``offsets`` (a file of
    first tokens or boundaries) or, without one, are split after every ``eos_id``;
    ``dtype`` is a raw ``.bin``'s, or an MDS ``bytes`` column's. ``vocab_size``
    defaults to one more than the largest token id (a pass over the tokens first);
    ``eos_id`` is recorded in the manifest when given (the tokens are not changed).
    ``progress(stats)`` is called as documents are written.
    """
    source = open_documents(src, source_format, column, offsets=offsets, dtype=dtype, eos_id=eos_id)
    stats = ConvertStats(total_documents=source.total_documents)
    start = time.perf_counter()
    if vocab_size is None:
        vocab_size = source.largest() + 1
    writer = TokenWriter(
        out,
        vocab_size=vocab_size,
        eos_id=eos_id,
        append_eos=False,
        options=write_options,
        storage_options=storage_options,
        overwrite=overwrite,
    )
    last = start
    with writer:
        for doc, where in source.documents():
            try:
                writer.add(doc)
            except InputError as exc:
                raise InputError(f"{where}: {exc}") from exc
            stats.documents += 1
            stats.tokens += len(doc)
            stats.input_bytes += doc.nbytes
            stats.empty += not len(doc)
            now = time.perf_counter()
            if progress is not None and now - last >= 0.1:
                stats.seconds, last = now - start, now
                progress(stats)
    assert writer.manifest is not None
    stats.seconds = time.perf_counter() - start
    if progress is not None:
        progress(stats)
    return writer.manifest, stats
