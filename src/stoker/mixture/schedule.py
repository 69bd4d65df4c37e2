"""The weights of a mixture's sources over the steps of a run (pure).

A :class:`WeightSchedule` gives every global step (a global batch) a weight per
source, normalised to sum to one: constant, piecewise constant between given
steps, or linear between them (a ramp), constant after the last. Weights are kept
as exact fractions, so that every machine, rank and resume computes the same
targets: :meth:`WeightSchedule.total` is the exact sum of the weights over a range
of steps in O(number of points), whatever the range, which is what the mixture's
cumulative targets (``batch size x total``) are made of.

A float weight is the decimal it prints as (``0.3`` is 3/10, not the binary fraction
nearest it), so that the usual weights have a small common denominator: the quota
method repeats itself every that many samples (:class:`~stoker.mixture.apportion.Quota`),
which is what lets a plan jump to any step in constant time. Weights whose normalised
fractions need a common denominator above :data:`DENOMINATOR` are rounded to
multiples of ``1 / DENOMINATOR`` (largest remainders; within one millionth).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction

from stoker.errors import ConfigError

Weights = Mapping[str, float]

#: The largest common denominator of a point's weights kept exactly (else rounded to it).
DENOMINATOR = 1 << 20


def _normalised(names: tuple[str, ...], weights: Weights, where: str) -> tuple[Fraction, ...]:
    unknown = sorted(set(weights) - set(names))
    missing = [n for n in names if n not in weights]
    if unknown or missing:
        raise ConfigError(
            f"{where}: weights must name every source ({', '.join(names)}); "
            + (f"unknown: {', '.join(unknown)}" if unknown else f"missing: {', '.join(missing)}")
        )
    values: list[Fraction] = []
    for n in names:
        w = weights[n]
        if isinstance(w, bool) or not isinstance(w, numbers.Real):
            raise ConfigError(f"{where}: the weight of {n!r} must be a number, got {w!r}")
        if not math.isfinite(w) or w < 0:
            raise ConfigError(f"{where}: the weight of {n!r} must be finite and >= 0, got {w!r}")
        values.append(Fraction(w) if isinstance(w, numbers.Rational) else Fraction(repr(float(w))))
    total = sum(values, Fraction(0))
    if total == 0:
        raise ConfigError(f"{where}: the weights sum to 0; at least one source needs weight")
    exact = tuple(v / total for v in values)
    if math.lcm(*(v.denominator for v in exact)) <= DENOMINATOR:
        return exact
    return _rounded(exact, DENOMINATOR)


def _rounded(weights: tuple[Fraction, ...], d: int) -> tuple[Fraction, ...]:
    """``weights`` (summing to one) as multiples of ``1 / d`` summing to one: each its
    floor, the units left to the largest remainders (ties: the lower index)."""
    scaled = [w * d for w in weights]
    units = [math.floor(x) for x in scaled]
    order = sorted(range(len(units)), key=lambda i: (units[i] - scaled[i], i))
    for i in order[: d - sum(units)]:
        units[i] += 1
    return tuple(Fraction(u, d) for u in units)


@dataclass(frozen=True)
class WeightSchedule:
    """Per-source weights by step: ``points`` are ``(step, weights)`` with ascending
    steps, the first at 0; ``linear`` interpolates between points (else each point's
    weights hold until the next). After the last point its weights hold for ever."""

    names: tuple[str, ...]
    points: tuple[tuple[int, tuple[Fraction, ...]], ...]
    linear: bool = False

    @classmethod
    def constant(cls, weights: Weights) -> WeightSchedule:
        names = tuple(weights)
        return cls(names, ((0, _normalised(names, weights, "weights")),))

    @classmethod
    def of(
        cls,
        points: Sequence[tuple[int, Weights]],
        *,
        linear: bool = False,
        names: Sequence[str] | None = None,
    ) -> WeightSchedule:
        """A schedule from ``[(step, {source: weight}), ...]`` (steps ascending, the first
        0); ``names`` fixes the sources' order (default: the first point's)."""
        if not points:
            raise ConfigError("a weight schedule needs at least one (step, weights) point")
        order = tuple(names) if names is not None else tuple(points[0][1])
        if len(set(order)) != len(order) or not order:
            raise ConfigError(f"a mixture needs distinct source names, got {list(order)}")
        out: list[tuple[int, tuple[Fraction, ...]]] = []
        for i, point in enumerate(points):
            if not (isinstance(point, (tuple, list)) and len(point) == 2):
                raise ConfigError(f"schedule point {i} must be (step, weights), got {point!r}")
            step, weights = point
            if isinstance(step, bool) or not isinstance(step, int) or step < 0:
                raise ConfigError(f"schedule point {i}: the step must be an int >= 0, got {step!r}")
            if i == 0 and step != 0:
                raise ConfigError(f"the first schedule point must be at step 0, got {step}")
            if out and step <= out[-1][0]:
                raise ConfigError(
                    f"schedule point {i}: steps must increase, got {step} after {out[-1][0]}"
                )
            out.append((step, _normalised(order, weights, f"schedule point {i} (step {step})")))
        return cls(order, tuple(out), linear)

    def reordered(self, names: Sequence[str]) -> WeightSchedule:
        """The same schedule with its sources in the order of ``names`` (the same names)."""
        if sorted(names) != sorted(self.names):
            raise ConfigError(f"the schedule names {list(self.names)}, not {list(names)}")
        where = [self.names.index(n) for n in names]
        points = tuple((step, tuple(ws[i] for i in where)) for step, ws in self.points)
        return WeightSchedule(tuple(names), points, self.linear)

    def at(self, step: int) -> tuple[Fraction, ...]:
        """The weights of global step ``step``."""
        i = self.segment(step)
        s0, w0 = self.points[i]
        if not self.linear or i + 1 == len(self.points):
            return w0
        s1, w1 = self.points[i + 1]
        t = Fraction(step - s0, s1 - s0)
        return tuple(a + (b - a) * t for a, b in zip(w0, w1, strict=True))

    def total(self, start: int, stop: int) -> tuple[Fraction, ...]:
        """The sum of :meth:`at` over steps ``start <= s < stop``, exactly, per source."""
        if stop < start:
            raise ValueError(f"stop {stop} < start {start}")
        acc = [Fraction(0)] * len(self.names)
        i = self.segment(start) if stop > start else len(self.points)
        lo = start
        while lo < stop:
            s0, w0 = self.points[i]
            end = self.points[i + 1][0] if i + 1 < len(self.points) else stop
            hi = min(stop, end)
            n = hi - lo
            if not self.linear or i + 1 == len(self.points):
                for j, w in enumerate(w0):
                    acc[j] += w * n
            else:
                s1, w1 = self.points[i + 1]
                # sum over s in [lo, hi) of (s - s0): an arithmetic series
                offsets = Fraction((lo - s0 + hi - 1 - s0) * n, 2)
                for j, (a, b) in enumerate(zip(w0, w1, strict=True)):
                    acc[j] += a * n + (b - a) * offsets / (s1 - s0)
            lo = hi
            i += 1
        return tuple(acc)

    def segment(self, step: int) -> int:
        """The index of the point whose segment holds ``step``."""
        if step < 0:
            raise ValueError(f"step must be >= 0, got {step}")
        lo, hi = 0, len(self.points) - 1
        while lo < hi:  # the last point at or before step
            mid = (lo + hi + 1) // 2
            if self.points[mid][0] <= step:
                lo = mid
            else:
                hi = mid - 1
        return lo
