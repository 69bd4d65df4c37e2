"""Resume state: what a checkpoint of the data stream contains (one owner).

A state is a small JSON-able dict, independent of dataset size::

    {"stoker_state": 1,                       # this format's version
     "dataset_id": ..., "num_samples": ...,   # which dataset
     "seq_len", "seed", "shuffle", "shard_size", "window_shards", "drop_remainder",
     "epoch": t,                              # training epoch in progress
     "epoch_set": [[a, b], ...],              # stream positions of epoch t
     "world": W, "chunk": c,                  # split that "consumed" refers to
     "consumed": m,                           # samples each rank has consumed
     "worker": null | {"worker": w, "num_workers": nw, "yielded": k}}

"consumed" counts samples every rank consumed in epoch t; in synchronous data
parallel training every rank consumes the same number, so the state of any
rank stands for all. A state saved inside a DataLoader worker (torchdata's
StatefulDataLoader saves one per worker) carries "worker" and restores only
with the same split.

Restoring with the same world size and chunk continues in exactly the same
order. With another world size the consumed positions are removed from the
epoch set and what remains is split across the new ranks in stream order; the
part that does not divide evenly carries into the next epoch.
"""

from __future__ import annotations

import hashlib
import json
import numbers
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from stoker import intervals, plan
from stoker.errors import StateError

STATE_VERSION = 1
IDENTITY_FIELDS = (
    "dataset_id",
    "seq_len",
    "seed",
    "shuffle",
    "shard_size",
    "window_shards",
    "num_samples",
)


@dataclass
class Progress:
    """Where a rank is: epoch, its epoch set, and how far every rank got."""

    epoch: int
    epoch_set: np.ndarray
    world: int
    chunk: int
    consumed: int = 0

    @property
    def split(self) -> plan.EpochSplit:
        return plan.EpochSplit(self.epoch_set, self.world)


def build(
    identity: dict[str, Any],
    drop_remainder: bool,
    progress: Progress,
    worker: dict[str, int] | None,
) -> dict[str, Any]:
    return {
        "stoker_state": STATE_VERSION,
        **{k: int(v) if _is_int(v) else v for k, v in identity.items()},
        "drop_remainder": bool(drop_remainder),
        "epoch": int(progress.epoch),
        "epoch_set": intervals.to_list(progress.epoch_set),
        "world": int(progress.world),
        "chunk": int(progress.chunk),
        "consumed": int(progress.consumed),
        "worker": None if worker is None else {k: int(v) for k, v in worker.items()},
    }


#: Bounds that keep every position of a state inside int64 arithmetic.
MAX_POSITION = 1 << 62
MAX_WORLD = 1 << 20
MAX_CHUNK = 1 << 31
MAX_INTERVALS = 1 << 20


def _is_int(value: Any) -> bool:
    """An integer (numpy's included), but not a bool: ``True`` is no epoch."""
    return isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_))


def _same(theirs: Any, mine: Any) -> bool:
    """Equal, and of the same kind: integers by value (numpy's included), others by type
    too, so that ``True`` is not ``1`` and ``"1"`` is not ``1``."""
    if _is_int(theirs) and _is_int(mine):
        return int(theirs) == int(mine)
    return type(theirs) is type(mine) and bool(theirs == mine)


def integer_field(state: dict[str, Any], name: str, lo: int, hi: int, where: str = "state") -> int:
    value: Any = state.get(name)
    if not _is_int(value):
        raise StateError(f"{where} field {name!r} must be an integer, got {value!r}")
    if not lo <= value <= hi:
        raise StateError(f"{where} field {name!r} is {value}, must be in [{lo}, {hi}]")
    return int(value)


def check_version(state: Any, mode: str | None = None) -> dict[str, Any]:
    """``state`` if it is a dict of this state format (``mode`` None: a static state,
    ``"coordinator"``: one of a coordinator-fed loader); a StateError otherwise."""
    if not isinstance(state, dict):
        raise StateError(f"a stoker state is a dict, got {type(state).__name__}")
    version = state.get("stoker_state")
    if type(version) is not int or version != STATE_VERSION:
        raise StateError(
            f"state format version {version!r} is not supported (this stoker reads version "
            f"{STATE_VERSION}); it was saved by another stoker or is not a stoker state"
        )
    got = state.get("mode")
    if got != mode:
        if got == "coordinator":
            raise StateError(
                "this state comes from a run fed by a coordinator: pass coordinator= to resume it"
            )
        if mode == "coordinator" and got is None:
            raise StateError(
                "this state comes from a run without a coordinator (static split); resume it "
                "without coordinator=, or start the coordinated run from scratch"
            )
        raise StateError(f"state field 'mode' is {got!r}, which this stoker does not know")
    return state


