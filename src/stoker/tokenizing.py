"""``build-tokens``: tokenize text sources in parallel and write a token dataset."""

from __future__ import annotations

import multiprocessing as mp
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from stoker.errors import InputError
from stoker.formats.token_writer import TokenWriter, WriteOptions, tokenizer_info
from stoker.ingest import SourceOptions, check_sources, iter_texts
from stoker.manifest import Manifest

EOS_CANDIDATES = ("<|endoftext|>", "</s>", "<eos>", "<|end_of_text|>", "[SEP]")
_BATCH_DOCS = 256


def load_tokenizer(path: str) -> Any:
    from tokenizers import Tokenizer

    try:
        return Tokenizer.from_file(path)
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
    documents: int = 0
    tokens: int = 0
    text_bytes: int = 0
    seconds: float = 0.0


def _batches(
    paths: list[str], opts: SourceOptions, storage_options: dict | None, stats: BuildStats
) -> Iterator[list[str]]:
    batch: list[str] = []
    for path in paths:
        for text in iter_texts(path, opts, storage_options):
            stats.text_bytes += len(text.encode("utf-8", "ignore"))
            batch.append(text)
            if len(batch) >= _BATCH_DOCS:
                yield batch
                batch = []
    if batch:
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
) -> tuple[Manifest, BuildStats]:
    """Tokenize ``sources`` with the tokenizer file and write a dataset at ``out``."""
    tokenizer = load_tokenizer(tokenizer_path)
    eos_name, eos_id = eos_of(tokenizer, tokenizer_path, eos_token)
    check_sources(sources, source_storage_options)
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
    stats = BuildStats()
    start = time.perf_counter()
    workers = workers or max(1, mp.cpu_count())
    batches = _batches(sources, source_options or SourceOptions(), source_storage_options, stats)
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
