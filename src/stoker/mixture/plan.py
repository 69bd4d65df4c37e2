"""A mixture's plan, step by step, and its state (pure).

:class:`MixPlan` walks the global steps of a mixture: for each it moves the
sources' cumulative counts towards their targets (:func:`~stoker.mixture.apportion.advance`),
runs each source through its own epochs (:func:`~stoker.mixture.deal.segments`) and
shares the step among the ranks (:func:`~stoker.mixture.deal.deal`,
:func:`~stoker.mixture.deal.rank_batch`).

The targets are measured from a *regime*: the step and counts where the current
weights and batch size took over (the run's start, or a restore that changed
them). Under one regime the target of source ``i`` after step ``s`` is
``counts_i + batch * sum of its weights over [regime step, s]``, exact. The state is
the step, every source's count and ``(epoch, taken of it)``, and the regime: a few
integers per source, whatever the position, and nothing to replay. A restore with
the same sources, weights and batch continues exactly; one that changes the
weights (or adds or removes a source) starts a regime at the restored step, so
every source continues from where it stood and the new weights hold from the next
step on.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np

from stoker.errors import StateError
from stoker.mixture.apportion import advance
from stoker.mixture.deal import EpochSamples, Item, Segment, deal, rank_batch, segments
from stoker.mixture.schedule import WeightSchedule

STATE_VERSION = 1


@dataclass(frozen=True)
class Step:
    """One global step: its number, what each source gave, and how it was dealt."""

    step: int
    taken: tuple[int, ...]  # samples per source
    segments: tuple[Segment, ...]
    dealt: tuple[tuple[np.ndarray, np.ndarray], ...]  # per segment, each rank's range
    batch: int  # per rank

    def rank_items(self, rank: int) -> list[tuple[int, int, int, int]]:
        """Rank ``rank``'s samples: ``(source, source epoch, owner rank, local index)``."""
        items: list[Item] = rank_batch(self.dealt, self.batch, rank)
        return [(self.segments[s][0], self.segments[s][1], owner, j) for s, owner, j in items]


class MixPlan:
    """The steps of a mixture of ``schedule.names`` over ``world`` ranks of
    ``batch_size`` samples each; ``epoch_samples(source, epoch)``: how many samples a
    source's epoch deals."""

    def __init__(
        self,
        schedule: WeightSchedule,
        batch_size: int,
        world: int,
        epoch_samples: EpochSamples,
    ) -> None:
        if batch_size < 1 or world < 1:
            raise ValueError(f"batch_size and world must be >= 1, got {batch_size}, {world}")
        self.schedule = schedule
        self.batch_size = batch_size
        self.world = world
        self.epoch_samples = epoch_samples
        k = len(schedule.names)
        self.step = 0
        self.counts: tuple[int, ...] = (0,) * k
        self.epochs: list[tuple[int, int]] = [(0, 0)] * k
        self.regime_step = 0
        self.regime_counts: tuple[int, ...] = (0,) * k

    @property
    def global_batch(self) -> int:
        return self.batch_size * self.world

    def targets(self, step: int) -> list[Fraction]:
        """Each source's cumulative target after ``step`` (under the current regime)."""
        total = self.schedule.total(self.regime_step, step + 1)
        b = self.global_batch
        return [c + b * t for c, t in zip(self.regime_counts, total, strict=True)]

    def next(self) -> Step:
        """Plan the next step and move past it."""
        new = advance(self.counts, self.targets(self.step))
        taken = tuple(n - c for n, c in zip(new, self.counts, strict=True))
        segs, self.epochs = segments(self.epochs, taken, self.epoch_samples)
        dealt = tuple(deal(done, n, self.world) for _, _, done, n in segs)
        out = Step(self.step, taken, tuple(segs), dealt, self.batch_size)
        self.step += 1
        self.counts = new
        return out

    # -- state ------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        names = self.schedule.names
        return {
            "mixture_state": STATE_VERSION,
            "step": self.step,
            "sources": {
                n: {"count": c, "epoch": e, "taken": d}
                for n, c, (e, d) in zip(names, self.counts, self.epochs, strict=True)
            },
            "regime": {
                "step": self.regime_step,
                "counts": dict(zip(names, self.regime_counts, strict=True)),
                "batch_size": self.batch_size,
                "world": self.world,
                "weights": _weights_json(self.schedule),
            },
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state``: exactly when it was saved with this plan's sources,
        weights, batch size and world; otherwise (weights changed, a source added or
        removed) from its step and counts under a new regime. Raises
        :class:`~stoker.errors.StateError` for a state that is not a mixture's, or one
        saved with another world size (each source's epoch is then split again, which
        the mixture's dataset does, not this plan)."""
        if not isinstance(state, dict) or state.get("mixture_state") != STATE_VERSION:
            raise StateError(
                f"not a mixture state of version {STATE_VERSION}: "
                f"{state.get('mixture_state') if isinstance(state, dict) else state!r}"
            )
        try:
            step = _nonneg(state["step"], "step")
            sources = state["sources"]
            regime = state["regime"]
            world = _nonneg(regime["world"], "regime.world")
            batch = _nonneg(regime["batch_size"], "regime.batch_size")
        except (KeyError, TypeError) as exc:
            raise StateError(f"mixture state lacks a field: {exc}") from exc
        if world != self.world:
            raise StateError(f"mixture state saved with world {world}, this plan has {self.world}")
        names = self.schedule.names
        counts, epochs = [], []
        for n in names:
            s = sources.get(n) if isinstance(sources, dict) else None
            if s is None:  # a source added at this restore starts at its beginning
                counts.append(0)
                epochs.append((0, 0))
                continue
            counts.append(_nonneg(s.get("count"), f"sources.{n}.count"))
            epochs.append(
                (
                    _nonneg(s.get("epoch"), f"sources.{n}.epoch"),
                    _nonneg(s.get("taken"), f"sources.{n}.taken"),
                )
            )
        same = (
            set(sources) == set(names)
            and batch == self.batch_size
            and regime.get("weights") == _weights_json(self.schedule)
        )
        self.step = step
        self.counts = tuple(counts)
        self.epochs = epochs
        if same:
            rc = regime.get("counts", {})
            self.regime_step = _nonneg(regime.get("step"), "regime.step")
            self.regime_counts = tuple(_nonneg(rc.get(n), f"regime.counts.{n}") for n in names)
        else:  # new weights, batch or sources: measured from here
            self.regime_step = step
            self.regime_counts = tuple(counts)


def _weights_json(s: WeightSchedule) -> dict[str, Any]:
    """The schedule as exact, comparable JSON values (fractions as strings)."""
    return {
        "names": list(s.names),
        "linear": s.linear,
        "points": [[step, [str(w) for w in ws]] for step, ws in s.points],
    }


def _nonneg(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise StateError(f"mixture state field {name!r} must be an int >= 0, got {value!r}")
    return value
