"""The block-record cache a :class:`~stoker.formats.tokens.TokenSource` reads through.

A source asks its cache for a block's stored (compressed, checksummed) record
first and storage second, and puts what it read from storage. The protocol
lives here, beside the format that uses it; implementations are
:class:`NullCache`, the per-process :class:`~stoker.cache.disk.DiskCache` and the
node agent's :class:`~stoker.cache.tiers.DiskTier` (the agent's memory tier
holds decoded blocks instead, and readers reach it through
:class:`~stoker.cache.client.AgentClient`, not through this protocol).
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
