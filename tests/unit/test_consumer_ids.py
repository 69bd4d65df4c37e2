"""Consumer ids the service draws are recorded, so a replayed journal gives the same ids."""

from __future__ import annotations

import pytest

from stoker.coordinator.leases import LeaseError, LeaseTable


def test_given_ids_replay_and_are_never_reused() -> None:
    t = LeaseTable(0, [(0, 100)], 2)
    a = t.register(0, 0, 1.0, consumer=7_000_000_000_123)
    b = t.register(1, 0, 1.0, consumer=123_456_789_012_345)
    g = t.request(a, 2.0, [])
    assert g is not None and g.lease
    with pytest.raises(LeaseError, match="taken"):
        t.register(0, 1, 3.0, consumer=a)
    with pytest.raises(LeaseError):
        t.register(0, 1, 3.0, consumer=0)
    again = LeaseTable.replay(t.events)
    assert set(again.consumers) == {a, b}
    assert again.state() == t.state()
