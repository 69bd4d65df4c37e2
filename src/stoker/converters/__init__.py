"""Converting datasets teams already have into stoker token datasets
(``stoker convert``, :func:`convert`).

Each format has a reader here that yields documents one at a time, so a conversion
streams: nothing is held but the document being written and the writer's current
block. Document boundaries are kept as the source has them; tokens are copied as
they are (an end-of-document token the source stored stays, none is added).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from stoker.errors import ConfigError, InputError
from stoker.formats.token_writer import TokenWriter, WriteOptions
from stoker.manifest import Manifest

FORMATS = ("megatron",)


@dataclass
class ConvertStats:
    """Progress of a conversion: ``documents`` of ``total_documents`` and ``tokens`` of
    ``total_tokens`` read; ``empty`` documents hold no token (nothing is stored for
    them); ``input_bytes`` of the source read."""

    documents: int = 0
    total_documents: int = 0
    tokens: int = 0
    total_tokens: int = 0
    empty: int = 0
    input_bytes: int = 0
    seconds: float = 0.0


def detect(src: str) -> str:
    """The format of ``src``, from what is there."""
    from stoker.converters import megatron

    if megatron.is_megatron(src):
        return "megatron"
    raise InputError(
        f"{src}: cannot tell its format (known: {', '.join(FORMATS)}); a Megatron dataset "
        "is named by its prefix, its .idx or its .bin; or pass --from"
    )


def convert(
    src: str,
    out: str,
    *,
    source_format: str | None = None,
    vocab_size: int | None = None,
    eos_id: int | None = None,
    write_options: WriteOptions | None = None,
    storage_options: dict[str, Any] | None = None,
    overwrite: bool = False,
    progress: Callable[[ConvertStats], None] | None = None,
) -> tuple[Manifest, ConvertStats]:
    """Convert the dataset at ``src`` into a token dataset at ``out``; its manifest and
    the conversion's counts.

    ``vocab_size`` defaults to one more than the largest token id (a pass over the
    tokens first); ``eos_id`` is recorded in the manifest when given (the tokens are
    not changed). ``progress(stats)`` is called as documents are written.
    """
    fmt = source_format or detect(src)
    if fmt not in FORMATS:
        raise ConfigError(f"unknown source format {fmt!r} (known: {', '.join(FORMATS)})")
    from stoker.converters import megatron

    index = megatron.open_index(src)
    stats = ConvertStats(total_documents=index.num_documents, total_tokens=index.num_tokens)
    start = time.perf_counter()
    if vocab_size is None:
        vocab_size = _largest(index.tokens, index.bin_path) + 1
    writer = TokenWriter(
        out,
        vocab_size=vocab_size,
        eos_id=eos_id,
        append_eos=False,
        options=write_options,
        storage_options=storage_options,
        overwrite=overwrite,
    )
    item = index.dtype.itemsize
    step = max(1, index.num_documents // 1000)
    with writer:
        for d, doc in enumerate(index.documents()):
            try:
                writer.add(doc)
            except InputError as exc:
                raise InputError(
                    f"{index.bin_path}: document {d} (tokens from byte "
                    f"{stats.tokens * item}): {exc}"
                ) from exc
            stats.documents += 1
            stats.tokens += len(doc)
            stats.empty += not len(doc)
            if progress is not None and (d % step == 0 or d + 1 == index.num_documents):
                stats.input_bytes = stats.tokens * item
                stats.seconds = time.perf_counter() - start
                progress(stats)
    assert writer.manifest is not None
    stats.input_bytes = stats.tokens * item
    stats.seconds = time.perf_counter() - start
    return writer.manifest, stats


def _largest(tokens: np.ndarray, where: str) -> int:
    """The largest token id (a pass in chunks); refuses a negative one."""
    top, chunk = 0, 1 << 24
    for lo in range(0, len(tokens), chunk):
        part = tokens[lo : lo + chunk]
        if len(part):
            if int(part.min()) < 0:
                at = lo + int(np.argmin(part))
                raise InputError(f"{where}: token {at} is {int(tokens[at])}, a negative id")
            top = max(top, int(part.max()))
    return top
