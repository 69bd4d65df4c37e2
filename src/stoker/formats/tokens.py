"""Opening a token dataset and reading its blocks.

:class:`TokenSource` is a dataset handle: manifest, block index, dictionary,
and ``block(i)`` (fetch through the cache, verify, decode). It holds no
connection until it reads, so it can be pickled into DataLoader workers.
"""

from __future__ import annotations

import warnings
from typing import Any, Protocol

import numpy as np
import zstandard

from stoker.errors import ChecksumError, ManifestError
from stoker.formats.cache import BlockCache, NullCache
from stoker.formats.codec import BlockCodec, checksum
from stoker.manifest import MANIFEST_NAME, Manifest, decode_leads, encode_lead, parse_index
from stoker.storage import RetryPolicy, Storage


class Metadata(Protocol):
    """Serves a dataset's manifest and block index (the coordinator's metadata service)."""

    def dataset(self) -> tuple[str, bytes, bytes]:
        """``(url, manifest_json, index)`` of the dataset it serves."""
        ...


class TokenSource:
    """A token dataset on storage.

    With ``metadata`` the manifest and the block index come from that service
    (the coordinator holds them in memory) instead of storage, so thousands of
    readers do not each read them; the index is still checked against the
    manifest's checksum. Blocks always come from storage.
    """

    def __init__(
        self,
        url: str,
        storage_options: dict[str, Any] | None = None,
        cache: BlockCache | None = None,
        storage: Storage | None = None,
        metadata: Metadata | None = None,
        retry: RetryPolicy | None = None,
    ) -> None:
        self.storage = storage or Storage(url, storage_options, retry=retry)
        self.url = self.storage.url
        self.cache: BlockCache = cache if cache is not None else NullCache()
        served: bytes | None = None
        if metadata is not None:
            served_url, manifest_json, served = metadata.dataset()
            if not manifest_json:
                raise ManifestError(f"{self.url}: the metadata service serves no dataset")
            if served_url.rstrip("/") != self.url.rstrip("/"):
                raise ManifestError(
                    f"{self.url}: the metadata service serves {served_url}, another dataset"
                )
            where = f"{self.storage.url_of(MANIFEST_NAME)} (from the metadata service)"
            self.manifest = Manifest.from_json(manifest_json, where)
        else:
            self.manifest = read_manifest(self.storage)
        m = self.manifest
        where = self.storage.url_of(m.index.path)
        try:
            index_bytes = served if served is not None else self.storage.read(m.index.path)
        except FileNotFoundError as exc:
            raise ManifestError(f"{where}: block index listed in the manifest is missing") from exc
        if m.index.xxh64 is not None and f"{checksum(index_bytes):016x}" != m.index.xxh64:
            raise ChecksumError(
                f"{where}: block index checksum mismatch", file=m.index.path, block=-1
            )
        self.index = parse_index(index_bytes, m, where)
        dictionary = None
        if m.compression.dictionary is not None:
            ref = m.compression.dictionary
            dictionary = self.storage.read(ref.path)
            if ref.xxh64 is not None and f"{checksum(dictionary):016x}" != ref.xxh64:
                raise ChecksumError(
                    f"{self.storage.url_of(ref.path)}: dictionary checksum mismatch",
                    file=ref.path,
                    block=-1,
                )
        self.codec = BlockCodec(m.np_dtype, m.compression.level, m.compression.shuffle, dictionary)

    def _key(self, block: int) -> str:
        return f"{self.manifest.dataset_id}/{block}"

    def record(self, block: int) -> bytes:
        """The verified record of ``block``: cache first, then storage; refetched once on a bad checksum."""
        m = self.manifest
        entry = self.index[block]
        ref = m.block_file(block)
        start = int(entry["offset"])
        stop = start + int(entry["token_bytes"]) + int(entry["bounds_bytes"])
        key = self._key(block)
        data = self.cache.get(key)
        if data is not None and checksum(data) == int(entry["xxh64"]):
            return data
        if data is not None:
            self.cache.discard(key)
        for attempt in range(2):
            data = self.storage.read_range(ref.path, start, stop)
            if checksum(data) == int(entry["xxh64"]):
                self.cache.put(key, data)
                return data
            if attempt == 0:
                warnings.warn(
                    f"{self.storage.url_of(ref.path)}: block {block} failed its checksum; refetching",
                    stacklevel=2,
                )
        raise ChecksumError(
            f"{self.storage.url_of(ref.path)}: block {block} (bytes [{start}, {stop})) fails its "
            "xxh64 checksum twice; the data file is corrupt or was changed after the manifest "
            "was written",
            file=ref.path,
            block=block,
        )

    def block(self, block: int) -> tuple[np.ndarray, np.ndarray]:
        """Tokens and document starts of ``block``."""
        return self.decode(block, self.record(block))

    def decode(
        self, block: int, record: bytes | memoryview, prefix: int | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """Tokens and document starts of ``block`` from its verified ``record``, checked
        against the manifest: every process that decodes a block (a reader, a loader
        worker, the node agent) goes through here.

        A record that passed its checksum but does not decode to what the manifest says
        (its length, the vocabulary, the number and range of document starts) means
        the manifest and the data disagree: a :class:`ManifestError` naming the file
        and the block, never tokens handed to training.

        With ``prefix``, only the block's first ``prefix`` tokens (and all its document
        starts) are decoded and checked: what a sample that ends in this block needs.
        """
        m = self.manifest
        entry = self.index[block]
        n = m.block_len(block)
        where = f"{self.storage.url_of(m.block_file(block).path)}: block {block}"
        try:
            if prefix is not None and prefix < n:
                tokens, starts = self.codec.decode_prefix(
                    record, int(entry["token_bytes"]), n, prefix, int(entry["doc_starts"])
                )
                n_check = prefix
            else:
                tokens, starts = self.codec.decode(
                    record, int(entry["token_bytes"]), n, int(entry["doc_starts"])
                )
                n_check = n
        except (ValueError, zstandard.ZstdError) as exc:
            raise ManifestError(
                f"{where} does not decode as the manifest describes it ({exc}); the manifest "
                "does not belong to this data"
            ) from exc
        if len(starts) != int(entry["doc_starts"]):
            raise ManifestError(
                f"{where} holds {len(starts)} document starts, its index entry says "
                f"{int(entry['doc_starts'])}"
            )
        if len(starts) and (
            int(starts[-1]) >= n or (len(starts) > 1 and bool((np.diff(starts) <= 0).any()))
        ):
            raise ManifestError(
                f"{where}: its document starts are not increasing offsets inside its {n} tokens"
            )
        top = int(tokens.max()) if n_check else 0
        if top >= m.vocab_size:
            raise ManifestError(
                f"{where} holds token id {top}, outside the manifest's vocabulary "
                f"[0, {m.vocab_size}): the manifest's dtype, vocab_size or compression settings "
                "do not match the data"
            )
        lead = int(entry["lead"])
        if lead and n_check:
            first, doc = int(tokens[0]), bool(len(starts)) and int(starts[0]) == 0
            if lead != encode_lead(first, doc):
                raise ManifestError(
                    f"{where} begins with token {first} (a document start: {doc}); its index "
                    f"entry records {lead:#x}: the index does not belong to this data"
                )
        return tokens, starts

    def leads(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Every block's first token and whether a document starts there, as its index
        entry records them, and whether it does (:func:`stoker.manifest.decode_leads`):
        what a sample that ends one token into a block needs of it. A recorded token
        outside the vocabulary is a :class:`ManifestError` naming the block."""
        first, doc, recorded = decode_leads(self.index)
        # (a document start where the entry counts none, or bit 31 alone: never written)
        bad = recorded & (
            (first < 0)
            | (first >= self.manifest.vocab_size)
            | (doc & (self.index["doc_starts"] == 0))
        )
        if bad.any():
            b = int(np.flatnonzero(bad)[0])
            m = self.manifest
            raise ManifestError(
                f"{self.storage.url_of(m.index.path)}: the entry of block {b} records a first "
                f"token {int(first[b])} (a document start: {bool(doc[b])}) that cannot be: "
                f"outside the manifest's vocabulary [0, {m.vocab_size}), or a start in a block "
                f"of {int(self.index[b]['doc_starts'])} document starts ({m.block_file(b).path})"
            )
        return first, doc, recorded

    def tokens(self, start: int, stop: int) -> np.ndarray:
        """Tokens ``[start, stop)`` (a convenience; readers use blocks directly)."""
        m = self.manifest
        parts = []
        for b in m.blocks_for(start, stop):
            toks, _ = self.block(b)
            base = b * m.block_tokens
            parts.append(toks[max(start - base, 0) : min(stop - base, len(toks))])
        return np.concatenate(parts) if parts else np.zeros(0, m.np_dtype)


def read_manifest(storage: Storage) -> Manifest:
    from stoker.formats.kinds import manifest_bytes

    return Manifest.from_json(*manifest_bytes(storage))
