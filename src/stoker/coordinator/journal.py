"""The coordinator's journal: its events, appended in segments under a state URL.

Any fsspec URL works, object stores included (no append there): each flush
writes one new segment object, ``journal/<job>/<seq>.jsonl``, atomically
(local files: write aside and rename; object stores: one PUT), so a segment
is either whole or absent. A restarted coordinator reads the segments in
order and replays them onto a fresh :class:`~stoker.coordinator.leases.LeaseTable`.
A segment that does not parse (it cannot be half-written, but it can be
damaged) stops the replay with an error naming it; nothing is skipped silently.
"""

from __future__ import annotations

import json
from typing import Any

from stoker.errors import StateError
from stoker.storage import Storage

HEADER = "stoker-journal 1"


class Journal:
    """Segments of events of one job under ``url``."""

    def __init__(self, url: str, job: str, storage_options: dict[str, Any] | None = None) -> None:
        if not job or "/" in job:
            raise ValueError(f"job name must be non-empty without '/', got {job!r}")
        self.storage = Storage(url, storage_options)
        self.job = job
        self.prefix = f"journal/{job}"
        self._seq = self._last_seq() + 1

    def _segments(self) -> list[tuple[int, str]]:
        fs, full = self.storage.fs, self.storage.full(self.prefix)
        try:
            names = fs.ls(full, detail=False)
        except FileNotFoundError:
            return []
        out = []
        for name in names:
            base = str(name).rstrip("/").rsplit("/", 1)[-1]
            if base.endswith(".jsonl") and base[:-6].isdigit():
                out.append((int(base[:-6]), f"{self.prefix}/{base}"))
        return sorted(out)

    def _last_seq(self) -> int:
        segs = self._segments()
        return segs[-1][0] if segs else 0

    def append(self, events: list[dict[str, Any]]) -> int:
        """Write ``events`` as the next segment; returns its sequence number."""
        if not events:
            return self._seq - 1
        body = "\n".join([HEADER, *(json.dumps(e, separators=(",", ":")) for e in events)]) + "\n"
        seq = self._seq
        self.storage.write_atomic(f"{self.prefix}/{seq:012d}.jsonl", body.encode())
        self._seq += 1
        return seq

    def read(self) -> list[dict[str, Any]]:
        """Every event, in order."""
        events: list[dict[str, Any]] = []
        expected = 1
        for seq, path in self._segments():
            where = self.storage.url_of(path)
            if seq != expected:
                raise StateError(f"{where}: journal segment {expected} is missing")
            expected += 1
            lines = self.storage.read(path).decode().splitlines()
            if not lines or lines[0] != HEADER:
                raise StateError(f"{where}: not a stoker journal segment")
            for n, line in enumerate(lines[1:], 2):
                try:
                    events.append(json.loads(line))
                except json.JSONDecodeError as exc:
                    raise StateError(f"{where} line {n}: corrupt journal entry ({exc})") from exc
        return events
