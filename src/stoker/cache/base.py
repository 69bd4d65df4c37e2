"""Deprecated: the protocol lives in :mod:`stoker.formats.cache`; this name goes in 0.3."""

from stoker.formats.cache import BlockCache as BlockCache
from stoker.formats.cache import NullCache as NullCache

__all__ = ["BlockCache", "NullCache"]
