"""Writing token datasets.

Documents (integer arrays) are appended to one token stream, an EOS id after
each when asked, and the stream is cut into blocks of ``block_tokens``. Blocks
are compressed on a thread pool and written in order into data files named
with a fresh dataset id. The manifest is written last and atomically: until it
exists nothing reads as a dataset, and an interrupted write leaves only files
that no manifest names.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import os
import uuid
from collections import deque
from collections.abc import Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from stoker.errors import InputError
from stoker.formats.codec import BlockCodec, checksum, train_dictionary
from stoker.formats.writing import DatasetWriter
from stoker.manifest import (
    INDEX_DTYPE,
    MANIFEST_NAME,
    MAX_BLOCK_TOKENS,
    Compression,
    FileRef,
    Manifest,
    TokenizerInfo,
    encode_lead,
)
from stoker.storage import Storage

#: Defaults chosen by benchmarks/compression.py (see docs/benchmarks.md).
DEFAULT_BLOCK_TOKENS = 1 << 19  # 1 MiB of uint16
DEFAULT_LEVEL = 9
DEFAULT_MIN_MATCH = 4  # two uint16 tokens
DEFAULT_SHUFFLE = False
DICT_SAMPLE_BLOCKS = 32
FILE_TARGET_BYTES = 256 << 20


@dataclass(frozen=True)
class WriteOptions:
    """How blocks are laid out and compressed."""

    block_tokens: int = DEFAULT_BLOCK_TOKENS
    level: int = DEFAULT_LEVEL
    shuffle: bool = DEFAULT_SHUFFLE
    dictionary: bool = False
    dictionary_size: int = 112 * 1024
    min_match: int | None = DEFAULT_MIN_MATCH
    blocks_per_file: int | None = None
    threads: int = max(1, min(8, os.cpu_count() or 1))


def dtype_for(vocab_size: int) -> str:
    if vocab_size <= 1 << 16:
        return "uint16"
    if vocab_size <= 1 << 32:
        return "uint32"
    raise InputError(f"vocab_size {vocab_size} does not fit uint32")


def tokenizer_info(path: str, eos_token: str | None) -> tuple[TokenizerInfo, bytes]:
    with open(path, "rb") as fh:
        data = fh.read()
    return (
        TokenizerInfo(
            name=os.path.basename(path),
            sha256=hashlib.sha256(data).hexdigest(),
            eos_token=eos_token,
        ),
        data,
    )


class TokenWriter(DatasetWriter):
    """Streams documents into a new token dataset at ``url``."""

    def __init__(
        self,
        url: str,
        *,
        vocab_size: int,
        eos_id: int | None = None,
        append_eos: bool = True,
        options: WriteOptions | None = None,
        tokenizer: TokenizerInfo | None = None,
        tokenizer_json: bytes | None = None,
        storage_options: dict[str, Any] | None = None,
        overwrite: bool = False,
    ) -> None:
        self.opts = opts = options or WriteOptions()
        if not 1 <= opts.block_tokens <= MAX_BLOCK_TOKENS:
            raise InputError(
                f"block_tokens must be in [1, {MAX_BLOCK_TOKENS}], got {opts.block_tokens}"
            )
        if eos_id is not None and not 0 <= eos_id < vocab_size:
            raise InputError(f"eos_id {eos_id} is outside the vocabulary [0, {vocab_size})")
        self.storage = Storage(url, storage_options)
        self.old: Manifest | None = None
        if self.storage.exists(MANIFEST_NAME):
            if not overwrite:
                raise InputError(
                    f"{self.storage.url_of(MANIFEST_NAME)} exists; pass overwrite=True "
                    "(--overwrite) to replace the dataset"
                )
            from stoker.formats.tokens import read_manifest

            try:
                self.old = read_manifest(self.storage)
            except Exception:
                self.old = None
        self.vocab_size = vocab_size
        self.dtype = np.dtype(dtype_for(vocab_size))
        self.eos_id = eos_id if append_eos else None
        self.eos_keep = eos_id
        self.tokenizer = tokenizer
        self.tokenizer_json = tokenizer_json
        self.id = uuid.uuid4().hex[:16]
        raw_block = opts.block_tokens * self.dtype.itemsize
        self.blocks_per_file = opts.blocks_per_file or max(1, FILE_TARGET_BYTES // raw_block)
        self._pending: list[np.ndarray] = []
        self._pending_len = 0
        self._pending_starts: list[int] = []
        self._held: list[tuple[np.ndarray, np.ndarray]] = []  # blocks kept to train a dictionary
        self._codec: BlockCodec | None = None
        self._dictionary: bytes | None = None
        self._pool = ThreadPoolExecutor(opts.threads, thread_name_prefix="stoker-write")
        self._inflight: deque[Future[tuple[bytes, bytes, int, int]]] = deque()
        self._index: list[tuple[int, int, int, int, int, int]] = []
        self._start_files()
        self.num_tokens = 0
        self.num_documents = 0  # documents written (empty ones without EOS are skipped)
        self.documents_seen = 0  # documents given to add(), numbering errors
        self.compressed_bytes = 0
        self.manifest: Manifest | None = None  # set by close()

    # -- input ---------------------------------------------------------------
    def add(self, document: ArrayLike) -> None:
        """Append one document (token ids)."""
        doc = np.asarray(document)
        number = self.documents_seen
        self.documents_seen += 1
        if doc.ndim != 1:
            raise InputError(f"document {number} is not 1-D (shape {doc.shape})")
        if doc.size and not np.issubdtype(doc.dtype, np.integer):
            raise InputError(f"document {number} has dtype {doc.dtype}, expected integers")
        if doc.size and (doc.min() < 0 or doc.max() >= self.vocab_size):
            bad = int(doc.max() if doc.max() >= self.vocab_size else doc.min())
            raise InputError(
                f"document {number} holds token id {bad} outside [0, {self.vocab_size})"
            )
        if self.eos_id is not None:
            doc = np.append(doc, self.eos_id)
        if doc.size == 0:
            return
        self._pending_starts.append(self.num_tokens + self._pending_len)
        self._pending.append(doc.astype(self.dtype, copy=False))
        self._pending_len += doc.size
        self.num_documents += 1
        while self._pending_len >= self.opts.block_tokens:
            self._cut_block(self.opts.block_tokens)

    def extend(self, documents: Iterable[ArrayLike]) -> None:
        for doc in documents:
            self.add(doc)

    # -- blocks --------------------------------------------------------------
    def _cut_block(self, n: int) -> None:
        flat = np.concatenate(self._pending) if len(self._pending) > 1 else self._pending[0]
        block, rest = flat[:n], flat[n:]
        self._pending = [rest] if rest.size else []
        self._pending_len = int(rest.size)
        base = self.num_tokens
        starts = np.asarray(
            [s - base for s in self._pending_starts if s < base + n], dtype=np.uint32
        )
        self._pending_starts = [s for s in self._pending_starts if s >= base + n]
        self.num_tokens += n
        self._submit(np.ascontiguousarray(block), starts)

    def _submit(self, tokens: np.ndarray, starts: np.ndarray) -> None:
        if self._codec is None:
            if self.opts.dictionary and len(self._held) < DICT_SAMPLE_BLOCKS:
                self._held.append((tokens, starts))
                return
            self._start_codec()
        assert self._codec is not None
        self._inflight.append(self._pool.submit(self._encode, tokens, starts))
        while len(self._inflight) > 2 * self.opts.threads:
            self._write(self._inflight.popleft().result())

    def _encode(self, tokens: np.ndarray, starts: np.ndarray) -> tuple[bytes, bytes, int, int]:
        assert self._codec is not None
        tok, bounds = self._codec.encode(tokens, starts)
        lead = encode_lead(int(tokens[0]), bool(len(starts)) and int(starts[0]) == 0)
        return tok, bounds, len(starts), lead

    def _start_codec(self) -> None:
        o = self.opts
        if o.dictionary and self._held:
            samples = [t.tobytes() for t, _ in self._held]
            try:
                self._dictionary = train_dictionary(samples, o.dictionary_size)
            except Exception:  # too little data to train on: go without
                self._dictionary = None
        self._codec = BlockCodec(
            self.dtype,
            o.level,
            o.shuffle,
            self._dictionary,
            min_match=o.min_match,
            block_bytes=o.block_tokens * self.dtype.itemsize,
        )
        held, self._held = self._held, []
        for tokens, starts in held:
            self._submit(tokens, starts)

    def _write(self, frames: tuple[bytes, bytes, int, int]) -> None:
        tok, bounds, n_starts, lead = frames
        if self._file is None or len(self._index) % self.blocks_per_file == 0:
            self._roll_file()
        self._index.append(
            (self._file_pos, len(tok), len(bounds), checksum(tok, bounds), n_starts, lead)
        )
        self._file.write(tok)
        self._file.write(bounds)
        self._file_pos += len(tok) + len(bounds)
        self.compressed_bytes += len(tok) + len(bounds)

    # -- finish --------------------------------------------------------------
    def close(self) -> Manifest:
        """Flush, write index and manifest; returns the manifest."""
        if self._closed:
            raise InputError("writer already closed")
        try:
            if self._pending_len:
                self._cut_block(self._pending_len)
            if self._codec is None:
                self._start_codec()
            while self._inflight:
                self._write(self._inflight.popleft().result())
            self._finish_file()
            if self.num_tokens == 0:
                raise InputError(f"no tokens to write to {self.storage.url}: every input was empty")
            self.manifest = self._commit()
            return self.manifest
        except BaseException:
            self.abort()
            raise
        finally:
            self._closed = True
            self._pool.shutdown(wait=True)

    def _commit(self) -> Manifest:
        st = self.storage
        index = np.zeros(len(self._index), dtype=INDEX_DTYPE)
        for i, entry in enumerate(self._index):
            index[i] = entry
        index_bytes = index.tobytes()
        index_path = f"index-{self.id}.bin"
        self._written.append(index_path)
        st.write_atomic(index_path, index_bytes)
        dict_ref = None
        if self._dictionary is not None:
            dict_path = f"dict-{self.id}.zstd"
            self._written.append(dict_path)
            st.write_atomic(dict_path, self._dictionary)
            dict_ref = FileRef(
                dict_path, len(self._dictionary), f"{checksum(self._dictionary):016x}"
            )
        tok = self.tokenizer
        if tok is not None and self.tokenizer_json is not None:
            tok_path = f"tokenizer-{self.id}.json"
            self._written.append(tok_path)
            st.write_atomic(tok_path, self.tokenizer_json)
            tok = TokenizerInfo(tok.name, tok.sha256, tok.eos_token, tok_path)
        from stoker import __version__

        manifest = Manifest(
            dataset_id=self.id,
            dtype=str(self.dtype),
            vocab_size=self.vocab_size,
            eos_id=self.eos_keep,
            num_tokens=self.num_tokens,
            num_documents=self.num_documents,
            block_tokens=self.opts.block_tokens,
            blocks_per_file=self.blocks_per_file,
            files=tuple(self._files),
            index=FileRef(index_path, len(index_bytes), f"{checksum(index_bytes):016x}"),
            compression=Compression(
                "zstd", self.opts.level, self.opts.shuffle, dict_ref, self.opts.min_match
            ),
            tokenizer=tok,
            compressed_bytes=self.compressed_bytes,
            created=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            writer=f"stoker {__version__}",
        )
        manifest = manifest.sealed()
        self._publish(manifest, {f.path for f in manifest.files} | {manifest.index.path},
                      self._old_paths())  # fmt: skip
        return manifest

    def _old_paths(self) -> list[str]:
        """The files of the dataset this write replaces."""
        old = self.old
        if old is None:
            return []
        paths = [f.path for f in old.files] + [old.index.path]
        if old.compression.dictionary is not None:
            paths.append(old.compression.dictionary.path)
        if old.tokenizer is not None and old.tokenizer.path is not None:
            paths.append(old.tokenizer.path)
        return paths

    def _stop(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        for fut in self._inflight:
            fut.cancel()
        self._inflight.clear()


def write_tokens(
    documents: Iterable[ArrayLike],
    url: str,
    *,
    vocab_size: int,
    eos_id: int | None = None,
    append_eos: bool = True,
    block_tokens: int = DEFAULT_BLOCK_TOKENS,
    level: int = DEFAULT_LEVEL,
    shuffle: bool = DEFAULT_SHUFFLE,
    dictionary: bool = False,
    min_match: int | None = DEFAULT_MIN_MATCH,
    storage_options: dict[str, Any] | None = None,
    overwrite: bool = False,
    tokenizer: TokenizerInfo | None = None,
    tokenizer_json: bytes | None = None,
) -> Manifest:
    """Write already-tokenized documents as a token dataset at ``url``.

    ``eos_id`` is appended to every document unless ``append_eos=False``. The
    dtype is uint16 when ``vocab_size <= 65536``, else uint32.
    """
    options = WriteOptions(
        block_tokens=block_tokens,
        level=level,
        shuffle=shuffle,
        dictionary=dictionary,
        min_match=min_match,
    )
    writer = TokenWriter(
        url,
        vocab_size=vocab_size,
        eos_id=eos_id,
        append_eos=append_eos,
        options=options,
        tokenizer=tokenizer,
        tokenizer_json=tokenizer_json,
        storage_options=storage_options,
        overwrite=overwrite,
    )
    with writer:
        writer.extend(documents)
    assert writer.manifest is not None
    return writer.manifest
