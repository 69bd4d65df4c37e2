"""A mixture's plan, step by step, and its state (pure).

:class:`MixPlan` walks the global steps of a mixture: for each it gives the step's
samples to the sources (:func:`~stoker.mixture.apportion.quota`), runs each source
through its own epochs (:func:`~stoker.mixture.deal.segments`) and
shares the step among the ranks (:func:`~stoker.mixture.deal.deal`,
:func:`~stoker.mixture.deal.rank_batch`).

Samples go out by the quota method (:func:`~stoker.mixture.apportion.quota`)
within a *regime*: a stretch of steps under constant weights and batch size,
from its first step and the counts there. A regime begins at the run's start, at
each point of a piecewise-constant schedule, at every step of a linear ramp (its
weights change each step), and at a restore that changed the weights, the batch
size or the sources. Within a regime each source's count stays within one sample
of ``counts at its start + weight x samples since``, at every step (Balinski and
Young's theorem); each new regime measures from where every source stood. The
state is the step, every source's count and ``(epoch, taken of it)``, and the
regime's start: a few integers per source, whatever the position, and nothing to
replay. A restore with the same sources, weights and batch continues exactly.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np

from stoker.errors import StateError
from stoker.mixture.apportion import quota
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
        """Each source's cumulative target after ``step`` (the current regime's)."""
        w = self.schedule.at(max(step, self.regime_step))
        n = self.global_batch * (step + 1 - self.regime_step)
        return [c + n * x for c, x in zip(self.regime_counts, w, strict=True)]

    def _constant_since(self, step: int) -> int:
        """The first step of the schedule's stretch of constant weights that holds
        ``step``."""
        points = self.schedule.points
        i = self.schedule.segment(step)
        if self.schedule.linear and i + 1 < len(points):
            return step  # a ramp: new weights every step
        return points[i][0]

    def next(self) -> Step:
        """Plan the next step and move past it."""
        start = self._constant_since(self.step)
        if start > self.regime_step:  # a new stretch of weights begins at this step
            self.regime_step, self.regime_counts = self.step, self.counts
        weights = self.schedule.at(self.step)
        scale = math.lcm(*(w.denominator for w in weights))
        rel = [c - c0 for c, c0 in zip(self.counts, self.regime_counts, strict=True)]
        rel = quota(rel, [int(w * scale) for w in weights], self.global_batch)
        new = tuple(c0 + r for c0, r in zip(self.regime_counts, rel, strict=True))
        taken = tuple(n - c for n, c in zip(new, self.counts, strict=True))
        segs, self.epochs = segments(self.epochs, taken, self.epoch_samples)
        dealt = tuple(deal(done, n, self.world) for _, _, done, n in segs)
        out = Step(self.step, taken, tuple(segs), dealt, self.batch_size)
        self.step += 1
        self.counts = new
        return out

    def skip_to(self, step: int) -> None:
        """Move to ``step`` without planning the steps between: their counts and the
        sources' epochs only, a stretch of constant weights at a time (the quota method
        gives out samples one by one, so a stretch at once is what its steps would have
        given), a linear ramp a step at a time."""
        while self.step < step:
            start = self._constant_since(self.step)
            if start > self.regime_step:  # a new stretch of weights begins at this step
                self.regime_step, self.regime_counts = self.step, self.counts
            i = self.schedule.segment(self.step)
            points = self.schedule.points
            end = points[i + 1][0] if i + 1 < len(points) else step
            if self.schedule.linear and i + 1 < len(points):
                end = self.step + 1
            n = min(step, end) - self.step
            weights = self.schedule.at(self.step)
            scale = math.lcm(*(w.denominator for w in weights))
            rel = [c - c0 for c, c0 in zip(self.counts, self.regime_counts, strict=True)]
            rel = quota(rel, [int(w * scale) for w in weights], self.global_batch * n)
            new = tuple(c0 + r for c0, r in zip(self.regime_counts, rel, strict=True))
            taken = [a - b for a, b in zip(new, self.counts, strict=True)]
            _, self.epochs = segments(self.epochs, taken, self.epoch_samples)
            self.counts = new
            self.step += n

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

    def load_state_dict(self, state: dict[str, Any], *, regrouped: bool = False) -> bool:
        """Continue from ``state``: exactly when it was saved with this plan's sources,
        weights, batch size and world; otherwise (weights changed, a source added or
        removed) from its step and counts under a new regime. Raises
        :class:`~stoker.errors.StateError` for a state that is not a mixture's, or one
        saved with another world size unless ``regrouped`` (the caller then split each
        source's epoch again and gives the state's ``taken`` of the new split; the
        regime starts afresh). Returns whether it continues exactly (no new regime)."""
        if not isinstance(state, dict) or state.get("mixture_state") != STATE_VERSION:
            raise StateError(
                f"not a mixture state of version {STATE_VERSION}: "
                f"{state.get('mixture_state') if isinstance(state, dict) else state!r}"
            )
        step = _nonneg(state.get("step"), "step")
        sources, regime = state.get("sources"), state.get("regime")
        if not isinstance(sources, dict) or not isinstance(regime, dict):
            raise StateError("mixture state fields 'sources' and 'regime' must be objects")
        world = _nonneg(regime.get("world"), "regime.world")
        batch = _nonneg(regime.get("batch_size"), "regime.batch_size")
        if world != self.world and not regrouped:
            raise StateError(f"mixture state saved with world {world}, this plan has {self.world}")
        names = self.schedule.names
        counts, epochs = [], []
        for i, n in enumerate(names):
            if n not in sources:  # a source added at this restore starts at its beginning
                counts.append(0)
                epochs.append((0, 0))
                continue
            src = sources[n]
            if not isinstance(src, dict):
                raise StateError(f"mixture state field 'sources.{n}' must be an object")
            # (its positions, epoch x its samples, stay inside int64)
            most = (1 << 62) // max(1, self.epoch_samples(i, 0))
            epoch = _nonneg(src.get("epoch"), f"sources.{n}.epoch", most)
            taken = _nonneg(src.get("taken"), f"sources.{n}.taken")
            if taken >= self.epoch_samples(i, epoch):
                raise StateError(
                    f"mixture state field 'sources.{n}.taken' is {taken}, but its epoch "
                    f"{epoch} deals {self.epoch_samples(i, epoch)} samples"
                )
            counts.append(_nonneg(src.get("count"), f"sources.{n}.count"))
            epochs.append((epoch, taken))
        same = (
            not regrouped
            and set(sources) == set(names)
            and batch == self.batch_size
            and regime.get("weights") == _weights_json(self.schedule)
        )
        if same:
            rc = regime.get("counts")
            if not isinstance(rc, dict):
                raise StateError("mixture state field 'regime.counts' must be an object")
            regime_step = _nonneg(regime.get("step"), "regime.step")
            regime_counts = tuple(_nonneg(rc.get(n), f"regime.counts.{n}") for n in names)
            grown = self.global_batch * (step - regime_step)
            if (
                regime_step > step
                or sum(counts) - sum(regime_counts) != grown
                or any(c < c0 for c, c0 in zip(counts, regime_counts, strict=True))
            ):
                raise StateError(
                    f"mixture state: counts {counts} at step {step} do not follow from its "
                    f"regime (counts {list(regime_counts)} at step {regime_step}, "
                    f"{self.global_batch} samples a step)"
                )
        self.step = step
        self.counts = tuple(counts)
        self.epochs = epochs
        if same:
            self.regime_step, self.regime_counts = regime_step, regime_counts
        else:  # new weights, batch or sources: measured from here
            self.regime_step = step
            self.regime_counts = tuple(counts)
        return same


def _weights_json(s: WeightSchedule) -> dict[str, Any]:
    """The schedule as exact, comparable JSON values (fractions as strings)."""
    return {
        "names": list(s.names),
        "linear": s.linear,
        "points": [[step, [str(w) for w in ws]] for step, ws in s.points],
    }


def _nonneg(value: Any, name: str, limit: int = 1 << 62) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < limit:
        raise StateError(
            f"mixture state field {name!r} must be an int in [0, {limit}), got {value!r}"
        )
    return value
