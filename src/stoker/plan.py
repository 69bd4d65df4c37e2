"""Epoch plans: which samples, in which order, on which rank and worker (pure).

Vocabulary
----------
sample
    Window of ``seq_len + 1`` tokens starting at token ``sample * seq_len``;
    ``num_samples = (num_tokens - 1) // seq_len``.
virtual shard
    ``shard_size`` consecutive samples; shard size is a read-time choice.
data epoch ``e``
    A permutation of all samples: shards are permuted, consecutive groups of
    ``window_shards`` permuted shards form a *shuffle window*, and the samples
    of a window are permuted among themselves.
stream position ``p``
    The data epochs laid end to end: position ``p`` is slot ``p % S`` of data
    epoch ``p // S`` (``S = num_samples``).
epoch set
    The stream positions a training epoch delivers, as an interval set.
    Training epoch ``t`` delivers data epoch ``t`` plus what epoch ``t - 1``
    carried over; each rank takes ``n = len(set) // world`` of them and the
    ``len(set) % world`` left over carry into epoch ``t + 1`` (or are dropped
    with ``drop_remainder``). So every rank gets the same number of samples,
    and over the epochs nothing is lost.
split
    Rank ``r`` takes ordered members ``[r * n, (r + 1) * n)`` of the epoch
    set. Within a rank, DataLoader worker ``w`` of ``nw`` takes chunks of
    ``chunk`` consecutive rank-local samples round robin, so a DataLoader
    that collects batches of ``chunk`` samples from workers in turn yields
    the rank's samples in exactly rank order, whatever ``nw`` is.

Everything here is O(1) in the number of samples, except interval sets, which
grow only with topology changes (a few intervals per rank).
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from stoker import intervals
from stoker.errors import ConfigError
from stoker.permutation import Permutation, derive_key

_SHARDS, _WINDOW = 1, 2


@dataclass(frozen=True)
class ShuffleConfig:
    """How an epoch is shuffled. ``shard_size=None`` picks about 1 Mi tokens per shard."""

    seed: int = 0
    shuffle: bool = True
    shard_size: int | None = None
    window_shards: int = 16

    def resolve(self, seq_len: int) -> ShuffleConfig:
        """The same shuffle with the shard size worked out for ``seq_len`` and every
        number a plain int (numpy integers are accepted; a float or a string is not)."""
        shard = (
            operator.index(self.shard_size)
            if self.shard_size is not None
            else max(1, (1 << 20) // seq_len)
        )
        if shard < 1:
            raise ConfigError(f"shard_size must be >= 1, got {shard}")
        if self.window_shards < 1:
            raise ConfigError(f"window_shards must be >= 1, got {self.window_shards}")
        return ShuffleConfig(
            operator.index(self.seed), bool(self.shuffle), shard, operator.index(self.window_shards)
        )


class EpochOrder:
    """Slot ``k`` of data epoch ``epoch`` -> sample id, without tables."""

    def __init__(self, num_samples: int, config: ShuffleConfig, epoch: int) -> None:
        assert config.shard_size is not None, "resolve() the config first"
        self.S = num_samples
        self.ss = config.shard_size
        self.ws = config.window_shards
        self.shuffle = config.shuffle
        self.key = derive_key(config.seed, epoch)
        self.ns = -(-num_samples // self.ss)
        self.tail = num_samples - (self.ns - 1) * self.ss
        self.shards = Permutation(self.ns, derive_key(self.key, _SHARDS))
        # position of the one short shard (if any) in the permuted shard order
        self.q = int(self.shards.inverse(self.ns - 1)) if self.tail < self.ss else self.ns
        self.deficit = self.ss - self.tail
        self.num_windows = -(-self.ns // self.ws)

    def window_start(self, w: np.ndarray) -> np.ndarray:
        """First slot of window ``w`` (``w == num_windows`` gives S)."""
        w = np.asarray(w, dtype=np.int64)
        first = w * self.ws
        start = first * self.ss - np.where(self.q < first, self.deficit, 0)
        return np.minimum(start, self.S)

    def window_of(self, k: np.ndarray) -> np.ndarray:
        k = np.asarray(k, dtype=np.int64)
        w = k // (self.ws * self.ss)
        return np.where(self.window_start(w + 1) <= k, w + 1, w)

    def samples(self, k: np.ndarray) -> np.ndarray:
        """Sample ids at slots ``k`` (an array of ints in ``[0, S)``)."""
        k = np.asarray(k, dtype=np.int64)
        if not self.shuffle:
            return k.copy()
        out = np.empty_like(k)
        windows = self.window_of(k)
        for w in np.unique(windows):
            sel = windows == w
            start, stop = (int(x) for x in self.window_start(np.array([w, w + 1])))
            perm = Permutation(stop - start, derive_key(self.key, _WINDOW, int(w)))
            out[sel] = self._slot_in_window(int(w), perm(k[sel] - start))
        return out

    def _slot_in_window(self, w: int, r: np.ndarray) -> np.ndarray:
        j0 = w * self.ws
        j1 = min(j0 + self.ws, self.ns)
        ss = self.ss
        if j0 <= self.q < j1:
            before = (self.q - j0) * ss
            after = r - before - self.tail
            pos = np.where(
                r < before, j0 + r // ss, np.where(after < 0, self.q, self.q + 1 + after // ss)
            )
            off = np.where(r < before, r % ss, np.where(after < 0, r - before, after % ss))
        else:
            pos, off = j0 + r // ss, r % ss
        return self.shards(pos) * ss + off


class Stream:
    """Stream position -> sample id over all data epochs."""

    def __init__(self, num_samples: int, config: ShuffleConfig) -> None:
        self.S = num_samples
        self.config = config
        self._order = lru_cache(maxsize=4)(lambda e: EpochOrder(num_samples, config, e))

    def samples(self, positions: np.ndarray) -> np.ndarray:
        p = np.asarray(positions, dtype=np.int64)
        epochs = p // self.S
        out = np.empty_like(p)
        for e in np.unique(epochs):
            sel = epochs == e
            out[sel] = self._order(int(e)).samples(p[sel] - e * self.S)
        return out


def first_epoch_set(epoch: int, num_samples: int, world: int, drop_remainder: bool) -> np.ndarray:
    """The epoch set of training epoch ``epoch`` of a run that kept one world size."""
    S = num_samples
    if drop_remainder:
        return intervals.make([(epoch * S, (epoch + 1) * S)])
    carried_from = (epoch * S // world) * world
    return intervals.make([(carried_from, (epoch + 1) * S)])


@dataclass(frozen=True)
class EpochSplit:
    """How one training epoch's set is cut across ranks."""

    epoch_set: np.ndarray
    world: int

    @property
    def per_rank(self) -> int:
        return intervals.size(self.epoch_set) // self.world

    def rank_positions(self, rank: int, idx: np.ndarray) -> np.ndarray:
        """Stream positions of rank-local samples ``idx``."""
        return intervals.members_at(self.epoch_set, rank * self.per_rank + np.asarray(idx))

    def leftover(self) -> np.ndarray:
        n = self.per_rank * self.world
        return intervals.slice_ordered(self.epoch_set, n, intervals.size(self.epoch_set))

    def consumed(self, per_rank_consumed: int) -> np.ndarray:
        """Positions consumed when every rank took its first ``per_rank_consumed``."""
        n = self.per_rank
        pieces = [
            intervals.slice_ordered(self.epoch_set, r * n, r * n + per_rank_consumed)
            for r in range(self.world)
        ]
        return intervals.make(np.concatenate(pieces)) if pieces else intervals.make([])

    def next_epoch_set(self, epoch: int, num_samples: int, drop_remainder: bool) -> np.ndarray:
        """The set of training epoch ``epoch + 1``."""
        fresh = intervals.make([((epoch + 1) * num_samples, (epoch + 2) * num_samples)])
        if drop_remainder:
            return fresh
        return intervals.union(self.leftover(), fresh)


def worker_indices(
    per_rank: int,
    worker: int,
    num_workers: int,
    chunk: int,
    start: int = 0,
    stop: int | None = None,
) -> np.ndarray:
    """Rank-local indices of worker ``worker``'s samples ``[start, stop)``."""
    if not 0 <= worker < num_workers:
        raise ConfigError(f"worker {worker} out of range for {num_workers} workers")
    count = worker_count(per_rank, worker, num_workers, chunk)
    k = np.arange(start, count if stop is None else min(stop, count), dtype=np.int64)
    return ((k // chunk) * num_workers + worker) * chunk + k % chunk


def worker_count(per_rank: int, worker: int, num_workers: int, chunk: int) -> int:
    """How many rank-local samples worker ``worker`` serves."""
    full, rest = divmod(per_rank, chunk * num_workers)
    extra = min(max(rest - worker * chunk, 0), chunk)
    return full * chunk + extra
