"""The cache seam: where block records are kept between storage and readers.

Readers ask the cache first and storage second. Today's implementation is a
per-machine disk directory (:mod:`stoker.cache.disk`); the node agent will
implement the same interface.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable


@runtime_checkable
class BlockCache(Protocol):
    """Stores block records by key (``<dataset_id>/<block>``)."""

    def get(self, key: str) -> bytes | None:
        """The record, or None when it is not cached."""

    def put(self, key: str, data: bytes) -> None:
        """Keep a record (the cache may drop it later, or at once when full)."""

    def discard(self, key: str) -> None:
        """Forget a record (it failed its checksum)."""


class NullCache:
    """Caches nothing."""

    def get(self, key: str) -> bytes | None:
        return None

    def put(self, key: str, data: bytes) -> None:
        pass

    def discard(self, key: str) -> None:
        pass
