"""Which kind of dataset a URL holds, and a handle on it (tokens or records)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from stoker.errors import ManifestError
from stoker.manifest import MANIFEST_NAME
from stoker.storage import Storage

if TYPE_CHECKING:
    from stoker.formats.records import RecordSource
    from stoker.formats.tokens import TokenSource


def manifest_bytes(storage: Storage) -> tuple[bytes, str]:
    """The manifest's bytes, and its URL (what errors about it name)."""
    where = storage.url_of(MANIFEST_NAME)
    try:
        return storage.read(MANIFEST_NAME), where
    except FileNotFoundError as exc:
        raise ManifestError(
            f"{where}: no manifest; this is not a stoker dataset, or its write never finished"
        ) from exc


def kind_of(url: str, storage_options: dict[str, Any] | None = None) -> str:
    """``"tokens"`` or ``"records"``, from the manifest's ``format`` field (the rest of
    the manifest is checked when the dataset is opened)."""
    data, where = manifest_bytes(Storage(url, storage_options))
    try:
        raw = json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ManifestError(f"{where}: not valid JSON ({exc})") from exc
    fmt = raw.get("format") if isinstance(raw, dict) else None
    kinds = {"stoker-tokens": "tokens", "stoker-records": "records"}
    if fmt not in kinds:
        raise ManifestError(f"{where}: field 'format' is {fmt!r}, expected one of {sorted(kinds)}")
    return kinds[fmt]


def open_source(
    url: str, storage_options: dict[str, Any] | None = None
) -> TokenSource | RecordSource:
    """The dataset at ``url``, whichever its kind."""
    if kind_of(url, storage_options) == "records":
        from stoker.formats.records import RecordSource

        return RecordSource(url, storage_options)
    from stoker.formats.tokens import TokenSource

    return TokenSource(url, storage_options)
