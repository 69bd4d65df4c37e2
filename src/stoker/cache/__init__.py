"""Caches between storage and readers."""

from stoker.cache.disk import DiskCache
from stoker.formats.cache import BlockCache, NullCache

__all__ = ["BlockCache", "DiskCache", "NullCache"]
