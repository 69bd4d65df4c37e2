"""Work stealing: which lease an idle consumer cuts, and how much of it it takes (pure).

When a rank's queue is empty, the lease with the most time left (unread
positions over its consumer's rate) is cut in two and the idle consumer takes
the far part, sized in proportion to the two consumers' rates so that both are
expected to finish together. Only positions beyond the victim's horizon move,
and the victim never reads past its horizon, so nothing stolen was read. The
lease table (:mod:`stoker.coordinator.leases`) makes the cut.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from stoker.coordinator.model import Consumer, Lease

#: Rate assumed for a consumer that has not reported progress yet (positions/s).
DEFAULT_RATE = 1.0


def choose(
    leases: Iterable[Lease],
    consumers: Mapping[int, Consumer],
    thief: Consumer,
    room: int,
    min_steal: int,
) -> tuple[Lease, int] | None:
    """The lease to cut for ``thief`` and how many of its last positions move to it;
    None when no lease has ``min_steal`` positions beyond its horizon.

    Leases of the thief's own rank can always be cut (the rank's count does not
    change); another rank's only up to the thief rank's ``room``.
    """
    best, best_time = None, -1.0
    rates = [x.rate for x in consumers.values() if x.alive and x.rate > 0]
    fallback = sum(rates) / len(rates) if rates else DEFAULT_RATE
    for ls in leases:
        if ls.consumer == thief.id or (ls.rank != thief.rank and room <= 0):
            continue
        if ls.unread_beyond_horizon < min_steal:
            continue
        rate = consumers[ls.consumer].rate or fallback
        left = (ls.end - ls.read) / rate
        if left > best_time:
            best, best_time = ls, left
    if best is None:
        return None
    # split in proportion to the two rates, so both are expected to finish together
    victim_rate = consumers[best.consumer].rate or fallback
    thief_rate = thief.rate or fallback
    share = best.unread_beyond_horizon * thief_rate / (thief_rate + victim_rate)
    share = max(1, min(best.unread_beyond_horizon - 1, round(share)))
    moved = share if best.rank == thief.rank else min(room, share)
    if moved < 1:
        return None
    return best, moved
