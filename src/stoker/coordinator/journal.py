"""The coordinator's journal: its events, appended in segments under a state URL.

Any fsspec URL works. On object stores (no append there) each flush writes
one new segment object, ``journal/<job>/<seq>.jsonl``, with one PUT, so a
segment is whole or absent. On a local path a journal process appends to one
segment of its own and syncs each flush (fdatasync) (a directory of thousands of small
files would slow every flush); a crash can leave only its last line cut
short, and a cut last line of a segment is the one thing replay skips. A restarted coordinator reads the segments in
order and replays them onto a fresh :class:`~stoker.coordinator.leases.LeaseTable`.
A segment that does not parse (it cannot be half-written, but it can be
damaged) stops the replay with an error naming it; nothing is skipped silently.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Iterator
from typing import Any

from stoker.errors import ConfigError, StateError
from stoker.storage import Storage

HEADER = "stoker-journal 1"
log = logging.getLogger("stoker.coordinator")
#: One encoder for every line (json.dumps with separators makes a new one per call).
_encode = json.JSONEncoder(separators=(",", ":")).encode


class Journal:
    """Segments of events of one job under ``url``."""

    def __init__(self, url: str, job: str, storage_options: dict[str, Any] | None = None) -> None:
        if not job or "/" in job:
            raise ConfigError(f"job name must be non-empty without '/', got {job!r}")
        self.storage = Storage(url, storage_options)
        self.job = job
        self.prefix = f"journal/{job}"
        self._seq = self._last_seq() + 1
        self._open: str | None = None  # the local segment being appended to

    def _segments(self) -> list[tuple[int, str]]:
        out = []
        for base in self.storage.list(self.prefix):
            if base.endswith(".jsonl") and base[:-6].isdigit():
                out.append((int(base[:-6]), f"{self.prefix}/{base}"))
        return sorted(out)

    def _last_seq(self) -> int:
        segs = self._segments()
        return segs[-1][0] if segs else 0

    def append(self, events: list[dict[str, Any]]) -> int:
        """Write ``events`` durably; returns the sequence number of their segment."""
        if not events:
            return self._seq - 1
        lines = "".join(_encode(e) + "\n" for e in events)
        path = f"{self.prefix}/{self._seq:012d}.jsonl"
        if not self.storage.appends:  # an object store: a whole segment per append
            self.storage.write_atomic(path, (HEADER + "\n" + lines).encode())
            self._seq += 1
            return self._seq - 1
        if self._open is None:
            self._open = path
            lines = HEADER + "\n" + lines
        self.storage.append(path, lines.encode())
        return self._seq

    def close(self) -> None:
        if self._open is not None:
            self.storage.close_append(self._open)
            self._open = None
            self._seq += 1

    def rotate(self) -> int:
        """End the segment being appended to (the next append begins a new one); the
        number that next segment will have."""
        self.close()
        return self._seq

    def read(self, first: int = 1) -> list[dict[str, Any]]:
        """Every event, in order, of the segments from number ``first`` on."""
        events: list[dict[str, Any]] = []
        expected = first
        segments = [(seq, path) for seq, path in self._segments() if seq >= first]
        for seq, path in segments:
            where = self.storage.url_of(path)
            if seq != expected:
                raise StateError(f"{where}: journal segment {expected} is missing")
            expected += 1
            text = self.storage.read(path).decode()
            lines = text.split("\n")
            if lines[-1] == "":
                lines.pop()
            elif seq == segments[-1][0] or self.storage.appends:
                # the last append of a crashed journal process, cut short: never
                # acknowledged (a restarted one appends to a segment of its own)
                lines.pop()
            if not lines or lines[0] != HEADER:
                raise StateError(f"{where}: not a stoker journal segment")
            for n, line in enumerate(lines[1:], 2):
                try:
                    events.append(json.loads(line))
                except json.JSONDecodeError as exc:
                    raise StateError(f"{where} line {n}: corrupt journal entry ({exc})") from exc
        return events

    # -- images of the table (a restart loads the last, then reads the segments after) --
    def before(self, segment: int) -> list[int]:
        """``[segment - 1, its size in bytes]``: what an image taken before ``segment``
        follows (an image of another journal under the same name does not match)."""
        if segment <= 1:
            return [0, 0]
        return [segment - 1, self.storage.size(f"{self.prefix}/{segment - 1:012d}.jsonl")]

    def write_image(self, segment: int, data: bytes) -> None:
        """Store an image of the tables as they were before segment ``segment`` (whole or
        absent); older images go but the one before it."""
        self.storage.write_atomic(f"images/{self.job}/{segment:012d}.json", data)
        older = [seq for seq in self._images() if seq < segment]
        for seq in older[:-1]:
            with contextlib.suppress(OSError):
                self.storage.remove(f"images/{self.job}/{seq:012d}.json")

    def _images(self) -> list[int]:
        try:
            names = self.storage.list(f"images/{self.job}")
        except FileNotFoundError:
            return []
        return sorted(int(b[:-5]) for b in names if b.endswith(".json") and b[:-5].isdigit())

    def images(self) -> Iterator[tuple[int, dict[str, Any]]]:
        """``(segment, image)`` of the images this journal's segments continue, newest
        first: an image names the segment before it and that segment's size, which must
        be this journal's. One that does not read or match is passed over (warned of)."""
        last = self._last_seq()
        for seq in reversed(self._images()):
            path = f"images/{self.job}/{seq:012d}.json"
            where = self.storage.url_of(path)
            if seq > last + 1:
                log.warning("%s: passed over, the journal ends at segment %d", where, last)
                continue
            try:
                doc = dict(json.loads(self.storage.read(path)))
                matches = doc.get("segment") == seq and doc.get("before") == self.before(seq)
            except (OSError, ValueError, TypeError) as exc:
                log.warning("%s: passed over, unreadable (%s)", where, exc)
                continue
            if not matches:
                log.warning("%s: passed over, not an image of this journal", where)
                continue
            yield seq, doc

    # -- checkpoints ---------------------------------------------------------------------
    def checkpoint_path(self, name: str) -> str:
        return f"checkpoints/{self.job}/{name}.json"

    def write_checkpoint(self, name: str, snapshot: dict[str, Any]) -> str:
        """Store a snapshot (whole or absent); returns its URL."""
        path = self.checkpoint_path(name)
        if not self.storage.exists(path):
            self.storage.write_atomic(path, json.dumps(snapshot, separators=(",", ":")).encode())
        return self.storage.url_of(path)

    def read_checkpoint(self, name: str) -> dict[str, Any]:
        path = self.checkpoint_path(name)
        try:
            data = self.storage.read(path)
        except FileNotFoundError:
            raise StateError(f"{self.storage.url_of(path)}: no such checkpoint") from None
        try:
            return dict(json.loads(data))
        except (json.JSONDecodeError, TypeError) as exc:
            raise StateError(f"{self.storage.url_of(path)}: corrupt checkpoint ({exc})") from exc
