"""Block codec: zstd, an optional trained dictionary, an optional byte-shuffle filter.

A block record is ``tokens frame + bounds frame``:

- tokens frame: zstd of the block's token ids (little-endian ``uint16`` or
  ``uint32``), byte-shuffled first when ``shuffle`` is on (all first bytes of
  every token, then all second bytes, ...);
- bounds frame: zstd of the ``uint32`` offsets, inside the block, of the
  documents that start in it.

The xxh64 of the whole record is kept in the block index.
"""

from __future__ import annotations

import threading

import numpy as np
import xxhash
import zstandard


def shuffle_bytes(tokens: np.ndarray) -> bytes:
    width = tokens.dtype.itemsize
    return tokens.view(np.uint8).reshape(-1, width).T.tobytes()


def unshuffle_bytes(data: bytes | memoryview, dtype: np.dtype) -> np.ndarray:
    width = dtype.itemsize
    planes = np.frombuffer(data, dtype=np.uint8).reshape(width, -1)
    return np.ascontiguousarray(planes.T).view(dtype).reshape(-1)


def checksum(*parts: bytes | memoryview) -> int:
    h = xxhash.xxh64()
    for part in parts:
        h.update(part)
    return h.intdigest()


class BlockCodec:
    """Encodes and decodes block records. Safe to share between threads."""

    def __init__(
        self,
        dtype: np.dtype,
        level: int = 3,
        shuffle: bool = False,
        dictionary: bytes | None = None,
        min_match: int | None = None,
        block_bytes: int = 0,
    ) -> None:
        self.dtype = np.dtype(dtype).newbyteorder("<")
        self.level = level
        self.shuffle = shuffle
        self.min_match = min_match
        self.block_bytes = block_bytes
        self._dict_bytes = dictionary
        self._dict = zstandard.ZstdCompressionDict(dictionary) if dictionary else None
        self._local = threading.local()

    def __getstate__(self) -> dict[str, object]:
        return {
            "dtype": self.dtype,
            "level": self.level,
            "shuffle": self.shuffle,
            "dictionary": self._dict_bytes,
            "min_match": self.min_match,
            "block_bytes": self.block_bytes,
        }

    def __setstate__(self, state: dict[str, object]) -> None:
        self.__init__(**state)

    def _cctx(self) -> zstandard.ZstdCompressor:
        c = getattr(self._local, "c", None)
        if c is None:
            if self.min_match is None:
                c = zstandard.ZstdCompressor(level=self.level, dict_data=self._dict)
            else:  # tokens are 2-4 bytes: matches of two tokens pay (benchmarks/compression.py)
                params = zstandard.ZstdCompressionParameters.from_level(
                    self.level, source_size=self.block_bytes, min_match=self.min_match
                )
                c = zstandard.ZstdCompressor(compression_params=params, dict_data=self._dict)
            self._local.c = c
        return c

    def _dctx(self) -> zstandard.ZstdDecompressor:
        d = getattr(self._local, "d", None)
        if d is None:
            d = self._local.d = zstandard.ZstdDecompressor(dict_data=self._dict)
        return d

    def encode(self, tokens: np.ndarray, doc_starts: np.ndarray) -> tuple[bytes, bytes]:
        """The two frames of a block."""
        tokens = np.ascontiguousarray(tokens, dtype=self.dtype)
        raw = shuffle_bytes(tokens) if self.shuffle else tokens.tobytes()
        cctx = self._cctx()
        bounds = np.ascontiguousarray(doc_starts, dtype="<u4").tobytes()
        return cctx.compress(raw), cctx.compress(bounds)

    def decode(
        self,
        record: bytes | memoryview,
        token_bytes: int,
        num_tokens: int,
        num_starts: int | None = None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """Tokens and document starts of a block record (read-only arrays).

        Neither frame may decompress to more than the block holds (``num_tokens``
        tokens, ``num_starts`` uint32 offsets): a frame whose header claims more is
        refused before anything is allocated, so a forged record cannot make a
        reader (or the node agent) allocate what its header claims. Raises
        ``ValueError`` for a record that does not fit.
        """
        view = memoryview(record)
        dctx = self._dctx()
        want = num_tokens * self.dtype.itemsize
        raw = _bounded(dctx, view[:token_bytes], want, "tokens")
        if len(raw) != want:
            raise ValueError(
                f"block holds {len(raw)} bytes of tokens, expected {num_tokens} tokens"
            )
        tokens = (
            unshuffle_bytes(raw, self.dtype) if self.shuffle else np.frombuffer(raw, self.dtype)
        )
        return tokens, _starts(dctx, view[token_bytes:], num_tokens, num_starts)

    def decode_prefix(
        self,
        record: bytes | memoryview,
        token_bytes: int,
        num_tokens: int,
        prefix: int,
        num_starts: int | None = None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """The first ``prefix`` tokens of a block record and all its document starts,
        decoding only as much of the tokens frame as they need (the whole of it with the
        byte-shuffle filter, whose planes span the block)."""
        view = memoryview(record)
        try:
            claimed = zstandard.frame_content_size(view[:token_bytes])
        except zstandard.ZstdError as exc:
            raise ValueError(f"tokens frame is not a zstd frame ({exc})") from exc
        # the whole is decoded where its length cannot be checked from the frame's header
        if self.shuffle or prefix >= num_tokens or claimed < 0:
            tokens, starts = self.decode(record, token_bytes, num_tokens, num_starts)
            return tokens[:prefix], starts
        if claimed != num_tokens * self.dtype.itemsize:  # as the full decode checks it
            raise ValueError(f"block holds {claimed} bytes of tokens, expected {num_tokens} tokens")
        want = prefix * self.dtype.itemsize
        with self._dctx().stream_reader(view[:token_bytes]) as reader:
            raw = reader.read(want)
            while len(raw) < want:  # read() may return less than asked: keep reading
                more = reader.read(want - len(raw))
                if not more:
                    break
                raw += more
        if len(raw) != want:
            raise ValueError(f"block holds fewer than the {prefix} tokens it should")
        starts = _starts(self._dctx(), view[token_bytes:], num_tokens, num_starts)
        return np.frombuffer(raw, self.dtype), starts


def _starts(
    dctx: zstandard.ZstdDecompressor, frame: memoryview, num_tokens: int, num_starts: int | None
) -> np.ndarray:
    """The document starts of a bounds frame (empty: none), no more than the block holds."""
    limit = 4 * (num_tokens if num_starts is None else num_starts)
    raw = _bounded(dctx, frame, limit, "document starts") if len(frame) else b""
    if len(raw) % 4:
        raise ValueError(f"document starts frame of {len(raw)} bytes is not uint32s")
    return np.frombuffer(raw, dtype="<u4")


def _bounded(dctx: zstandard.ZstdDecompressor, frame: memoryview, limit: int, what: str) -> bytes:
    """``frame`` decompressed, refusing to produce more than ``limit`` bytes."""
    try:
        claimed = zstandard.frame_content_size(frame)
    except zstandard.ZstdError as exc:
        raise ValueError(f"{what} frame is not a zstd frame ({exc})") from exc
    if claimed > limit:
        raise ValueError(f"{what} frame claims {claimed} bytes, more than the {limit} it may hold")
    # a frame that states no size is decompressed up to the limit at most
    return dctx.decompress(frame, max_output_size=max(limit, 1))


def train_dictionary(samples: list[bytes], size: int = 112 * 1024) -> bytes:
    """A zstd dictionary trained on raw block bytes."""
    return bytes(zstandard.train_dictionary(size, list(samples)).as_bytes())
