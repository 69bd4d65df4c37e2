"""The lease table as a JSON image, and back (pure).

A restarted coordinator replays its journal onto a fresh table, which takes time in
proportion to the epoch's events (a thousand nodes write tens of MB of them in
minutes). An image of the table taken every so often
(:mod:`stoker.coordinator.service`) lets a restart load the last image and replay only
the events written after it. The image holds every attribute of the table but its
event list (the journal's) and what follows from its stream; :func:`dump` refuses a
table with an attribute it does not know, so a new one cannot be left out silently.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from stoker.coordinator import locality
from stoker.coordinator.leases import LeaseTable
from stoker.coordinator.model import Config, Consumer, Event, Lease

VERSION = 2

#: Every attribute of a LeaseTable: those an image holds, and those it rebuilds.
HELD = frozenset(
    {
        "epoch", "epoch_set", "world", "config", "quota", "queue", "local", "claimed",
        "assigned", "consumed", "consumers", "leases", "completed", "log", "log_rows",
        "batch_size", "_answers", "base", "stream", "_continued", "lease_size",
        "tail_ahead", "origin", "first_step", "_next_consumer", "_next_lease", "first_ids",
        "steals", "requeued", "granted", "by_rank",
    }
)  # fmt: skip
REBUILT = frozenset({"events", "_windows"})

Pairs = list[tuple[int, int]]


def _pairs(xs: Any) -> Pairs:
    return [(int(a), int(b)) for a, b in xs]


_CONSUMER = ("id", "rank", "worker", "last_seen", "node", "rate", "since", "read_total", "alive")
_LEASE = ("id", "consumer", "rank", "start", "end", "horizon", "read", "confirmed")


def _runs(batches: list[list[tuple[int, int]]]) -> list[list[int]]:
    """A rank's batch log as runs: ``[start, size, count]`` for ``count`` batches of one
    range of ``size`` positions each, one after another (a lease confirmed batch by
    batch: most of the log), ``[-1, a, b, c, d, ...]`` for a batch of other ranges."""
    out: list[list[int]] = []
    for batch in batches:
        if len(batch) == 1:
            a, b = batch[0]
            last = out[-1] if out else None
            if (
                last is not None
                and last[0] >= 0
                and last[1] == b - a
                and last[0] + last[1] * last[2] == a
            ):
                last[2] += 1
                continue
            out.append([a, b - a, 1])
        else:
            out.append([-1, *(x for r in batch for x in r)])
    return out


def _batches(runs: list[list[int]]) -> list[list[tuple[int, int]]]:
    out: list[list[tuple[int, int]]] = []
    for run in runs:
        if run[0] >= 0:
            a, size, count = run
            out.extend([(a + k * size, a + (k + 1) * size)] for k in range(count))
        else:
            flat = run[1:]
            out.append([(int(flat[i]), int(flat[i + 1])) for i in range(0, len(flat), 2)])
    return out


def dump(table: LeaseTable) -> dict[str, Any]:
    """``table`` as plain JSON values, copied: the table may change while they are
    serialised (on another thread)."""
    names = set(vars(table))
    if names != HELD | REBUILT:
        raise ValueError(
            "the lease table's attributes changed: teach stoker.coordinator.image "
            f"{sorted(names ^ (HELD | REBUILT))}"
        )
    t = table
    return {
        "version": VERSION,
        "epoch": t.epoch,
        "epoch_set": list(t.epoch_set),
        "world": t.world,
        "config": asdict(t.config),
        "quota": t.quota,
        "queue": list(t.queue),
        "local": {k: list(v) for k, v in t.local.items()},
        "claimed": {k: list(v) for k, v in t.claimed.items()},
        "assigned": list(t.assigned),
        "consumed": list(t.consumed),
        "consumers": [
            [*(getattr(c, f) for f in _CONSUMER), list(c.leases)] for c in t.consumers.values()
        ],
        "leases": [[getattr(x, f) for f in _LEASE] for x in t.leases.values()],
        "completed": [[k, c, e] for k, (c, e) in t.completed.items()],
        "log": [_runs(per) for per in t.log],
        "log_rows": list(t.log_rows),
        "batch_size": t.batch_size,
        "answers": [[[seq, list(a)] for seq, a in per.items()] for per in t._answers],
        "base": list(t.base),
        "stream": t.stream,
        "continued": t._continued,
        "lease_size": t.lease_size,
        "tail_ahead": t.tail_ahead,
        "origin": t.origin,
        "first_step": t.first_step,
        "next_ids": [t._next_consumer, t._next_lease],
        "first_ids": list(t.first_ids),
        "steals": t.steals,
        "requeued": t.requeued,
        "granted": t.granted,
        "by_rank": list(t.by_rank),
        "begin": t.events[0].args if t.events and t.events[0].kind == "begin" else None,
    }


def load(image: dict[str, Any]) -> LeaseTable:
    """The table :func:`dump` described; its event list holds only its ``begin``."""
    if image.get("version") != VERSION:
        raise ValueError(f"a lease table image of version {image.get('version')}, not {VERSION}")
    t = LeaseTable.__new__(LeaseTable)
    t.epoch = int(image["epoch"])
    t.epoch_set = _pairs(image["epoch_set"])
    t.world = int(image["world"])
    t.config = Config(**image["config"])
    t.quota = int(image["quota"])
    t.queue = _pairs(image["queue"])
    t.local = {str(k): _pairs(v) for k, v in image["local"].items()}
    t.claimed = {str(k): _pairs(v) for k, v in image["claimed"].items()}
    t.assigned = [int(x) for x in image["assigned"]]
    t.consumed = _pairs(image["consumed"])
    t.consumers = {}
    for *c, leases in image["consumers"]:
        consumer = Consumer(**dict(zip(_CONSUMER, c, strict=True)), leases=list(leases))
        t.consumers[consumer.id] = consumer
    t.leases = {}
    for x in image["leases"]:
        lease = Lease(*x)  # (its fields in _LEASE order)
        t.leases[lease.id] = lease
    t.completed = {int(k): (int(c), int(e)) for k, c, e in image["completed"]}
    t.log = [_batches(per) for per in image["log"]]
    t.log_rows = [int(x) for x in image["log_rows"]]
    t.batch_size = int(image["batch_size"])
    t._answers = [{int(seq): list(a) for seq, a in per} for per in image["answers"]]
    t.base = _pairs(image["base"])
    t.stream = str(image["stream"])
    t._continued = bool(image["continued"])
    t._windows = locality.windows(t.stream)
    t.lease_size = int(image["lease_size"])
    t.tail_ahead = bool(image["tail_ahead"])
    t.origin = str(image["origin"])
    t.first_step = int(image["first_step"])
    t._next_consumer, t._next_lease = (int(x) for x in image["next_ids"])
    a, b = image["first_ids"]
    t.first_ids = (int(a), int(b))
    t.steals = int(image["steals"])
    t.requeued = int(image["requeued"])
    t.granted = int(image["granted"])
    t.by_rank = [int(x) for x in image["by_rank"]]
    begin = image.get("begin")
    t.events = [Event("begin", 0.0, dict(begin) if begin is not None else t._begin_args())]
    return t
