"""Caches between storage and readers."""

from stoker.cache.base import BlockCache, NullCache
from stoker.cache.disk import DiskCache

__all__ = ["BlockCache", "DiskCache", "NullCache"]
