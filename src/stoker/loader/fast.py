"""Deprecated: :mod:`stoker.loader.loader` (``TokenLoader``); this name goes in 0.3."""

from stoker.errors import WorkerError as WorkerError
from stoker.loader.loader import TokenLoader as TokenLoader

__all__ = ["TokenLoader", "WorkerError"]
