"""The token dataset manifest and its block index (pure: no I/O).

A dataset is a directory (any fsspec URL) holding::

    manifest.json                 this module's Manifest, written last
    index-<id>.bin                the block index: one 32-byte record per block
    data/<id>-00000.bin ...       data files: blocks back to back
    dict-<id>.zstd                optional zstd dictionary
    tokenizer.json                optional copy of the tokenizer

Every block holds exactly ``block_tokens`` tokens (the last one may hold fewer),
so the block of a token is arithmetic and the index only stores where each
block lives and its checksum. A block record is two zstd frames back to back:
the tokens, then the document starts inside the block (uint32 offsets). One
range request fetches both.
"""

from __future__ import annotations

import json
import re
import urllib.parse
from dataclasses import asdict, dataclass, field, replace
from typing import Any, ClassVar, TypeVar

import numpy as np
import xxhash

from stoker.errors import ManifestError, UnsupportedFormatError

FORMAT = "stoker-tokens"
FORMAT_VERSION = 1
MANIFEST_NAME = "manifest.json"

#: One record per block, little-endian.
INDEX_DTYPE = np.dtype(
    [
        ("offset", "<u8"),  # byte offset of the block record in its data file
        ("token_bytes", "<u4"),  # length of the tokens frame
        ("bounds_bytes", "<u4"),  # length of the document-starts frame
        ("xxh64", "<u8"),  # xxh64 of both frames
        ("doc_starts", "<u4"),  # number of document starts in the block
        ("lead", "<u4"),  # the block's first token (see encode_lead); 0: not recorded
    ]
)
#: In an index entry's ``lead``: a document starts at the block's first token.
LEAD_DOC_START = 1 << 31


def encode_lead(token: int, doc_start: bool) -> int:
    """An index entry's ``lead``: ``1 + token``, plus :data:`LEAD_DOC_START` when a
    document starts there; 0 (not recorded) for a token id too large to hold. A reader
    fills a sample that ends one token into a block from it, without the block."""
    if token + 1 >= LEAD_DOC_START:
        return 0
    return token + 1 + (LEAD_DOC_START if doc_start else 0)


