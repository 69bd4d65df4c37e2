"""A size-bounded disk cache of block records, safe for many processes.

Each record is one file, written aside and renamed into place, so a reader
never sees half a record. Hits refresh the file's mtime. A writer makes room
before it writes: when what is on disk (counted there, since several
processes share the directory) plus the new record would pass the limit, it
removes the least recently used files until the new record fits under 90% of
the limit. One cache's writes and the room they make are serialised, so with
one writer the directory never holds more than the limit, even while a record
is being written; caches sharing a directory (other processes, or other
datasets of one process) may each be writing one record past it. Only files
this cache names (``*.blk``) are ever removed.
"""

from __future__ import annotations

import os
import threading
import uuid
import warnings
from pathlib import Path

from stoker.errors import ConfigError


class DiskCache:
    """Block records under ``directory``, at most ``limit_bytes`` in all."""

    SUFFIX = ".blk"

    def __init__(self, directory: str | os.PathLike[str], limit_bytes: int) -> None:
        if limit_bytes <= 0:
            raise ConfigError(f"cache limit must be positive, got {limit_bytes} bytes")
        self.directory = Path(directory)
        self.limit_bytes = limit_bytes
        self._lock = threading.Lock()
        self._pid = os.getpid()
        self.hits = self.misses = self.evictions = 0
        self._warned = False

    def __getstate__(self) -> dict[str, object]:
        state = self.__dict__.copy()
        state["_lock"] = None
        return state

    def __setstate__(self, state: dict[str, object]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()
        self._pid = os.getpid()

    def _path(self, key: str) -> Path:
        return self.directory / (key.replace("/", "__") + self.SUFFIX)

    def get(self, key: str) -> bytes | None:
        path = self._path(key)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            self.misses += 1
            return None
        self.hits += 1
        try:
            os.utime(path)
        except FileNotFoundError:
            pass
        return data

    def put(self, key: str, data: bytes) -> None:
        if len(data) > self.limit_bytes:
            return
        path = self._path(key)
        tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
        if self._pid != os.getpid():  # forked: perhaps while another thread held the lock
            self._lock, self._pid = threading.Lock(), os.getpid()
        with self._lock:
            try:
                self.directory.mkdir(parents=True, exist_ok=True)
                self._make_room(len(data))
                tmp.write_bytes(data)
                os.replace(tmp, path)
            except OSError as exc:  # a full disk degrades to no caching
                tmp.unlink(missing_ok=True)
                if not self._warned:
                    self._warned = True
                    warnings.warn(
                        f"stoker disk cache {self.directory}: cannot write ({exc}); "
                        "reading without the cache",
                        stacklevel=2,
                    )

    def discard(self, key: str) -> None:
        self._path(key).unlink(missing_ok=True)

    def _entries(self) -> list[tuple[float, int, Path]]:
        out = []
        for entry in os.scandir(self.directory):
            if entry.name.endswith(self.SUFFIX) and not entry.name.startswith("."):
                try:
                    st = entry.stat()
                except FileNotFoundError:
                    continue
                out.append((st.st_mtime, st.st_size, Path(entry.path)))
        return out

    def _make_room(self, incoming: int) -> None:
        # other processes write here too: count what is on disk, not what we wrote
        entries = self._entries()
        total = sum(size for _, size, _ in entries)
        if total + incoming <= self.limit_bytes:
            return
        target = int(self.limit_bytes * 0.9) - incoming
        for _, size, path in sorted(entries):
            if total <= target:
                break
            path.unlink(missing_ok=True)
            total -= size
            self.evictions += 1