def positions(
    raw: Any, name: str, epoch: int, num_samples: int, where: str = "state"
) -> np.ndarray:
    """An interval set of stream positions from a state, checked to lie inside training
    epoch ``epoch``: below the end of its data epoch, and carrying at most one data
    epoch's worth from before it."""
    if not isinstance(raw, list) or len(raw) > MAX_INTERVALS:
        raise StateError(
            f"{where} field {name!r} must be a list of [start, stop] pairs, got "
            f"{type(raw).__name__}"
        )
    end = (epoch + 1) * num_samples
    pairs = []
    for pair in raw:
        if (
            not isinstance(pair, (list, tuple))
            or len(pair) != 2
            or not all(_is_int(v) for v in pair)
            or not 0 <= pair[0] < pair[1] <= end
        ):
            raise StateError(
                f"{where} field {name!r} holds {pair!r}: each member must be a [start, stop] "
                f"pair of integers with 0 <= start < stop <= {end} (the end of epoch {epoch})"
            )
        pairs.append((int(pair[0]), int(pair[1])))
    iv = intervals.make(pairs)
    if intervals.size(iv) != sum(b - a for a, b in pairs):
        raise StateError(f"{where} field {name!r} has overlapping ranges")
    before = intervals.size(intervals.subtract(iv, intervals.make([(epoch * num_samples, end)])))
    if before > num_samples + MAX_WORLD:
        raise StateError(
            f"{where} field {name!r} carries {before} positions from before epoch {epoch}, "
            f"more than one epoch of {num_samples} samples and a world's remainder"
        )
    return iv