def decode_leads(index: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every block's first token, whether a document starts there, and whether the
    entry records them (datasets written before the field existed hold 0)."""
    lead = index["lead"].astype(np.int64)
    return (lead & (LEAD_DOC_START - 1)) - 1, lead >= LEAD_DOC_START, lead != 0


_DTYPES = {"uint16": np.uint16, "uint32": np.uint32}
#: The largest block a reader will decode (256 MiB of uint16); the writer's default is 2^19.
MAX_BLOCK_TOKENS = 1 << 27
#: zstd's compression levels (negative levels are its fast modes).
_LEVELS = (-(1 << 17), 22)
#: What a path segment in a manifest may hold: what the writer produces, and nothing a
#: backend would decode or interpret (percent-escapes, query strings, drive letters).
SEGMENT = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]*")
#: Fields that change how a reader decodes the data, covered by ``decode_xxh64``.
_INFORMATIONAL = ("compressed_bytes", "created", "writer", "tokenizer", "decode_xxh64")


@dataclass(frozen=True)
class FileRef:
    """A file of the dataset, relative to its root."""

    path: str
    bytes: int
    xxh64: str | None = None


@dataclass(frozen=True)
class Compression:
    codec: str = "zstd"
    level: int = 3
    shuffle: bool = False
    dictionary: FileRef | None = None
    min_match: int | None = None  # informational: readers need nothing for it


@dataclass(frozen=True)
class TokenizerInfo:
    name: str
    sha256: str
    eos_token: str | None = None
    path: str | None = None  # copy inside the dataset, if any


class JSONManifest:
    """What the manifests of every kind share: JSON out and in (``from_dict`` checks
    the fields), and the seal a writer puts on (``decode_xxh64``, over the fields that
    say how the data is read: ``decode_digest``)."""

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1, sort_keys=True)  # type: ignore[call-overload]

    @classmethod
    def from_json(cls: type[_M], text: str | bytes, where: str = "manifest.json") -> _M:
        try:
            raw = json.loads(text)
        except (ValueError, UnicodeDecodeError) as exc:
            raise ManifestError(f"{where}: not valid JSON ({exc})") from exc
        if not isinstance(raw, dict):
            raise ManifestError(f"{where}: expected a JSON object, got {type(raw).__name__}")
        return cls.from_dict(raw, where)

    #: Fields that do not change how the data is read (outside ``decode_xxh64``).
    informational: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def from_dict(cls: type[_M], raw: dict[str, Any], where: str = "manifest.json") -> _M:
        raise NotImplementedError

    def read_fields(self) -> dict[str, Any]:
        """The fields that say how the data is found and read (all but
        :attr:`informational`)."""
        raw = asdict(self)  # type: ignore[call-overload]
        for name in self.informational:
            raw.pop(name, None)
        return dict(raw)

    def decode_digest(self) -> str:
        """xxh64 (hex) of :meth:`read_fields`: block checksums cover the data's bytes,
        this covers how they are read."""
        text = json.dumps(self.read_fields(), sort_keys=True, separators=(",", ":"))
        return f"{xxhash.xxh64_intdigest(text.encode()):016x}"

    @staticmethod
    def check_format(raw: dict[str, Any], where: str, fmt: str, version: int) -> None:
        """The manifest's ``format`` is ``fmt`` (else ManifestError) and its
        ``format_version`` is ``version`` (else UnsupportedFormatError)."""
        if raw.get("format") != fmt:
            raise ManifestError(
                f"{where}: field 'format' is {raw.get('format')!r}, expected {fmt!r}"
            )
        if raw.get("format_version") != version:
            raise UnsupportedFormatError(
                f"{where}: format_version {raw.get('format_version')!r} is not supported by "
                f"this stoker (it reads version {version}); upgrade stoker or rewrite the dataset"
            )

    def check_seal(self, where: str, covers: str) -> None:
        """Raise ManifestError when the manifest has a ``decode_xxh64`` that its fields
        (``covers`` names them) no longer match: it was edited after it was written."""
        seal = getattr(self, "decode_xxh64", None)
        if seal is not None and seal != self.decode_digest():
            raise ManifestError(
                f"{where}: the fields that say how to decode the data ({covers}) do not match "
                "the manifest's decode_xxh64: the manifest was edited after it was written; "
                "rewrite the dataset or restore the manifest"
            )

    def sealed(self: _M) -> _M:
        """This manifest with its ``decode_xxh64`` set (what a writer stores)."""
        return replace(self, decode_xxh64=self.decode_digest())  # type: ignore[type-var]


_M = TypeVar("_M", bound=JSONManifest)


@dataclass(frozen=True)
class Manifest(JSONManifest):
    """What a reader needs to know about a token dataset."""

    dataset_id: str
    dtype: str
    vocab_size: int
    eos_id: int | None
    num_tokens: int
    num_documents: int
    block_tokens: int
    blocks_per_file: int
    files: tuple[FileRef, ...]
    index: FileRef
    compression: Compression = field(default_factory=Compression)
    tokenizer: TokenizerInfo | None = None
    compressed_bytes: int = 0
    created: str = ""
    writer: str = ""
    format: str = FORMAT
    format_version: int = FORMAT_VERSION
    #: xxh64 of every field that changes decoding (see :meth:`decode_digest`); None in
    #: datasets written before it existed.
    decode_xxh64: str | None = None

    # -- geometry -------------------------------------------------------
    @property
    def np_dtype(self) -> np.dtype:
        return np.dtype(_DTYPES[self.dtype])

    @property
    def num_blocks(self) -> int:
        return -(-self.num_tokens // self.block_tokens)

    @property
    def raw_bytes(self) -> int:
        return self.num_tokens * self.np_dtype.itemsize

    def block_len(self, block: int) -> int:
        """Number of tokens in ``block``."""
        if not 0 <= block < self.num_blocks:
            raise IndexError(f"block {block} out of range [0, {self.num_blocks})")
        return min(self.block_tokens, self.num_tokens - block * self.block_tokens)

    def block_file(self, block: int) -> FileRef:
        return self.files[block // self.blocks_per_file]

    def blocks_for(self, start: int, stop: int) -> range:
        """Blocks that hold tokens ``[start, stop)``."""
        return range(start // self.block_tokens, -(-stop // self.block_tokens))

    informational = _INFORMATIONAL

    def read_fields(self) -> dict[str, Any]:
        """Geometry, dtype, vocabulary, files, index, codec, byte shuffle and dictionary
        (not the tokenizer, sizes, dates, writer, compression level)."""
        raw = super().read_fields()
        comp = raw["compression"]
        raw["compression"] = {"codec": comp["codec"], "shuffle": comp["shuffle"],
                              "dictionary": comp["dictionary"]}  # fmt: skip
        return raw

    @classmethod
    def from_dict(cls, raw: dict[str, Any], where: str = "manifest.json") -> Manifest:
        fmt = raw.get("format")
        if fmt == "stoker-records":
            raise ManifestError(
                f"{where}: a records dataset (format 'stoker-records'), not a token dataset: "
                "read it with stoker.RecordSource"
            )
        cls.check_format(raw, where, FORMAT, FORMAT_VERSION)
        get = Fields(raw, where)
        dtype = get.text("dtype")
        if dtype not in _DTYPES:
            raise ManifestError(
                f"{where}: field 'dtype' is {dtype!r}, expected one of {sorted(_DTYPES)}"
            )
        comp = get.obj("compression")
        cget = Fields(comp, f"{where}: compression")
        if cget.text("codec") != "zstd":
            raise ManifestError(
                f"{where}: compression codec {comp.get('codec')!r} is not supported"
            )
        dictionary = comp.get("dictionary")
        tok = raw.get("tokenizer")
        vocab_size = get.integer("vocab_size", minimum=1, maximum=1 << 32)
        num_tokens = get.integer("num_tokens", minimum=1, maximum=1 << 62)
        manifest = cls(
            dataset_id=get.text("dataset_id", pattern=SEGMENT),
            dtype=dtype,
            vocab_size=vocab_size,
            eos_id=get.opt_int("eos_id", minimum=0, maximum=vocab_size - 1),
            num_tokens=num_tokens,
            num_documents=get.integer("num_documents", minimum=0, maximum=num_tokens),
            block_tokens=get.integer("block_tokens", minimum=1, maximum=MAX_BLOCK_TOKENS),
            blocks_per_file=get.integer("blocks_per_file", minimum=1, maximum=1 << 32),
            files=tuple(
                file_ref(f, f"{where}: files[{i}]") for i, f in enumerate(get.items("files"))
            ),
            index=file_ref(get.obj("index"), f"{where}: index"),
            compression=Compression(
                codec="zstd",
                level=cget.integer("level", minimum=_LEVELS[0], maximum=_LEVELS[1]),
                shuffle=cget.boolean("shuffle", default=False),
                dictionary=None
                if dictionary is None
                else file_ref(dictionary, f"{where}: compression.dictionary"),
                min_match=cget.opt_int("min_match", minimum=3, maximum=7),
            ),
            tokenizer=None if tok is None else _tokenizer(tok, where),
            compressed_bytes=get.integer("compressed_bytes", minimum=0, default=0),
            created=get.text("created", default=""),
            writer=get.text("writer", default=""),
            decode_xxh64=get.opt_hex("decode_xxh64"),
        )
        manifest.validate(where)
        manifest.check_seal(
            where,
            "dataset_id, dtype, vocab_size, eos_id, num_tokens, num_documents, block_tokens, "
            "blocks_per_file, files, index, compression codec, shuffle and dictionary",
        )
        return manifest

    def validate(self, where: str = "manifest.json") -> None:
        if self.vocab_size - 1 > np.iinfo(self.np_dtype).max:
            raise ManifestError(f"{where}: vocab_size {self.vocab_size} does not fit {self.dtype}")
        expected_files = -(-self.num_blocks // self.blocks_per_file)
        if len(self.files) != expected_files:
            raise ManifestError(
                f"{where}: {len(self.files)} data files listed, but {self.num_blocks} blocks "
                f"of {self.blocks_per_file} per file need {expected_files}"
            )
        if self.index.bytes != self.num_blocks * INDEX_DTYPE.itemsize:
            raise ManifestError(
                f"{where}: index {self.index.path} has {self.index.bytes} bytes, "
                f"expected {self.num_blocks * INDEX_DTYPE.itemsize} for {self.num_blocks} blocks"
            )


def safe_relpath(path: str, where: str) -> str:
    """``path`` if it names a file inside the dataset directory on every backend.

    A manifest's paths are what the writer produces (``data/<id>-00000.bin``):
    relative, ``/``-separated segments of letters, digits, ``.``, ``_`` and ``-``, none
    of them ``.`` or ``..``. Anything else is refused rather than normalised, because
    each backend decodes differently: an HTTP origin turns ``%2e%2e`` into ``..``, a
    URL treats ``?`` and ``#`` as the end of the path, Windows and fsspec read ``c:``
    as a drive or protocol.
    """
    if not isinstance(path, str) or not path:
        raise ManifestError(f"{where}: file path {path!r} is not a non-empty string")
    decoded = urllib.parse.unquote(path)
    segments = path.split("/")
    if (
        decoded != path
        or len(path) > 1024
        or not all(SEGMENT.fullmatch(seg) for seg in segments)
        or any(seg in (".", "..") for seg in decoded.split("/"))
    ):
        raise ManifestError(
            f"{where}: file path {path!r} is refused: it could point outside the dataset on "
            "some backend. Manifest paths are relative, made of '/'-separated names of "
            "letters, digits, '.', '_' and '-' (no '..', no percent-escapes)"
        )
    return path


def file_ref(raw: Any, where: str) -> FileRef:
    if not isinstance(raw, dict):
        raise ManifestError(f"{where}: a file entry is {type(raw).__name__}, expected an object")
    get = Fields(raw, where)
    return FileRef(
        path=safe_relpath(get.text("path"), where),
        bytes=get.integer("bytes", minimum=0, maximum=1 << 62),
        xxh64=get.opt_hex("xxh64"),
    )


def _tokenizer(raw: Any, where: str) -> TokenizerInfo:
    if not isinstance(raw, dict):
        raise ManifestError(f"{where}: field 'tokenizer' must be an object or null")
    get = Fields(raw, f"{where}: tokenizer")
    path = get.opt_text("path")
    return TokenizerInfo(
        name=get.text("name"),
        sha256=get.text("sha256"),
        eos_token=get.opt_text("eos_token"),
        path=None if path is None else safe_relpath(path, f"{where}: tokenizer"),
    )


_MISSING = object()
_HEX64 = re.compile(r"[0-9a-f]{16}")


class Fields:
    """Typed access to a JSON object, with errors that name the field."""

    def __init__(self, raw: dict[str, Any], where: str) -> None:
        self.raw, self.where = raw, where

    def _get(self, name: str, default: Any = _MISSING) -> Any:
        if name not in self.raw:
            if default is not _MISSING:
                return default
            raise ManifestError(f"{self.where}: required field {name!r} is missing")
        return self.raw[name]

    def text(
        self, name: str, default: Any = _MISSING, pattern: re.Pattern[str] | None = None
    ) -> str:
        value = self._get(name, default)
        if not isinstance(value, str):
            raise ManifestError(f"{self.where}: field {name!r} must be a string, got {value!r}")
        if pattern is not None and not pattern.fullmatch(value):
            raise ManifestError(
                f"{self.where}: field {name!r} is {value!r}, which is not of the form "
                f"{pattern.pattern}"
            )
        return value

    def opt_text(self, name: str) -> str | None:
        return None if self.raw.get(name) is None else self.text(name)

    def opt_hex(self, name: str) -> str | None:
        """An optional xxh64 checksum: 16 lowercase hex digits."""
        return None if self.raw.get(name) is None else self.text(name, pattern=_HEX64)

    def integer(
        self,
        name: str,
        minimum: int | None = None,
        maximum: int | None = None,
        default: Any = _MISSING,
    ) -> int:
        value = self._get(name, default)
        if isinstance(value, bool) or not isinstance(value, int):
            raise ManifestError(f"{self.where}: field {name!r} must be an integer, got {value!r}")
        if minimum is not None and value < minimum:
            raise ManifestError(f"{self.where}: field {name!r} is {value}, must be >= {minimum}")
        if maximum is not None and value > maximum:
            raise ManifestError(f"{self.where}: field {name!r} is {value}, must be <= {maximum}")
        return value

    def opt_int(
        self, name: str, minimum: int | None = None, maximum: int | None = None
    ) -> int | None:
        return None if self.raw.get(name) is None else self.integer(name, minimum, maximum)

    def boolean(self, name: str, default: Any = _MISSING) -> bool:
        value = self._get(name, default)
        if not isinstance(value, bool):
            raise ManifestError(
                f"{self.where}: field {name!r} must be true or false (a JSON boolean), "
                f"got {value!r}"
            )
        return value

    def obj(self, name: str) -> dict[str, Any]:
        value = self._get(name)
        if not isinstance(value, dict):
            raise ManifestError(f"{self.where}: field {name!r} must be an object")
        return value

    def items(self, name: str) -> list[Any]:
        value = self._get(name)
        if not isinstance(value, list):
            raise ManifestError(f"{self.where}: field {name!r} must be a list")
        return value


def parse_index(data: bytes, manifest: Manifest, where: str) -> np.ndarray:
    """Decode the block index and check every entry against the manifest: each block
    record lies inside its data file, holds a tokens frame, and has no more document
    starts than tokens (the first tokens recorded are checked where they are read:
    :meth:`stoker.TokenSource.leads`, and against the data by every decode)."""
    m = manifest
    if len(data) != m.num_blocks * INDEX_DTYPE.itemsize:
        raise ManifestError(
            f"{where}: {len(data)} bytes, expected {m.num_blocks * INDEX_DTYPE.itemsize}"
        )
    index = np.frombuffer(data, dtype=INDEX_DTYPE)
    if not len(index):
        return index
    blocks = np.arange(m.num_blocks)
    sizes = np.array([f.bytes for f in m.files], dtype=np.uint64)[blocks // m.blocks_per_file]
    lens = np.minimum(m.block_tokens, m.num_tokens - blocks * m.block_tokens)
    end = index["offset"] + index["token_bytes"].astype(np.uint64) + index["bounds_bytes"]
    bad = (
        (index["token_bytes"] == 0)
        | (index["offset"] > sizes)
        | (end > sizes)
        | (index["doc_starts"] > lens)
        | ((index["doc_starts"] > 0) & (index["bounds_bytes"] == 0))
    )
    if bad.any():
        b = int(np.flatnonzero(bad)[0])
        e = index[b]
        ref = m.block_file(b)
        raise ManifestError(
            f"{where}: entry of block {b} does not fit the manifest: record "
            f"[{int(e['offset'])}, {int(end[b])}) in {ref.path} ({ref.bytes} bytes), tokens "
            f"frame {int(e['token_bytes'])} bytes, {int(e['doc_starts'])} document starts "
            f"for {int(lens[b])} tokens"
        )
    return index
