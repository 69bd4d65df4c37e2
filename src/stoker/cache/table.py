"""Bookkeeping of one cache tier: sizes, pins, loads in flight, clairvoyant eviction.

Pure: no I/O, no clock, no threads. The node agent keeps one table per tier
(decoded blocks in shared memory, compressed blocks on disk) and does the I/O
the table decides on. Invariants, checked by a state-machine test:

* the bytes of resident and loading entries never exceed the capacity;
* a pinned entry is never evicted; a pin count never goes below zero;
* a client's pins all go when the client goes (a reader killed with SIGKILL);
* eviction takes the unpinned entry whose next use is furthest away (Belady):
  not needed again = first to go; ties go to the least recently used.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

NEVER = 1 << 62


@dataclass
class Entry:
    size: int
    ready: bool = False
    pins: Counter[int] = field(default_factory=Counter)
    touched: int = 0  # logical time of the last use, for LRU among equals

    @property
    def pinned(self) -> bool:
        return bool(self.pins)


class TierTable:
    """Entries keyed by ``(dataset, block)`` within ``capacity`` bytes."""

    def __init__(self, capacity: int) -> None:
        if capacity < 0:
            raise ValueError(f"capacity must be >= 0, got {capacity}")
        self.capacity = capacity
        self.entries: dict[tuple[str, int], Entry] = {}
        self.used = 0
        self._next_use: dict[int, dict[tuple[str, int], int]] = {}  # client -> key -> rank
        self._clock = 0
        self.evictions = 0

    # -- plans -------------------------------------------------------------------
    def set_plan(self, client: int, keys: list[tuple[str, int]]) -> None:
        """``keys`` is what ``client`` reads next, in order (the first is needed first)."""
        ranks: dict[tuple[str, int], int] = {}
        for i, key in enumerate(keys):
            ranks.setdefault(key, i)
        self._next_use[client] = ranks

    def next_use(self, key: tuple[str, int]) -> int:
        """How soon any client needs ``key`` (0 = next), or NEVER."""
        best = NEVER
        for ranks in self._next_use.values():
            r = ranks.get(key)
            if r is not None and r < best:
                best = r
        return best

    # -- admission and eviction ------------------------------------------------
    def _victims(self, need: int, before: int) -> list[tuple[str, int]] | None:
        """Unpinned ready entries to evict so that ``need`` more bytes fit, or None."""
        free = self.capacity - self.used
        if free >= need:
            return []
        candidates = sorted(
            (
                (self.next_use(k), -e.touched, k)
                for k, e in self.entries.items()
                if e.ready and not e.pinned
            ),
            reverse=True,
        )
        out = []
        for use, _, key in candidates:
            if use <= before:
                break  # everything left is needed no later than the newcomer
            out.append(key)
            free += self.entries[key].size
            if free >= need:
                return out
        return None

    def admit(
        self, key: tuple[str, int], size: int, prefetch: bool = False
    ) -> list[tuple[str, int]] | None:
        """Reserve ``size`` bytes for ``key`` (state: loading). Returns the keys evicted to
        make room (their data must be removed by the caller), or None when it does not fit.

        A prefetch only evicts entries needed later than ``key``; a demand load
        evicts any unpinned entry.
        """
        if key in self.entries:
            raise KeyError(f"{key} is already in the tier")
        if size > self.capacity:
            return None
        before = self.next_use(key) if prefetch else -1
        victims = self._victims(size, before)
        if victims is None:
            return None
        for v in victims:
            self.used -= self.entries.pop(v).size
            self.evictions += 1
        self.entries[key] = Entry(size)
        self.used += size
        return victims

    def settle(
        self, key: tuple[str, int], size: int, prefetch: bool = False
    ) -> list[tuple[str, int]] | None:
        """A loading ``key`` turned out to take ``size`` bytes, not what it was admitted
        with (its size could only be estimated before it loaded). Returns the keys evicted
        to make the difference fit, as :meth:`admit` would (a prefetch: only entries needed
        later than ``key``; a demand load: any unpinned ready entry; their data must be
        removed by the caller), or None when it does not fit: then nothing changed, and
        the caller removes ``key``."""
        entry = self.entries[key]
        if size > self.capacity:
            return None
        grow = size - entry.size
        before = self.next_use(key) if prefetch else -1
        victims = self._victims(grow, before) if grow > 0 else []
        if victims is None:
            return None
        for v in victims:
            self.used -= self.entries.pop(v).size
            self.evictions += 1
        entry.size = size
        self.used += grow
        return victims

    def ready(self, key: tuple[str, int]) -> None:
        """The load of ``key`` finished."""
        self.entries[key].ready = True
        self.touch(key)

    def remove(self, key: tuple[str, int]) -> None:
        """Forget ``key`` (a failed load, a bad checksum). Pins on it are dropped."""
        entry = self.entries.pop(key, None)
        if entry is not None:
            self.used -= entry.size

    def touch(self, key: tuple[str, int]) -> None:
        self._clock += 1
        self.entries[key].touched = self._clock

    # -- pins ----------------------------------------------------------------------
    def pin(self, key: tuple[str, int], client: int) -> None:
        entry = self.entries[key]
        if not entry.ready:
            raise KeyError(f"{key} is not loaded yet")
        entry.pins[client] += 1
        self.touch(key)

    def unpin(self, key: tuple[str, int], client: int) -> bool:
        """Drop one pin; False when ``client`` held none on ``key``."""
        entry = self.entries.get(key)
        if entry is None or entry.pins[client] <= 0:
            if entry is not None:
                del entry.pins[client]
            return False
        entry.pins[client] -= 1
        if entry.pins[client] == 0:
            del entry.pins[client]
        return True

    def drop_client(self, client: int) -> int:
        """Release everything ``client`` held; returns how many pins went."""
        released = 0
        for entry in self.entries.values():
            released += entry.pins.pop(client, 0)
        self._next_use.pop(client, None)
        return released

    # -- views ---------------------------------------------------------------------
    @property
    def pinned_bytes(self) -> int:
        return sum(e.size for e in self.entries.values() if e.pinned)

    def holds(self, key: tuple[str, int]) -> bool:
        entry = self.entries.get(key)
        return entry is not None and entry.ready
