"""``build-tokens``: tokenize text sources in parallel and write a token dataset.

Needs ``stoker[build]`` (the ``tokenizers`` package). Progress is counted in
bytes of the source files (their sizes are known before any work), so a
progress bar has a total and an ETA.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from stoker.errors import ConfigError, InputError
from stoker.extras import require
from stoker.formats.token_writer import TokenWriter, WriteOptions, tokenizer_info
from stoker.ingest import SourceOptions, check_sources, iter_texts
from stoker.manifest import Manifest

EOS_CANDIDATES = ("<|endoftext|>", "</s>", "<eos>", "<|end_of_text|>", "[SEP]")
_BATCH_DOCS = 256


#: How to get a tokenizer file, for the errors that ask for one.
TOKENIZER_HELP = (
    "point --tokenizer at a Hugging Face tokenizers JSON file (the tokenizer.json "
    "published with most models on the Hugging Face Hub), or train one with the "
    "tokenizers package: Tokenizer(models.BPE()), tokenizer.train([...text files], "
    'trainers.BpeTrainer(vocab_size=32000, special_tokens=["<|endoftext|>"])), '
    'tokenizer.save("tokenizer.json") (README.md, "Quick start")'
)


def load_tokenizer(path: str) -> Any:
    """The ``tokenizers.Tokenizer`` in the JSON file at ``path``; InputError if there is none."""
    tokenizers = require("tokenizers", "build", "build-tokens", InputError)
    if os.path.isdir(path):
        inside = os.path.join(path, "tokenizer.json")
        hint = f"use {inside}" if os.path.isfile(inside) else TOKENIZER_HELP
        raise InputError(f"{path}: --tokenizer is a directory, not a tokenizer file; {hint}")
    if not os.path.exists(path):
        raise InputError(f"{path}: tokenizer file not found; {TOKENIZER_HELP}")
    try:
        return tokenizers.Tokenizer.from_file(path)
    except Exception as exc:
        raise InputError(
            f"{path}: tokenizer file does not load ({type(exc).__name__}: {exc})"
        ) from exc


def eos_of(tokenizer: Any, path: str, eos_token: str | None) -> tuple[str, int]:
    names = (eos_token,) if eos_token else EOS_CANDIDATES
    for name in names:
        tid = tokenizer.token_to_id(name)
        if tid is not None:
            return name, int(tid)
    raise InputError(
        f"{path}: no end-of-document token found (tried {', '.join(names)}); pass --eos-token"
    )


# -- worker processes -----------------------------------------------------------
_TOKENIZER: Any = None


def _init_worker(path: str) -> None:
    global _TOKENIZER
    _TOKENIZER = load_tokenizer(path)


def _encode(texts: list[str]) -> list[np.ndarray]:
    encs = _TOKENIZER.encode_batch(texts, add_special_tokens=False)
    return [np.asarray(e.ids, dtype=np.uint32) for e in encs]


@dataclass
class BuildStats:
    """Progress of a build. ``source_bytes`` of ``total_bytes`` (the sources' sizes as
    stored) are tokenized and written; ``text_bytes`` counts the UTF-8 text read."""

    documents: int = 0
    tokens: int = 0
    text_bytes: int = 0
    seconds: float = 0.0
    source_bytes: int = 0
    total_bytes: int = 0
    skipped: int = 0  # documents and files left out (``on_error="skip"``)
    skipped_reasons: list[str] = field(default_factory=list)  # the first SKIP_REASONS

    def skip(self, why: str) -> None:
        self.skipped += 1
        if len(self.skipped_reasons) < SKIP_REASONS:
            self.skipped_reasons.append(why)


#: How many of the reasons for left-out documents a build keeps (all are counted).
SKIP_REASONS = 20


def _batches(
    sources: list[tuple[str, int]],
    opts: SourceOptions,
    storage_options: dict[str, Any] | None,
    stats: BuildStats,
    ends: deque[int],
    skipping: bool = False,
) -> Iterator[list[str]]:
    """Batches of documents; before each, the source bytes read up to its end go in ``ends``
    (a pool may read batches ahead: the caller counts a batch's bytes when it is written)."""
    batch: list[str] = []
    before = 0  # bytes of the sources before the current one
    read = 0

    def progress(n: int) -> None:
        nonlocal read
        read = before + n

    skip = stats.skip if skipping else None
    for path, size in sources:
        for text in iter_texts(path, opts, storage_options, progress, skip):
            stats.text_bytes += len(text.encode("utf-8", "ignore"))
            batch.append(text)
            if len(batch) >= _BATCH_DOCS:
                ends.append(read)
                yield batch
                batch = []
        before += size
        read = before
    if batch:
        ends.append(read)
        yield batch


def build_tokens(
    sources: list[str],
    out: str,
    tokenizer_path: str,
    *,
    eos_token: str | None = None,
    source_options: SourceOptions | None = None,
    write_options: WriteOptions | None = None,
    workers: int | None = None,
    storage_options: dict[str, Any] | None = None,
    source_storage_options: dict[str, Any] | None = None,
    overwrite: bool = False,
    progress: Callable[[BuildStats], None] | None = None,
    on_error: str = "raise",
) -> tuple[Manifest, BuildStats]:
    """Tokenize ``sources`` (``.txt``, ``.jsonl``, ``.parquet``, any fsspec URL; or a local
    MosaicML Streaming directory, its ``str`` column ``source_options.text_column``) with the
    tokenizer file and write a token dataset at ``out``; its manifest and the build's
    counts.

    ``progress(stats)`` is called after each batch of documents is written. With
    ``on_error="skip"``, an unreadable document (a ``.jsonl`` line that is not the JSON
    object asked for, a value that is not text, text that is not UTF-8, an unreadable
    parquet file) or an empty file is left out and counted (``stats.skipped``, the first
    reasons in ``stats.skipped_reasons``) instead of ending the build with an
    :class:`~stoker.errors.InputError`; a missing file or an unknown input type still
    fails before any work.
    """
    if on_error not in ("raise", "skip"):
        raise ConfigError(f"on_error must be 'raise' or 'skip', got {on_error!r}")
    skipping = on_error == "skip"
    tokenizer = load_tokenizer(tokenizer_path)
    eos_name, eos_id = eos_of(tokenizer, tokenizer_path, eos_token)
    early: list[str] = []  # empty files, left out before the stats exist
    sized = check_sources(sources, source_storage_options, early.append if skipping else None)
    if not sized:
        raise InputError(f"no input left to build from: {'; '.join(early)}")
    info, tok_json = tokenizer_info(tokenizer_path, eos_name)
    writer = TokenWriter(
        out,
        vocab_size=tokenizer.get_vocab_size(with_added_tokens=True),
        eos_id=eos_id,
        options=write_options,
        tokenizer=info,
        tokenizer_json=tok_json,
        storage_options=storage_options,
        overwrite=overwrite,
    )
    stats = BuildStats(total_bytes=sum(size for _, size in sized))
    for why in early:
        stats.skip(why)
    start = time.perf_counter()
    workers = workers or max(1, mp.cpu_count())
    ends: deque[int] = deque()
    if progress is not None:
        progress(stats)  # the total, before any work
    batches = _batches(
        sized, source_options or SourceOptions(), source_storage_options, stats, ends, skipping
    )
    with writer:
        if workers == 1:
            _init_worker(tokenizer_path)
            results: Iterator[list[np.ndarray]] = map(_encode, batches)
            pool = None
        else:
            pool = mp.get_context("fork").Pool(workers, _init_worker, (tokenizer_path,))
            results = pool.imap(_encode, batches, chunksize=1)
        try:
            for docs in results:
                for doc in docs:
                    writer.add(doc)
                    stats.documents += 1
                    stats.tokens += len(doc) + 1
                stats.source_bytes = ends.popleft()
                stats.seconds = time.perf_counter() - start
                if progress is not None:
                    progress(stats)
        finally:
            if pool is not None:
                pool.terminate()
                pool.join()
    assert writer.manifest is not None
    manifest = writer.manifest
    stats.seconds = time.perf_counter() - start
    return manifest, stats
