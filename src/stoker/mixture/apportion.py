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

from collections.abc import Iterator, Sequence

import numpy as np


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
    for _ in _give(c, weights, samples):
        pass
    return c


def _give(c: list[int], weights: Sequence[int], samples: int) -> Iterator[list[int]]:
    """Give ``samples`` more samples to the counts ``c`` (in place), one at a time by the
    quota method, yielding ``c`` after each."""
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
        yield c


class Quota:
    """The quota method's counts under fixed integer ``weights`` from zero counts, after
    any number of samples, without giving them out one by one.

    The method is periodic: after ``W = sum(weights)`` samples every count is exactly its
    weight (its quota is then an integer), and from counts ``m x weights`` it chooses as
    it did from zero (both its tests, the upper quota ``c_i W < w_i n`` and the divisor
    comparison ``w_j (c_i + 1) > w_i (c_j + 1)``, are unchanged by adding ``m w`` to the
    counts and ``m W`` to ``n``). So the counts after ``n`` samples are ``n // W``
    periods plus those after ``n % W``: a table of one period's prefix counts (when
    ``W`` is at most :attr:`TABLE_MAX`) or, above it, at most ``W`` samples given out."""

    #: Largest period kept as a table of prefix counts ((W + 1) x sources integers).
    TABLE_MAX = 1 << 16

    def __init__(self, weights: Sequence[int]) -> None:
        quota([0] * len(weights), weights, 0)  # (checks the weights)
        self.weights = tuple(int(w) for w in weights)
        self.total = sum(self.weights)
        self._w = np.asarray(self.weights, dtype=np.int64)
        # made on first use: a ramp's weights change every step, and a step gives out far
        # fewer samples than the period of most of them
        self._table: np.ndarray | None = None

    @property
    def tabled(self) -> bool:
        """Whether counts come from a table (else from up to a period's samples)."""
        return self.total <= self.TABLE_MAX

    @property
    def built(self) -> bool:
        """Whether the table is made already (then counts cost nothing more)."""
        return self._table is not None

    def _tab(self) -> np.ndarray | None:
        if self._table is None and self.tabled:
            rows = [[0] * len(self.weights)]
            rows.extend(list(c) for c in _give([0] * len(self.weights), self.weights, self.total))
            self._table = np.asarray(rows, dtype=np.int64)
        return self._table

    def counts(self, n: int) -> list[int]:
        """The counts after ``n`` samples from zero."""
        m, r = divmod(int(n), self.total)
        table = self._tab()
        if table is not None:
            return [int(x) for x in m * self._w + table[r]]
        return quota([m * w for w in self.weights], self.weights, r)

    def counts_at(self, n: np.ndarray) -> np.ndarray:
        """:meth:`counts` of an array of sample counts, shape ``(len(n), sources)``, from
        the table (:attr:`tabled` only)."""
        table = self._tab()
        if table is None:
            raise ValueError(f"no table for a period of {self.total} samples")
        m, r = np.divmod(np.asarray(n, dtype=np.int64), self.total)
        out: np.ndarray = m[:, None] * self._w + table[r]
        return out


def quota_rows(weights: np.ndarray, samples: int) -> np.ndarray:
    """:func:`quota` from zero counts, for every row of ``weights`` (integers, shape
    ``(rows, sources)``, each row summing to more than zero) at once: the counts after
    ``samples`` samples, shape ``(rows, sources)``. What a linear ramp's steps take (each
    step's weights are its own, and each step starts from zero): the samples are still
    given out one at a time, but for all the rows in one array operation each. Every
    product stays below 2^63 while ``row total x (samples + 1)`` does (else ValueError)."""
    w = np.asarray(weights, dtype=np.int64)
    if w.ndim != 2 or not w.shape[1]:
        raise ValueError(f"weights must be (rows, sources), got shape {w.shape}")
    if (w < 0).any() or (w.sum(axis=1) <= 0).any():
        raise ValueError("weights must be >= 0 and not all 0 in a row")
    total = w.sum(axis=1)
    if w.size and int(total.max()) >= (1 << 62) // (samples + 1):
        raise ValueError(f"weights of total {int(total.max())} overflow at {samples} samples")
    rows, k = w.shape
    c = np.zeros((rows, k), dtype=np.int64)
    at = np.arange(rows)
    positive = w > 0
    scaled = total[:, None]
    for n in range(1, samples + 1):
        # under its upper quota for sample n, and w / (c + 1) largest (ties: lower index)
        eligible = positive & (c * scaled < w * n)
        best = np.where(eligible[:, 0], 0, -1)
        bw, bc = w[:, 0].copy(), c[:, 0] + 1
        for i in range(1, k):
            wi, ci = w[:, i], c[:, i] + 1
            better = eligible[:, i] & ((best < 0) | (wi * bc > bw * ci))
            best = np.where(better, i, best)
            bw = np.where(better, wi, bw)
            bc = np.where(better, ci, bc)
        if (best < 0).any():  # cannot happen: some source is under its upper quota
            raise AssertionError("no source under its quota")
        c[at, best] += 1
    return c
