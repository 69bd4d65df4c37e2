"""What the dataset writers share: data files rolled by size, the files a write made
(removed, best effort, when it fails; a manifest is never among them) and the
``with`` block that commits or aborts."""

from __future__ import annotations

import warnings
from typing import Any

from stoker.manifest import MANIFEST_NAME, FileRef
from stoker.storage import Storage


class DatasetWriter:
    """Base of :class:`~stoker.formats.token_writer.TokenWriter` and
    :class:`~stoker.formats.records.RecordWriter` (they set ``storage`` and ``id``)."""

    storage: Storage
    id: str
    #: The data files' name suffix.
    suffix = ".bin"

    def _start_files(self) -> None:
        self._files: list[FileRef] = []
        self._file: Any = None
        self._file_pos = 0
        self._written: list[str] = []  # every file this write made, for abort()
        self._closed = False
        self._committed = False  # the manifest is written: the dataset is the new one

    def close(self) -> Any:
        raise NotImplementedError

    def _stop(self) -> None:
        """Stop the writer's own work (its threads), before its files are removed."""

    def _roll_file(self) -> None:
        self._finish_file()
        path = f"data/{self.id}-{len(self._files):05d}{self.suffix}"
        self._written.append(path)
        self._file = self.storage.open_write(path)
        self._file_pos = 0
        self._files.append(FileRef(path, 0))

    def _finish_file(self) -> None:
        if self._file is not None:
            self._file.close()
            self._files[-1] = FileRef(self._files[-1].path, self._file_pos)
            self._file = None

    def abort(self) -> None:
        """Stop, and remove what this write produced (best effort); never touches a manifest."""
        self._closed = True
        self._stop()
        try:
            if self._file is not None:
                self._file.close()
        except Exception:
            pass
        self._file = None
        if self._committed:  # (a failure after the manifest: the new dataset stands)
            return
        for path in self._written:
            try:
                self.storage.remove(path)
            except Exception:
                pass

    def _publish(self, manifest: Any, keep: set[str], old: list[str]) -> None:
        """Write ``manifest`` (checked first), the commit point: from here the dataset is
        the new one. Then remove the replaced dataset's files ``old`` that the new one
        does not name (``keep``): one that cannot be removed is left, with a warning."""
        manifest.validate()
        self.storage.write_atomic(MANIFEST_NAME, manifest.to_json().encode())
        self._committed = True
        for path in [p for p in old if p not in keep]:
            try:
                self.storage.remove(path)
            except Exception as exc:
                warnings.warn(
                    f"{self.storage.url_of(path)}: a file of the dataset this write replaced "
                    f"was not removed ({exc}); it is no longer read",
                    stacklevel=3,
                )

    def __enter__(self) -> Any:
        return self

    def __exit__(self, exc_type: object, *_: object) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()
