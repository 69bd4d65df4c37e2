"""The node agent's disk tier (the decoded-block file is :mod:`stoker.cache.layout`'s)."""

from __future__ import annotations

import logging
import os
import threading
import warnings

from stoker.cache.paths import AgentPaths
from stoker.cache.table import TierTable
from stoker.observe.agent import Counters

log = logging.getLogger("stoker.agent")

Key = tuple[str, int]


class DiskTier:
    """Verified compressed records on local disk; a :class:`~stoker.cache.BlockCache`.

    Survives restarts: :meth:`scan` takes in what an earlier agent left (records
    are checked against their checksum when read, so a corrupt one is refetched).
    """

    def __init__(self, paths: AgentPaths, limit: int, counters: Counters) -> None:
        self.paths = paths
        self.table = TierTable(limit)
        self.counters = counters
        self._lock = threading.Lock()
        self._warned = False

    def scan(self) -> int:
        """Adopt the records on disk; remove partial writes. Returns how many were adopted."""
        adopted = 0
        if not self.paths.blocks.is_dir():
            return 0
        found = []
        for ds_dir in self.paths.blocks.iterdir():
            if not ds_dir.is_dir():
                continue
            for f in ds_dir.iterdir():
                if f.name.endswith(".tmp"):
                    f.unlink(missing_ok=True)  # a write this directory's agent never finished
                elif f.suffix == ".rec" and f.stem.isdigit():
                    st = f.stat()
                    found.append((st.st_mtime, ds_dir.name, int(f.stem), st.st_size))
        for _, ds, block, size in sorted(found, reverse=True):  # newest first
            with self._lock:
                if self.table.admit((ds, block), size) == []:
                    self.table.ready((ds, block))
                    adopted += 1
                    continue
            self.paths.record(ds, block).unlink(missing_ok=True)  # over the limit
        return adopted

    @staticmethod
    def _split(key: str) -> Key:
        ds, block = key.rsplit("/", 1)
        return ds, int(block)

    def get(self, key: str) -> bytes | None:
        k = self._split(key)
        with self._lock:
            held = self.table.holds(k)
            if held:
                self.table.pin(k, 0)  # not removed while being read
        if not held:
            self.counters.add("disk_misses")
            return None
        try:
            data = self.paths.record(*k).read_bytes()
        except FileNotFoundError:
            with self._lock:
                self.table.remove(k)
            self.counters.add("disk_misses")
            return None
        finally:
            with self._lock:
                self.table.unpin(k, 0)
        self.counters.add("disk_hits")
        return data

    def put(self, key: str, data: bytes) -> None:
        k = self._split(key)
        with self._lock:
            if k in self.table.entries:
                return
            evicted = self.table.admit(k, len(data))
        if evicted is None:
            self._warn(f"disk tier full ({self.table.capacity} bytes, all in use); not caching")
            return
        self._remove_files(evicted)
        path = self.paths.record(*k)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_bytes(data)
            os.replace(tmp, path)
        except OSError as exc:
            tmp.unlink(missing_ok=True)
            with self._lock:
                self.table.remove(k)
            self._warn(f"disk tier write failed ({exc}); serving without caching on disk")
            return
        with self._lock:
            self.table.ready(k)

    def discard(self, key: str) -> None:
        k = self._split(key)
        with self._lock:
            self.table.remove(k)
        self.paths.record(*k).unlink(missing_ok=True)
        self.counters.add("checksum_refetches")

    def _remove_files(self, keys: list[Key]) -> None:
        for ds, block in keys:
            self.paths.record(ds, block).unlink(missing_ok=True)
            self.counters.add("disk_evictions")

    def _warn(self, text: str) -> None:
        if not self._warned:
            self._warned = True
            log.warning("%s", text)
            warnings.warn(text, stacklevel=3)
