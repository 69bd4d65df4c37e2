"""The few filesystem methods :class:`~stoker.storage.Storage` uses: what a backend is.

fsspec filesystems have them (and much more); stoker's own :class:`LocalFS`
(pread on kept descriptors) and :class:`HTTPFS` (stdlib keep-alive range
requests) have exactly these, which is what makes them cheap to import.
"""

from __future__ import annotations

from typing import IO, Any, Protocol


class Backend(Protocol):
    def cat_file(self, path: str, start: int | None = None, end: int | None = None) -> bytes:
        """Bytes ``[start, end)`` of a file (all of it by default)."""
        ...

    def exists(self, path: str) -> bool: ...

    def size(self, path: str) -> int: ...

    def ls(self, path: str, detail: bool = False) -> list[Any]:
        """A directory's entries, as full paths (``detail=False``)."""
        ...

    def makedirs(self, path: str, exist_ok: bool = True) -> None: ...

    def open(self, path: str, mode: str = "rb") -> IO[Any]: ...

    def pipe_file(self, path: str, data: bytes) -> None:
        """Write a whole file at once (one PUT on an object store)."""
        ...

    def rm_file(self, path: str) -> None: ...
