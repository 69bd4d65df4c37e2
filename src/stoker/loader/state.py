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

from dataclasses import dataclass
from typing import Any

import numpy as np

from stoker import intervals
from stoker.errors import StateError
from stoker.plan import EpochSplit

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
    def split(self) -> EpochSplit:
        return EpochSplit(self.epoch_set, self.world)


def build(
    identity: dict[str, Any],
    drop_remainder: bool,
    progress: Progress,
    worker: dict[str, int] | None,
) -> dict[str, Any]:
    return {
        "stoker_state": STATE_VERSION,
        **identity,
        "drop_remainder": drop_remainder,
        "epoch": progress.epoch,
        "epoch_set": intervals.to_list(progress.epoch_set),
        "world": progress.world,
        "chunk": progress.chunk,
        "consumed": progress.consumed,
        "worker": worker,
    }


def check(state: Any, identity: dict[str, Any]) -> None:
    if not isinstance(state, dict):
        raise StateError(f"a stoker state is a dict, got {type(state).__name__}")
    version = state.get("stoker_state")
    if version != STATE_VERSION:
        raise StateError(
            f"state format version {version!r} is not supported (this stoker reads version "
            f"{STATE_VERSION}); it was saved by another stoker or is not a stoker state"
        )
    for name in IDENTITY_FIELDS:
        if state.get(name) != identity[name]:
            what = "dataset" if name in ("dataset_id", "num_samples") else "configuration"
            raise StateError(
                f"state was saved for another {what}: {name} is {state.get(name)!r} in the state "
                f"but {identity[name]!r} here"
            )
    for name in ("epoch", "world", "chunk", "consumed"):
        value = state.get(name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise StateError(f"state field {name!r} must be a non-negative integer, got {value!r}")
    if state["world"] < 1 or state["chunk"] < 1:
        raise StateError("state fields 'world' and 'chunk' must be >= 1")


def restore(
    state: dict[str, Any], world: int, chunk: int
) -> tuple[Progress, dict[str, int] | None]:
    """The progress to continue from, for a job with ``world`` ranks and ``chunk``."""
    try:
        epoch_set = intervals.make([tuple(p) for p in state["epoch_set"]])
    except (TypeError, ValueError, KeyError) as exc:
        raise StateError(f"state field 'epoch_set' is malformed: {exc}") from exc
    saved = Progress(state["epoch"], epoch_set, state["world"], state["chunk"], state["consumed"])
    if saved.consumed > saved.split.per_rank:
        raise StateError(
            f"state says {saved.consumed} samples consumed per rank, but epoch {saved.epoch} "
            f"has only {saved.split.per_rank} per rank"
        )
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
