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
from stoker.coordinator.ranges import subtract
from stoker.errors import StokerError


@dataclass(frozen=True)
class Batch:
    epoch: int
    rank: int
    step: int  # the rank's batch number in the epoch, from 1
    positions: np.ndarray
    sample_ids: np.ndarray | None  # None when no consumer registered its mapping


def _stream(text: str) -> Any:
    """The position -> sample id map of a consumers' stream description: a dataset's
    (``plan.Stream``) or a mixture's (:class:`~stoker.mixture.stream.MixStream`, its
    sample ids its source, the source's epoch and id: :func:`~stoker.mixture.stream.encode`);
    None without one."""
    if not text:
        return None
    s = json.loads(text)
    try:
        return _mixture(s) if "mixture" in s else _dataset(s)
    except (KeyError, TypeError, ValueError, ZeroDivisionError, StokerError):
        return None  # a kind of data (or a description) replay cannot map


def _mixture(s: dict[str, Any]) -> Any:
    """A mixture's map: each source's plan, its weights and world (and the plan before a
    change of weights at a restore), as its consumers had."""
    from stoker.mixture.stream import from_description

    sources = [_dataset(s["mixture"][n]) for n in s["weights"]["names"]]
    return from_description(s, [x.samples for x in sources], [x.S for x in sources])


def _dataset(s: dict[str, Any]) -> plan.Stream:
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
    """Every rank's batches of every epoch of the run journaled under ``state_url``, in
    the line of tables the run's training went through.

    That line is followed back from the journal's last table: a table begun from a
    checkpoint (a restore) descends from the table the checkpoint was taken from, cut
    at the batches it counts (what was handed out after it was never trained on, as far
    as the job is concerned); any other table from the table before it in the journal.
    Tables off the line are left out: an epoch the run had begun before it was restored
    to an earlier one, a restore that a later restore went back before.
    """
    journal = Journal(state_url, job, storage_options or None)
    tabs = list(tables(journal.read()))
    cuts: dict[int, int | None] = {}  # table index -> batches it is cut at (None: whole)
    i, cut = len(tabs) - 1, None
    while i >= 0 and i not in cuts:
        cuts[i] = cut
        t = tabs[i]
        if not t.origin:
            i, cut = i - 1, None
            continue
        checkpoint = journal.read_checkpoint(t.origin)
        i, cut = _taken_from(tabs, i, checkpoint), int(checkpoint.get("batches", 0))
    for i in sorted(cuts):
        t, upto = tabs[i], cuts[i]
        stream = _stream(t.stream)
        for rank in range(t.world):
            for step, ranges in enumerate(t.handed_out(rank), t.first_step + 1):
                if upto is not None and step > upto:
                    break
                pos = np.concatenate([np.arange(a, b, dtype=np.int64) for a, b in ranges] or
                                     [np.zeros(0, dtype=np.int64)])  # fmt: skip
                ids = stream.samples(pos) if stream is not None else None
                yield Batch(t.epoch, rank, step, pos, ids)


def _taken_from(tabs: list[LeaseTable], i: int, checkpoint: dict[str, Any]) -> int:
    """The index of the table before ``tabs[i]`` that ``checkpoint`` was taken from; -1
    when the journal does not hold it. A checkpoint names its table (``table``: its
    first ids); one written before it did, as from the latest table of its epoch that could
    have counted it."""
    epoch, table = checkpoint.get("epoch"), checkpoint.get("table")
    batches = int(checkpoint.get("batches", 0))
    consumed = [(int(a), int(b)) for a, b in checkpoint.get("consumed", [])]
    for j in range(i - 1, -1, -1):
        t = tabs[j]
        if t.epoch != epoch:
            continue
        if table is not None:
            if list(t.first_ids) == table:
                return j
        # without a name: a table that could have counted it (begun at or before its
        # batches, with what it began from consumed in it)
        elif t.first_step <= batches and not subtract(t.base, consumed):
            return j
    return -1
