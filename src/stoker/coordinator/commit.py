"""Group commit: the lease table's events, journaled before the calls that made them answer.

Calls that change the table add their events to one buffer (:meth:`GroupCommit.add`,
under the service's lock, in the table's order); a call that must be durable then
waits in :meth:`GroupCommit.sync` until its events are written. Callers waiting
together are written as one journal segment: the first to get the write lock writes
everything buffered so far, so the cost is one write (and one ``fdatasync``) per
group of calls, not per call. Calls that need not wait are written by a thread
every ``interval`` seconds (:meth:`start`), and by :meth:`close`.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from typing import Any

from stoker.coordinator.journal import Journal
from stoker.coordinator.model import Event


class GroupCommit:
    def __init__(self, journal: Journal, interval: float = 0.05) -> None:
        self.journal = journal
        self.interval = interval
        self._lock = threading.Lock()  # the buffer
        self._write_lock = threading.Lock()  # one journal write at a time
        self._buffer: list[dict[str, Any]] = []
        self._buffered = self._written = 0
        self._stop = threading.Event()

    def add(self, events: Iterable[Event]) -> int:
        """Buffer ``events``; returns how many have been buffered in all, the number to
        wait for with :meth:`sync`."""
        lines = [e.to_json() for e in events]
        with self._lock:
            self._buffer.extend(lines)
            self._buffered += len(lines)
            return self._buffered

    @property
    def buffered(self) -> int:
        return self._buffered

    def sync(self, upto: int) -> None:
        """Return once the first ``upto`` buffered events are in the journal."""
        with self._write_lock:
            if self._written < upto:
                self._write()

    def rotate(self) -> int:
        """Write everything buffered, then end the journal's segment; the number of the
        segment the next events go to (an image of the table is taken at this point)."""
        with self._write_lock:
            self._write()
            return self.journal.rotate()

    def _write(self) -> None:
        """Write what is buffered (with the write lock held)."""
        with self._lock:
            batch, self._buffer = self._buffer, []
        if batch:
            try:
                self.journal.append(batch)
            except BaseException:
                # not written: back in front of what came meanwhile, for the next sync
                # (a waiter must not find the buffer empty and answer unwritten calls)
                with self._lock:
                    self._buffer[:0] = batch
                raise
            self._written += len(batch)

    def start(self) -> None:
        """Write what calls that need not wait left behind, every ``interval``."""
        threading.Thread(target=self._run, daemon=True, name="stoker-journal").start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.sync(self._buffered)

    def close(self) -> None:
        self._stop.set()
        self.sync(self._buffered)
        self.journal.close()
