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
import posixpath
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

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
        ("reserved", "<u4"),
    ]
)

_DTYPES = {"uint16": np.uint16, "uint32": np.uint32}


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


@dataclass(frozen=True)
class Manifest:
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

    # -- serialisation --------------------------------------------------
    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1, sort_keys=True)

    @classmethod
    def from_json(cls, text: str | bytes, where: str = "manifest.json") -> Manifest:
        try:
            raw = json.loads(text)
        except (ValueError, UnicodeDecodeError) as exc:
            raise ManifestError(f"{where}: not valid JSON ({exc})") from exc
        if not isinstance(raw, dict):
            raise ManifestError(f"{where}: expected a JSON object, got {type(raw).__name__}")
        return cls.from_dict(raw, where)

    @classmethod
    def from_dict(cls, raw: dict[str, Any], where: str = "manifest.json") -> Manifest:
        fmt = raw.get("format")
        if fmt != FORMAT:
            raise ManifestError(f"{where}: field 'format' is {fmt!r}, expected {FORMAT!r}")
        version = raw.get("format_version")
        if version != FORMAT_VERSION:
            raise UnsupportedFormatError(
                f"{where}: format_version {version!r} is not supported by this stoker "
                f"(it reads version {FORMAT_VERSION}); upgrade stoker or rewrite the dataset"
            )
        get = _Fields(raw, where)
        dtype = get.text("dtype")
        if dtype not in _DTYPES:
            raise ManifestError(
                f"{where}: field 'dtype' is {dtype!r}, expected one of {sorted(_DTYPES)}"
            )
        comp = get.obj("compression")
        cget = _Fields(comp, f"{where}: compression")
        if cget.text("codec") != "zstd":
            raise ManifestError(
                f"{where}: compression codec {comp.get('codec')!r} is not supported"
            )
        dictionary = comp.get("dictionary")
        tok = raw.get("tokenizer")
        manifest = cls(
            dataset_id=get.text("dataset_id"),
            dtype=dtype,
            vocab_size=get.integer("vocab_size", minimum=1),
            eos_id=get.opt_int("eos_id"),
            num_tokens=get.integer("num_tokens", minimum=1),
            num_documents=get.integer("num_documents", minimum=0),
            block_tokens=get.integer("block_tokens", minimum=1),
            blocks_per_file=get.integer("blocks_per_file", minimum=1),
            files=tuple(_file_ref(f, where) for f in get.items("files")),
            index=_file_ref(get.obj("index"), where),
            compression=Compression(
                codec="zstd",
                level=cget.integer("level", minimum=-(2**17)),
                shuffle=bool(comp.get("shuffle", False)),
                dictionary=None if dictionary is None else _file_ref(dictionary, where),
                min_match=cget.opt_int("min_match"),
            ),
            tokenizer=None if tok is None else _tokenizer(tok, where),
            compressed_bytes=int(raw.get("compressed_bytes", 0)),
            created=str(raw.get("created", "")),
            writer=str(raw.get("writer", "")),
        )
        manifest.validate(where)
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
    """Reject paths that would leave the dataset directory."""
    if not isinstance(path, str) or not path:
        raise ManifestError(f"{where}: file path {path!r} is not a non-empty string")
    norm = posixpath.normpath(path)
    if (
        "://" in path
        or path.startswith(("/", "\\", "~"))
        or "\\" in path
        or norm == ".."
        or norm.startswith("../")
        or ":" in norm.split("/")[0]
    ):
        raise ManifestError(
            f"{where}: file path {path!r} points outside the dataset; "
            "manifest paths must be relative and stay inside the dataset directory"
        )
    return norm


def _file_ref(raw: Any, where: str) -> FileRef:
    if not isinstance(raw, dict):
        raise ManifestError(f"{where}: a file entry is {type(raw).__name__}, expected an object")
    get = _Fields(raw, f"{where}: file entry")
    xxh = raw.get("xxh64")
    return FileRef(
        path=safe_relpath(get.text("path"), where),
        bytes=get.integer("bytes", minimum=0),
        xxh64=None if xxh is None else str(xxh),
    )


def _tokenizer(raw: Any, where: str) -> TokenizerInfo:
    if not isinstance(raw, dict):
        raise ManifestError(f"{where}: field 'tokenizer' must be an object or null")
    get = _Fields(raw, f"{where}: tokenizer")
    path = raw.get("path")
    return TokenizerInfo(
        name=get.text("name"),
        sha256=get.text("sha256"),
        eos_token=raw.get("eos_token"),
        path=None if path is None else safe_relpath(path, where),
    )


class _Fields:
    """Typed access to a JSON object, with errors that name the field."""

    def __init__(self, raw: dict[str, Any], where: str) -> None:
        self.raw, self.where = raw, where

    def _get(self, name: str) -> Any:
        if name not in self.raw:
            raise ManifestError(f"{self.where}: required field {name!r} is missing")
        return self.raw[name]

    def text(self, name: str) -> str:
        value = self._get(name)
        if not isinstance(value, str):
            raise ManifestError(f"{self.where}: field {name!r} must be a string, got {value!r}")
        return value

    def integer(self, name: str, minimum: int | None = None) -> int:
        value = self._get(name)
        if isinstance(value, bool) or not isinstance(value, int):
            raise ManifestError(f"{self.where}: field {name!r} must be an integer, got {value!r}")
        if minimum is not None and value < minimum:
            raise ManifestError(f"{self.where}: field {name!r} is {value}, must be >= {minimum}")
        return value

    def opt_int(self, name: str) -> int | None:
        return None if self.raw.get(name) is None else self.integer(name)

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
    """Decode the block index and check it against the manifest."""
    if len(data) != manifest.num_blocks * INDEX_DTYPE.itemsize:
        raise ManifestError(
            f"{where}: {len(data)} bytes, expected {manifest.num_blocks * INDEX_DTYPE.itemsize}"
        )
    return np.frombuffer(data, dtype=INDEX_DTYPE)
