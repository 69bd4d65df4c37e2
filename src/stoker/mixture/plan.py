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
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np

from stoker.errors import StateError
from stoker.mixture.apportion import Quota, quota, quota_rows
from stoker.mixture.deal import EpochSamples, Item, Segment, deal, rank_batch, segments
from stoker.mixture.schedule import WeightSchedule

STATE_VERSION = 1
#: Steps of a linear ramp planned in one array operation at most (each row a step).
_RAMP_ROWS = 4096


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
        self._quotas: dict[tuple[int, ...], Quota] = {}

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
        self._stretch(1)
        new = self._counts_after(1)
        taken = tuple(n - c for n, c in zip(new, self.counts, strict=True))
        segs, self.epochs = segments(self.epochs, taken, self.epoch_samples)
        dealt = tuple(deal(done, n, self.world) for _, _, done, n in segs)
        out = Step(self.step, taken, tuple(segs), dealt, self.batch_size)
        self.step += 1
        self.counts = new
        return out

    def quota_of(self, step: int) -> Quota:
        """The quota method of ``step``'s weights (as integers in proportion), kept."""
        weights = self.schedule.at(step)
        scale = math.lcm(*(w.denominator for w in weights))
        key = tuple(int(w * scale) for w in weights)
        q = self._quotas.get(key)
        if q is None:
            if len(self._quotas) > 64:  # (a ramp: new weights every step)
                self._quotas.clear()
            q = self._quotas[key] = Quota(key)
        return q

    def _counts_after(self, steps: int) -> tuple[int, ...]:
        """Every source's count after ``steps`` more steps of the current regime's
        weights (the regime's counts at its start, plus the quota method's from zero)."""
        q = self.quota_of(self.step)
        rel = [c - c0 for c, c0 in zip(self.counts, self.regime_counts, strict=True)]
        n = sum(rel)
        # (the table, or a period's samples, once a stretch gives out a period or more)
        if q.built or steps * self.global_batch >= q.total:
            rel = q.counts(n + steps * self.global_batch)
        else:  # a few samples on from where the regime stands
            rel = quota(rel, q.weights, steps * self.global_batch)
        return tuple(c0 + r for c0, r in zip(self.regime_counts, rel, strict=True))

    def skip_to(self, step: int) -> None:
        """Move to ``step`` without planning the steps between: their counts and the
        sources' epochs only, a stretch of constant weights at a time (the quota method
        gives out samples one by one, so a stretch at once is what its steps would have
        given), a linear ramp a step at a time."""
        while self.step < step:
            ramp = self._ramp(min(step - self.step, _RAMP_ROWS))
            if ramp:
                taken = self._ramp_taken(ramp)
                _, self.epochs = segments(
                    self.epochs, taken.sum(axis=0).tolist(), self.epoch_samples
                )
                self._ramp_moved(taken)
                continue
            n = self._stretch(step - self.step)
            new = self._counts_after(n)
            moved = [a - b for a, b in zip(new, self.counts, strict=True)]
            _, self.epochs = segments(self.epochs, moved, self.epoch_samples)
            self.counts = new
            self.step += n

    def _ramp(self, most: int) -> int:
        """How many of the next ``most`` steps lie on a linear ramp, from this one (0: this
        step is not on one), when the ramp's weights as integers over one denominator
        cannot overflow the quota method's products (else 0: a step at a time)."""
        s = self.schedule
        i = s.segment(self.step)
        if not s.linear or i + 1 >= len(s.points) or most < 1:
            return 0
        if self._ramp_scale(i)[2] >= (1 << 62) // (self.global_batch + 1):
            return 0
        return min(most, s.points[i + 1][0] - self.step)

    def _ramp_scale(self, i: int) -> tuple[list[int], list[int], int]:
        """The weights of ramp ``i``'s two ends over one denominator ``D``, as integers,
        and the total of every step's weights over ``D x length`` (see :meth:`_ramp_taken`)."""
        (s0, w0), (s1, w1) = self.schedule.points[i], self.schedule.points[i + 1]
        d = math.lcm(*(w.denominator for w in (*w0, *w1)))
        return [int(w * d) for w in w0], [int(w * d) for w in w1], d * (s1 - s0)

    def _ramp_taken(self, m: int) -> np.ndarray:
        """The samples per source of the next ``m`` steps of a linear ramp, shape ``(m,
        sources)``. A ramp's step is a stretch of its own (its own weights, given out from
        zero), so its weights at step ``s`` over the denominator ``D x length`` are the
        integers ``a x length + (b - a) x (s - s0)``: every step of the ramp at once."""
        s = self.schedule
        i = s.segment(self.step)
        a, b, _ = self._ramp_scale(i)
        s0, s1 = s.points[i][0], s.points[i + 1][0]
        lo = np.asarray(a, dtype=np.int64) * (s1 - s0)
        slope = np.asarray(b, dtype=np.int64) - np.asarray(a, dtype=np.int64)
        t = np.arange(self.step - s0, self.step - s0 + m, dtype=np.int64)
        return quota_rows(lo + slope * t[:, None], self.global_batch)

    def _ramp_moved(self, taken: np.ndarray) -> None:
        """Move past the ramp steps whose samples are ``taken``: the counts, and the
        stretch its last step began (what planning them one by one leaves)."""
        before = np.asarray(self.counts, dtype=np.int64) + taken[:-1].sum(axis=0)
        self.regime_step = self.step + len(taken) - 1
        self.regime_counts = tuple(int(x) for x in before)
        self.counts = tuple(int(x) for x in before + taken[-1])
        self.step += len(taken)

    def take(self, steps: int, ranks: Sequence[int]) -> dict[int, np.ndarray]:
        """Plan the next ``steps`` steps and move past them: each of ``ranks``' items
        (:meth:`Step.rank_items`'s rows) as an int64 array of shape ``(steps, batch_size,
        4)``, what :meth:`next` would give step by step, in a few array operations a
        stretch of constant weights (:meth:`_take_stretch`)."""
        B = self.batch_size
        out = {r: np.empty((steps, B, 4), dtype=np.int64) for r in ranks}
        done = 0
        # (a stretch's arrays: steps x 2 slots a source x world, a million entries at most)
        cap = max(1, (1 << 20) // (2 * len(self.counts) * self.world))
        while done < steps:
            ramp = self._ramp(min(steps - done, cap))
            m = ramp or self._stretch(min(steps - done, cap))
            got = self._take_stretch(m, ranks, self._ramp_taken(m) if ramp else None)
            if got is None:  # a step can run through more than two epochs of a source
                for j in range(m):
                    s = self.next()
                    for r in ranks:
                        out[r][done + j] = np.asarray(s.rank_items(r), dtype=np.int64).reshape(B, 4)
            else:
                for r in ranks:
                    out[r][done : done + m] = got[r]
            done += m
        return out

    def _stretch(self, most: int) -> int:
        """Start a regime at this step if a stretch of constant weights begins here, and
        say how many of the next ``most`` (>= 1) steps it holds (one on a ramp)."""
        start = self._constant_since(self.step)
        if start > self.regime_step:  # a new stretch of weights begins at this step
            self.regime_step, self.regime_counts = self.step, self.counts
        points = self.schedule.points
        i = self.schedule.segment(self.step)
        if self.schedule.linear and i + 1 < len(points):
            return 1
        end = points[i + 1][0] - self.step if i + 1 < len(points) else most
        return min(most, end)

    def _take_stretch(
        self, m: int, ranks: Sequence[int], ramp: np.ndarray | None = None
    ) -> dict[int, np.ndarray] | None:
        """:meth:`take` of ``m`` steps of one regime (or of a linear ramp, whose steps'
        samples per source are ``ramp``), or None (nothing moved) when a source's epoch
        deals fewer samples than a global batch (a step may then run through more than
        two of its epochs: :meth:`next` plans those)."""
        G, W, B, k = self.global_batch, self.world, self.batch_size, len(self.counts)
        sizes = []
        for i, (e0, _) in enumerate(self.epochs):
            size0, S = self.epoch_samples(i, e0), self.epoch_samples(i, e0 + 1)
            if S < G or self.epoch_samples(i, e0 + 2) != S or size0 < 1:
                return None
            sizes.append((size0, S))
        if ramp is not None:
            taken = ramp
        else:
            q = self.quota_of(self.step)
            n0 = sum(self.counts) - sum(self.regime_counts)
            if q.tabled and (q.built or m * G >= q.total):
                rel = q.counts_at(n0 + G * np.arange(m + 1, dtype=np.int64))
            else:  # a step at a time from where the regime stands
                rows = [[c - c0 for c, c0 in zip(self.counts, self.regime_counts, strict=True)]]
                for _ in range(m):
                    rows.append(quota(rows[-1], q.weights, G))
                rel = np.asarray(rows, dtype=np.int64)
            taken = np.diff(rel, axis=0)  # (m, k): each step's samples per source
        before = np.cumsum(taken, axis=0) - taken
        # each source's samples of a step: a range of its current epoch (slot 2i) and,
        # when that runs out in the step, one of its next (slot 2i + 1)
        a = np.zeros((m, 2 * k), dtype=np.int64)
        b = np.zeros((m, 2 * k), dtype=np.int64)
        ep = np.zeros((m, 2 * k), dtype=np.int64)
        after: list[tuple[int, int]] = []
        for i, ((e0, d0), (size0, S)) in enumerate(zip(self.epochs, sizes, strict=True)):
            x0, t = d0 + before[:, i], taken[:, i]
            e, k0, cap = _place(x0, e0, size0, S)
            end = np.minimum(k0 + t, cap)
            a[:, 2 * i], b[:, 2 * i], ep[:, 2 * i] = k0, end, e
            b[:, 2 * i + 1], ep[:, 2 * i + 1] = k0 + t - end, e + 1
            xe = d0 + int(taken[:, i].sum())
            e_end, k_end, _ = _place(np.asarray([xe]), e0, size0, S)
            after.append((int(e_end[0]), int(k_end[0])))
        # the deal: sample k of an epoch to rank k % W as its local sample k // W
        r_all = np.arange(W, dtype=np.int64)
        lo = (a[:, :, None] - r_all + W - 1) // W  # (m, 2k, W)
        cnt = (b[:, :, None] - r_all + W - 1) // W - lo
        n = cnt.sum(axis=1)  # (m, W): each rank's dealt samples
        over, under = np.maximum(n - B, 0), np.maximum(B - n, 0)
        cum_over = np.cumsum(over, axis=1)
        cum_cnt = np.cumsum(cnt, axis=1)
        src = np.repeat(np.arange(k, dtype=np.int64), 2)
        out: dict[int, np.ndarray] = {}
        for r in ranks:
            items = np.empty((m, B, 4), dtype=np.int64)
            c = cnt[:, :, r]
            own = np.clip(B - (cum_cnt[:, :, r] - c), 0, c)  # (m, 2k): kept of each slot
            per = own.ravel()
            cell = np.repeat(np.arange(m * 2 * k), per)  # each own item's (step, slot)
            first = np.cumsum(per) - per
            within = np.arange(len(cell)) - first[cell]
            j, sl = np.divmod(cell, 2 * k)
            kept = own.sum(axis=1)
            pos = np.arange(len(cell)) - (np.cumsum(kept) - kept)[j]
            items[j, pos] = np.stack(
                [
                    src[sl],
                    ep.ravel()[cell],
                    np.full(len(cell), r),
                    lo[:, :, r].ravel()[cell] + within,
                ],
                axis=1,
            )
            need = under[:, r]
            if need.any():  # the surplus of the ranks over their batch, in rank order
                off = under[:, :r].sum(axis=1)
                pj = np.repeat(np.arange(m), need)
                pq = np.arange(len(pj)) - np.repeat(np.cumsum(need) - need, need)
                p = off[pj] + pq  # place in the step's surplus list
                span = G + 1
                flat = (cum_over + span * np.arange(m)[:, None]).ravel()
                owner = np.searchsorted(flat, p + span * pj, side="right") - W * pj
                idx = B + p - (cum_over[pj, owner] - over[pj, owner])  # in the owner's list
                cc = cum_cnt[pj, :, owner]  # (picks, 2k)
                slot = (cc <= idx[:, None]).sum(axis=1)
                start = cc[np.arange(len(pj)), slot] - cnt[pj, slot, owner]
                items[pj, kept[pj] + pq] = np.stack(
                    [src[slot], ep[pj, slot], owner, lo[pj, slot, owner] + idx - start], axis=1
                )
            out[r] = items
        self.epochs = after
        if ramp is not None:
            self._ramp_moved(ramp)
            return out
        self.counts = tuple(int(c0 + x) for c0, x in zip(self.regime_counts, rel[-1], strict=True))
        self.step += m
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
                "weights": weights_json(self.schedule),
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
            and regime.get("weights") == weights_json(self.schedule)
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
                or [c - c0 for c, c0 in zip(counts, regime_counts, strict=True)]
                != self.quota_of(regime_step).counts(grown)
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


def _place(x: np.ndarray, e0: int, size0: int, S: int) -> tuple[np.ndarray, ...]:
    """Offsets ``x`` into a source's samples from the start of its epoch ``e0`` (of
    ``size0`` samples; those after it of ``S``) as (epoch, offset in it, its size)."""
    past = x >= size0
    y = np.maximum(x - size0, 0)
    return (
        np.where(past, e0 + 1 + y // S, e0),
        np.where(past, y % S, x),
        np.where(past, S, size0),
    )


def weights_json(s: WeightSchedule) -> dict[str, Any]:
    """The schedule as exact, comparable JSON values (fractions as strings)."""
    return {
        "names": list(s.names),
        "linear": s.linear,
        "points": [[step, [str(w) for w in ws]] for step, ws in s.points],
    }


def schedule_of(value: dict[str, Any]) -> WeightSchedule:
    """The schedule :func:`weights_json` wrote."""
    points = tuple((int(step), tuple(Fraction(w) for w in ws)) for step, ws in value["points"])
    return WeightSchedule(tuple(value["names"]), points, bool(value["linear"]))


def _nonneg(value: Any, name: str, limit: int = 1 << 62) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < limit:
        raise StateError(
            f"mixture state field {name!r} must be an int in [0, {limit}), got {value!r}"
        )
    return value
