"""A Hypothesis state machine over the node cache's tier table, against a simple model."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import settings
from hypothesis import strategies as hs
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from stoker.cache.table import NEVER, TierTable

KEYS = [("a", b) for b in range(4)] + [("b", b) for b in range(2)]
CLIENTS = [1, 2, 3]
key_st = hs.sampled_from(KEYS)
client_st = hs.sampled_from(CLIENTS)


class TierMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.table = TierTable(capacity=100)
        self.pins: dict[tuple[str, int], Counter[int]] = {}  # the model's pins
        self.sizes: dict[tuple[str, int], int] = {}
        self.ready: set[tuple[str, int]] = set()
        self.plans: dict[int, list[tuple[str, int]]] = {}

    def _use(self, key: tuple[str, int]) -> int:
        ranks = [p.index(key) for p in self.plans.values() if key in p]
        return min(ranks) if ranks else NEVER

    @rule(key=key_st, size=hs.integers(10, 60), prefetch=hs.booleans())
    def admit(self, key: tuple[str, int], size: int, prefetch: bool) -> None:
        if key in self.sizes:
            with pytest.raises(KeyError):
                self.table.admit(key, size, prefetch)
            return
        before = {k: self._use(k) for k in self.sizes}
        evicted = self.table.admit(key, size, prefetch)
        if evicted is None:
            # refused only when it truly cannot fit: what could be evicted is too small
            limit = self._use(key) if prefetch else -1
            evictable = sum(
                s
                for k, s in self.sizes.items()
                if k in self.ready and not self.pins.get(k) and before[k] > limit
            )
            assert size > self.table.capacity - sum(self.sizes.values()) + evictable
            return
        for k in evicted:
            assert k in self.ready, "evicted an entry still loading"
            assert not self.pins.get(k), "evicted a pinned entry"
            if prefetch:
                assert before[k] > self._use(key), "a prefetch evicted a block needed sooner"
            kept = [o for o in self.sizes if o not in evicted and o in self.ready]
            kept = [o for o in kept if not self.pins.get(o)]
            # Belady: nothing kept unpinned is needed later than what went
            assert all(before[o] <= before[k] for o in kept)
            del self.sizes[k]
            self.ready.discard(k)
            self.pins.pop(k, None)
        self.sizes[key] = size

    @rule(key=key_st)
    def finish_load(self, key: tuple[str, int]) -> None:
        if key in self.sizes and key not in self.ready:
            self.table.ready(key)
            self.ready.add(key)

    @rule(key=key_st, size=hs.integers(1, 120), prefetch=hs.booleans())
    def settle(self, key: tuple[str, int], size: int, prefetch: bool) -> None:
        """A loading entry's real size replaces its estimate (the agent's decoded images)."""
        if key not in self.sizes or key in self.ready:
            return
        before = {k: self._use(k) for k in self.sizes}
        limit = self._use(key) if prefetch else -1
        evicted = self.table.settle(key, size, prefetch)
        if evicted is None:
            grow = size - self.sizes[key]
            evictable = sum(
                s
                for k, s in self.sizes.items()
                if k in self.ready and not self.pins.get(k) and before[k] > limit
            )
            assert grow > self.table.capacity - sum(self.sizes.values()) + evictable
            return
        for k in evicted:
            assert k in self.ready and not self.pins.get(k), "settle evicted a held entry"
            if prefetch:
                assert before[k] > limit, "a prefetch's settle evicted a block needed sooner"
            del self.sizes[k]
            self.ready.discard(k)
            self.pins.pop(k, None)
        self.sizes[key] = size

    @rule(key=key_st)
    def fail_load(self, key: tuple[str, int]) -> None:
        if key in self.sizes and key not in self.ready:
            self.table.remove(key)
            del self.sizes[key]

    @rule(key=key_st, client=client_st)
    def pin(self, key: tuple[str, int], client: int) -> None:
        if key in self.ready:
            self.table.pin(key, client)
            self.pins.setdefault(key, Counter())[client] += 1
        else:
            with pytest.raises(KeyError):
                self.table.pin(key, client)

    @rule(key=key_st, client=client_st)
    def unpin(self, key: tuple[str, int], client: int) -> None:
        held = self.pins.get(key, Counter())[client] > 0
        assert self.table.unpin(key, client) is held
        if held:
            self.pins[key][client] -= 1
            if not self.pins[key][client]:
                del self.pins[key][client]

    @rule(client=client_st)
    def client_dies(self, client: int) -> None:
        expect = sum(c.pop(client, 0) for c in self.pins.values())
        self.plans.pop(client, None)
        assert self.table.drop_client(client) == expect

    @rule(client=client_st, keys=hs.lists(key_st, max_size=8))
    def plan(self, client: int, keys: list[tuple[str, int]]) -> None:
        self.table.set_plan(client, keys)
        self.plans[client] = keys

    @precondition(lambda self: bool(self.sizes))
    @rule()
    def agent_restarts(self) -> None:
        """A restarted agent rebuilds its table from what is on disk: ready, unpinned."""
        fresh = TierTable(self.table.capacity)
        for key in sorted(self.ready):
            assert fresh.admit(key, self.sizes[key]) == []
            fresh.ready(key)
        self.table = fresh
        self.sizes = {k: s for k, s in self.sizes.items() if k in self.ready}
        self.pins = {}
        self.plans = {}

    @invariant()
    def matches_model(self) -> None:
        t = self.table
        assert t.used == sum(self.sizes.values()) <= t.capacity
        assert set(t.entries) == set(self.sizes)
        for key, entry in t.entries.items():
            assert entry.ready == (key in self.ready)
            assert +entry.pins == +self.pins.get(key, Counter())
        assert t.pinned_bytes == sum(self.sizes[k] for k, c in self.pins.items() if +c)


TierMachine.TestCase.settings = settings(max_examples=300, stateful_step_count=40, deadline=None)
test_tier_table = TierMachine.TestCase


def test_prefetch_keeps_what_is_needed_sooner() -> None:
    t = TierTable(capacity=2)
    for b in (0, 1):
        t.admit(("d", b), 1)
        t.ready(("d", b))
    t.set_plan(1, [("d", 0), ("d", 1), ("d", 2)])
    assert t.admit(("d", 2), 1, prefetch=True) is None  # both residents come first
    t.set_plan(1, [("d", 0), ("d", 2), ("d", 1)])
    assert t.admit(("d", 2), 1, prefetch=True) == [("d", 1)]


def test_unplanned_entries_go_least_recently_used_first() -> None:
    t = TierTable(capacity=3)
    for b in (0, 1, 2):
        t.admit(("d", b), 1)
        t.ready(("d", b))
    t.touch(("d", 0))
    assert t.admit(("d", 3), 1) == [("d", 1)]


def test_a_prefetch_that_settles_larger_keeps_a_block_needed_sooner() -> None:
    t = TierTable(100)
    soon, later = ("d", 0), ("d", 5)
    t.admit(soon, 40)
    t.ready(soon)
    t.set_plan(1, [soon, ("d", 1), later])
    assert t.admit(later, 40, prefetch=True) == []  # (its estimate)
    assert t.settle(later, 70, prefetch=True) is None  # not by evicting the next block
    assert t.holds(soon) and t.used == 80
    assert t.settle(later, 70) == [soon]  # a reader waits for it: any unpinned block goes
