"""Replay a coordinated run: every rank's batches, in order, from the coordinator's journal.

A dynamic run's order depends on timing (who asked first, who was slow, what
was stolen), but the journal records every batch each rank confirmed before
handing it out, and the hand-out rule is pure (:mod:`stoker.coordinator.delivery`).
So the journal alone gives each rank's exact batch sequence, as stream
positions, and, through the position-to-sample mapping the consumers
registered (dataset, shuffle), as sample ids: the data order of the run, to
reproduce or inspect (``stoker replay``).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from stoker import plan
from stoker.coordinator.journal import Journal
from stoker.coordinator.leases import Event, LeaseTable


@dataclass(frozen=True)
class Batch:
    epoch: int
    rank: int
    step: int  # the rank's batch number in the epoch, from 1
    positions: np.ndarray
    sample_ids: np.ndarray | None  # None when no consumer registered its mapping


def _stream(text: str) -> plan.Stream | None:
    if not text:
        return None
    s = json.loads(text)
    config = plan.ShuffleConfig(
        s["seed"],
        s["shuffle"],
        s["shard_size"],
        s["window_shards"],
        s.get("order", "window"),  # absent: written before there was a second order
        s.get("spread", plan.ShuffleConfig.spread),
    )
    return plan.Stream(int(s["num_samples"]), config)


def tables(events: list[dict[str, Any]]) -> Iterator[LeaseTable]:
    """The table of each epoch (and each restore) the journal describes, in order."""
    current: list[Event] = []
    for raw in events:
        ev = Event.from_json(raw)
        if ev.kind == "begin" and current:
            yield LeaseTable.replay(current)
            current = []
        current.append(ev)
    if current:
        yield LeaseTable.replay(current)


def batches(state_url: str, job: str = "job", **storage_options: Any) -> Iterator[Batch]:
    """Every rank's batches of every epoch of the run journaled under ``state_url``.

    A restore (a table begun from a checkpoint) replaces what the run journaled after
    that checkpoint (what was handed out after it was never trained on, as far as the
    job is concerned): the table of the checkpoint's epoch is cut at the batches the
    checkpoint counts, and tables of later epochs journaled before the restore (the
    run had read ahead into the next epoch before it stopped) are left out.
    """
    journal = Journal(state_url, job, storage_options or None)
    tabs = list(tables(journal.read()))
    for i, t in enumerate(tabs):
        later = [n for n in tabs[i + 1 :] if n.origin]
        if any(n.epoch < t.epoch for n in later):
            continue  # an epoch the run began before it was restored to an earlier one
        # what each later restore of this epoch counted as consumed
        keeps = [journal.read_checkpoint(n.origin) for n in later if n.epoch == t.epoch]
        stream = _stream(t.stream)
        for rank in range(t.world):
            for step, ranges in enumerate(t.handed_out(rank), t.first_step + 1):
                pos = np.concatenate([np.arange(a, b, dtype=np.int64) for a, b in ranges] or
                                     [np.zeros(0, dtype=np.int64)])  # fmt: skip
                if not all(_within(pos, keep["consumed"]) for keep in keeps):
                    break
                ids = stream.samples(pos) if stream is not None else None
                yield Batch(t.epoch, rank, step, pos, ids)


def _within(pos: np.ndarray, ranges: list[list[int]]) -> bool:
    inside = np.zeros(len(pos), dtype=bool)
    for a, b in ranges:
        inside |= (pos >= a) & (pos < b)
    return bool(inside.all())