def check(state: Any, identity: dict[str, Any]) -> None:
    """Raise StateError unless ``state`` is a static state of the dataset ``identity``
    describes, every field of the right type and inside its range."""
    check_version(state)
    # IDENTITY_FIELDS (in this order) for tokens; a kind's own fields otherwise
    names = [n for n in IDENTITY_FIELDS if n in identity]
    order = state.get("order", "window")
    if order != identity.get("order", "window"):  # a state of one order never resumes another
        raise StateError(
            f"state was saved for another configuration: order is {order!r} in the state "
            f"but {identity.get('order', 'window')!r} here; to resume it, read with "
            f"shuffle=ShuffleConfig(order={order!r}) (states saved before stoker had a "
            "second order are 'window' ones)"
        )
    for name in names + [n for n in identity if n not in names]:
        mine, theirs = identity[name], state.get(name)
        if not _same(theirs, mine):
            what = "dataset" if name in ("dataset_id", "num_samples") else "configuration"
            raise StateError(
                f"state was saved for another {what}: {name} is {theirs!r} in the state "
                f"but {mine!r} here"
            )
    if type(state.get("drop_remainder")) is not bool:
        raise StateError(
            f"state field 'drop_remainder' must be true or false, got {state.get('drop_remainder')!r}"
        )
    S = identity["num_samples"]
    epoch = integer_field(state, "epoch", 0, MAX_POSITION // max(S, 1) - 2)
    world = integer_field(state, "world", 1, MAX_WORLD)
    chunk = integer_field(state, "chunk", 1, MAX_CHUNK)
    consumed = integer_field(state, "consumed", 0, MAX_POSITION)
    epoch_set = positions(state.get("epoch_set"), "epoch_set", epoch, S)
    per_rank = intervals.size(epoch_set) // world
    if consumed > per_rank:
        raise StateError(
            f"state says {consumed} samples consumed per rank, but epoch {epoch} "
            f"has only {per_rank} per rank"
        )
    check_worker(state.get("worker"), per_rank, consumed, chunk)


def check_worker(
    worker: Any, per_rank: int, consumed: int, chunk: int, where: str = "state"
) -> None:
    """A state's DataLoader worker counts (or None), each inside its range: the worker's
    share of the rank's ``per_rank - consumed`` samples dealt ``chunk`` at a time."""
    if worker is not None:
        if not isinstance(worker, dict):
            raise StateError(f"{where} field 'worker' must be null or an object, got {worker!r}")
        nw = integer_field(worker, "num_workers", 1, MAX_WORLD, f"{where} worker")
        w = integer_field(worker, "worker", 0, nw - 1, f"{where} worker")
        share = plan.worker_count(per_rank - consumed, w, nw, chunk)
        integer_field(worker, "yielded", 0, share, f"{where} worker")


_CHECKPOINT_NAME = re.compile(r"epoch[0-9]+-[0-9a-f]{16}")


def check_dynamic(
    state: Any,
    stream: str,
    num_samples: int,
    *,
    adopt: Callable[[str, int], tuple[str, int]] | None = None,
    explain: Callable[[str], str] | None = None,
) -> dict[str, Any]:
    """Raise StateError unless ``state`` is the state of a coordinator-fed loader of this
    data stream (``stream``: the JSON a rank's consumers describe it by): the checkpoint
    name is the coordinator's (``epoch<e>-<sha256 of the snapshot>``), so a snapshot
    edited after it was taken is refused, and its position sets lie inside its epoch.
    Once the snapshot is known to be the coordinator's, ``adopt(its stream, epoch)`` gives
    the ``(stream, num_samples)`` to check the rest against (the snapshot's own stream
    where the dataset can continue it: :meth:`~stoker.loader.planned.PlannedDataset.adoption`);
    ``explain(its stream)`` is the message when the streams still differ. Returns the
    state to go on from: a snapshot taken before any consumer registered, with nothing
    consumed, is a fresh start (``epoch`` None), on any world."""
    check_version(state, "coordinator")
    if state.get("epoch") is None:
        return state  # nothing handed out yet: a fresh start
    epoch = integer_field(state, "epoch", 0, MAX_POSITION // 2)
    batches = integer_field(state, "batches", 0, MAX_POSITION)
    name, snapshot = state.get("checkpoint"), state.get("snapshot")
    if not isinstance(name, str) or not _CHECKPOINT_NAME.fullmatch(name):
        raise StateError(
            f"state field 'checkpoint' is {name!r}, not the name of a coordinator checkpoint"
        )
    if not isinstance(snapshot, dict):
        raise StateError(f"state field 'snapshot' must be an object, got {type(snapshot).__name__}")
    text = json.dumps(snapshot, separators=(",", ":"), sort_keys=True)
    if hashlib.sha256(text.encode()).hexdigest()[:16] != name.rsplit("-", 1)[1]:
        raise StateError(
            f"state field 'snapshot' does not match its checkpoint {name}: it was changed "
            "after the coordinator took it"
        )
    theirs = snapshot.get("stream", "")
    if not isinstance(theirs, str):
        raise StateError(f"state snapshot field 'stream' must be a string, got {theirs!r}")
    if not theirs and epoch == 0 and batches == 0 and snapshot.get("consumed") == []:
        # taken before any consumer registered its stream, nothing handed out: a fresh
        # start (its epoch set was sized for the world it was taken on, which may differ)
        return {**state, "epoch": None}
    if theirs and adopt is not None:
        stream, num_samples = adopt(theirs, epoch)
    if epoch > MAX_POSITION // max(num_samples, 1) - 2:
        raise StateError(f"state field 'epoch' is {epoch}, past the last epoch of positions")
    if theirs and theirs != stream:
        if explain is not None:
            raise StateError(explain(theirs))
        raise StateError(f"the state's data stream {theirs} is not this dataset's {stream}")
    if integer_field(snapshot, "epoch", 0, epoch, "state snapshot") != epoch:
        raise StateError(f"state snapshot is of epoch {snapshot['epoch']}, the state of {epoch}")
    if integer_field(snapshot, "batches", 0, batches, "state snapshot") != batches:
        raise StateError(
            f"state snapshot is after {snapshot['batches']} batches, the state after {batches}"
        )
    epoch_set = positions(snapshot.get("epoch_set"), "epoch_set", epoch, num_samples, "snapshot")
    consumed = positions(snapshot.get("consumed"), "consumed", epoch, num_samples, "snapshot")
    if intervals.size(intervals.subtract(consumed, epoch_set)):
        raise StateError("state snapshot consumed positions that are not in its epoch set")
    return state


def restore(
    state: dict[str, Any], world: int, chunk: int
) -> tuple[Progress, dict[str, int] | None]:
    """The progress to continue from, for a job with ``world`` ranks and ``chunk``."""
    epoch_set = intervals.make([tuple(p) for p in state["epoch_set"]])  # checked by check()
    saved = Progress(state["epoch"], epoch_set, state["world"], state["chunk"], state["consumed"])
    worker = state.get("worker")
    if saved.world == world and saved.chunk == chunk:
        return saved, worker
    if worker is not None:
        raise StateError(
            "this state was saved inside a DataLoader worker and restores only with the same "
            f"world size and batch size (saved world {saved.world}, chunk {saved.chunk}; "
            f"now {world}, {chunk}); save the state from the main process to change topology"
        )
    remaining = intervals.subtract(epoch_set, saved.split.consumed(saved.consumed))
    return Progress(saved.epoch, remaining, world, chunk, 0), None
