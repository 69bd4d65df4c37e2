"""How many samples of each source a mixture's steps take (pure).

Under constant weights the samples go out one at a time by the *quota method* of
Balinski and Young (1975): the next sample goes to the source whose count ``c_i``
has the largest ``w_i / (c_i + 1)`` among those still under their upper quota
(``c_i < w_i (n + 1)`` for the ``n + 1``-th sample). Their theorem: every count
stays within one sample of its share at every sample, ``floor(w_i n) <= c_i <=
ceil(w_i n)``, and counts never go down as samples are added, for any number of
sources and any weights. :func:`quota` adds a step's samples to the counts of a
stretch of constant weights (integers, in proportion), exactly, in integer
arithmetic.
"""

from __future__ import annotations

from collections.abc import Sequence


def quota(counts: Sequence[int], weights: Sequence[int], samples: int) -> list[int]:
    """``counts`` (the samples each source has had under ``weights``, which sum to more
    than zero) after ``samples`` more, given out by the quota method."""
    if len(counts) != len(weights) or not counts:
        raise ValueError("counts and weights must name the same, at least one, sources")
    if any(w < 0 for w in weights) or sum(weights) <= 0:
        raise ValueError(f"weights must be >= 0 and not all 0, got {list(weights)}")
    if samples < 0:
        raise ValueError(f"samples must be >= 0, got {samples}")
    c = [int(x) for x in counts]
    total = sum(weights)
    n = sum(c)
    k = len(c)
    for _ in range(samples):
        n += 1
        best = -1
        for i in range(k):
            w = weights[i]
            # under its upper quota for sample n, and w / (c + 1) largest (ties: lower index)
            eligible = w and c[i] * total < w * n
            if eligible and (best < 0 or w * (c[best] + 1) > weights[best] * (c[i] + 1)):
                best = i
        if best < 0:  # cannot happen: some source is under its upper quota
            raise AssertionError("no source under its quota")
        c[best] += 1
    return c
