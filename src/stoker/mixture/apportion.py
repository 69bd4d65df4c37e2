"""How many samples of each source a mixture's steps take (pure).

The cumulative counts ``C_i`` after a step follow the cumulative targets ``T_i``
(the step's sample count times the schedule's summed weights, exact fractions):
:func:`advance` raises every count to at least its target's floor and gives the
samples left to the sources furthest below their targets, one each. Counts never
go down, they sum to the targets' sum, and each stays within one sample of its
target at every step boundary (|C_i - T_i| < 1; held by property tests over random
weights, schedules and step sizes), so the realised share over the run so far is
off by less than one sample per source.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from fractions import Fraction


def advance(counts: Sequence[int], targets: Sequence[Fraction]) -> tuple[int, ...]:
    """The cumulative counts after a step, from those before it (``counts``) and the
    cumulative targets after it (``targets``, summing to a whole number of samples
    no smaller than ``sum(counts)``)."""
    if len(counts) != len(targets) or not counts:
        raise ValueError("counts and targets must name the same, at least one, sources")
    total = sum(targets, Fraction(0))
    if total.denominator != 1:
        raise ValueError(f"the targets must sum to a whole number of samples, got {total}")
    if total < sum(counts):
        raise ValueError(f"the targets sum to {total}, fewer than the {sum(counts)} taken")
    out = [max(int(c), math.floor(t)) for c, t in zip(counts, targets, strict=True)]
    left = int(total) - sum(out)
    while left > 0:  # furthest below target first; ties to the lower index
        i = max(range(len(out)), key=lambda j: (targets[j] - out[j], -j))
        out[i] += 1
        left -= 1
    while left < 0:  # counts held up by what was already taken: lower the most ahead
        i = min(
            (j for j in range(len(out)) if out[j] > counts[j]),
            key=lambda j: (targets[j] - out[j], j),
        )
        out[i] -= 1
        left += 1
    return tuple(out)
