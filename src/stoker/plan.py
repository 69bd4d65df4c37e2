"""Epoch plans: which samples, in which order, on which rank and worker (pure).

Vocabulary
----------
sample
    Window of ``seq_len + 1`` tokens starting at token ``sample * seq_len``;
    ``num_samples = (num_tokens - 1) // seq_len``.
unit / virtual shard
    ``shard_size`` consecutive samples; a read-time choice.
data epoch ``e``
    A permutation of all samples, by one of two orders (``ShuffleConfig.order``).
    ``"spread"`` (:class:`SpreadOrder`): units arrive one per *turn* in a
    permuted order and each unit's samples, permuted, are dealt out over its turn and
    the following ones (:func:`spread_profile`); a turn emits what it was dealt,
    permuted. ``"window"`` (the default, :class:`EpochOrder`): shards are permuted, consecutive
    groups of ``window_shards`` permuted shards form a *shuffle window*, and the
    samples of a window are permuted among themselves.
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
from fractions import Fraction
from functools import lru_cache

import numpy as np

from stoker import intervals
from stoker.errors import ConfigError
from stoker.permutation import Permutation, derive_key, derive_keys, permute

_SHARDS, _WINDOW, _UNIT, _SLOT = 1, 2, 3, 4


ORDERS = ("window", "spread")


@dataclass(frozen=True)
class ShuffleConfig:
    """How an epoch is shuffled.

    ``order="spread"`` (the default): units of ``shard_size`` samples arrive in a
    permuted order and each unit's samples are spread over the next units' turns,
    ``spread`` turns later on average (:class:`SpreadOrder`); a reader holds about
    ``spread + 1`` units of samples. ``order="window"`` (the default before stoker had
    a second order; its states resume only with it): shards of ``shard_size`` samples
    are permuted, ``window_shards`` consecutive permuted shards form a window, and a
    window's samples are permuted (:class:`EpochOrder`); a reader holds about two
    windows of decoded data.
    ``shard_size=None`` picks about 1 Mi tokens per shard for ``"window"`` and one
    stored block's worth for ``"spread"``.
    """

    seed: int = 0
    shuffle: bool = True
    shard_size: int | None = None
    window_shards: int = 16
    order: str = "spread"
    spread: int = 4

    def resolve(self, seq_len: int, block_tokens: int | None = None) -> ShuffleConfig:
        """The same shuffle with the shard size worked out for ``seq_len`` (and, for the
        ``"spread"`` order, the dataset's ``block_tokens``) and every number a plain int
        (numpy integers are accepted; a float or a string is not)."""
        if self.order not in ORDERS:
            raise ConfigError(f"order must be one of {', '.join(ORDERS)}; got {self.order!r}")
        if self.shard_size is not None:
            shard = operator.index(self.shard_size)
        elif self.order == "spread":
            shard = max(1, (block_tokens or 1 << 19) // seq_len)
        else:
            shard = max(1, (1 << 20) // seq_len)
        if shard < 1:
            raise ConfigError(f"shard_size must be >= 1, got {shard}")
        if self.window_shards < 1:
            raise ConfigError(f"window_shards must be >= 1, got {self.window_shards}")
        spread = operator.index(self.spread)
        if spread < 1:
            raise ConfigError(f"spread must be >= 1, got {spread}")
        return ShuffleConfig(
            operator.index(self.seed),
            bool(self.shuffle),
            shard,
            operator.index(self.window_shards),
            self.order,
            spread,
        )


def shuffle_config(
    shuffle: bool | ShuffleConfig, seed: int, shard_size: int | None, window_shards: int
) -> ShuffleConfig:
    """A dataset's shuffle from its keywords: ``shuffle`` as a :class:`ShuffleConfig`
    (which then holds the seed, shard size and window, left at their defaults beside
    it), or True / False with the other three."""
    if isinstance(shuffle, ShuffleConfig):
        if (seed, shard_size, window_shards) != (0, None, 16):
            raise ConfigError(
                "shuffle=ShuffleConfig(...) holds the seed, shard_size and window_shards: "
                "set them there, not beside it"
            )
        return shuffle
    return ShuffleConfig(seed, bool(shuffle), shard_size, window_shards)


def epoch_order(num_samples: int, config: ShuffleConfig, epoch: int) -> EpochOrder | SpreadOrder:
    """The order of data epoch ``epoch`` that ``config.order`` names."""
    if config.order == "spread":
        return SpreadOrder(num_samples, config, epoch)
    return EpochOrder(num_samples, config, epoch)


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

    def window_spans(self, w: int) -> list[tuple[int, int]]:
        """The samples window ``w``'s slots hold, as ranges ``[a, b)`` of sample ids."""
        lo, hi = (int(x) for x in self.window_start(np.array([w, w + 1])))
        if not self.shuffle:
            return [(lo, hi)]  # slots are samples
        shards = self.shards(np.arange(w * self.ws, min((w + 1) * self.ws, self.ns)))
        return [(int(s) * self.ss, min((int(s) + 1) * self.ss, self.S)) for s in shards]

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


@lru_cache(maxsize=64)
def spread_profile(size: int, spread: int) -> tuple[int, ...]:
    """How many of a unit's ``size`` samples are emitted ``d`` turns after it arrives
    (``d = 0, 1, ...``): a geometric profile of mean ``spread``, ``size * q**d * (1 - q)``
    with ``q = spread / (spread + 1)``, rounded by largest remainder so that the counts sum
    to ``size``. Exact rational arithmetic: every machine computes the same counts."""
    m = spread
    raw: list[Fraction] = []
    while not raw or size * m ** len(raw) >= (m + 1) ** len(raw):  # the tail left is >= 1
        d = len(raw)
        raw.append(Fraction(size * m**d, (m + 1) ** (d + 1)))
    counts = [int(r) for r in raw]
    left = size - sum(counts)
    for d in sorted(range(len(raw)), key=lambda d: (counts[d] - raw[d], d))[:left]:
        counts[d] += 1
    while len(counts) > 1 and counts[-1] == 0:
        counts.pop()
    return tuple(counts)


class SpreadOrder:
    """Slot ``k`` of data epoch ``epoch`` -> sample id for ``order="spread"`` (pure,
    without tables).

    The samples are cut into units of ``shard_size`` consecutive samples (the last one
    may be short). Units arrive one per turn, in a permuted order. Each unit's samples,
    permuted, are dealt out over its own turn and the following ones by
    :func:`spread_profile`: ``n_0`` in its turn, ``n_1`` in the next, and so on. A turn
    emits what the units of the last ``D`` turns deal to it (``shard_size`` samples once
    ``D`` units have arrived), permuted. A reader therefore needs each stored unit once,
    and holds only the samples dealt out but not yet emitted: about ``spread + 1`` units
    of samples, while every run of a turn's length draws from ``D`` different units.
    """

    def __init__(self, num_samples: int, config: ShuffleConfig, epoch: int) -> None:
        assert config.shard_size is not None, "resolve() the config first"
        self.S = num_samples
        self.u = u = config.shard_size
        self.ws = config.window_shards
        self.shuffle = config.shuffle
        self.key = derive_key(config.seed, epoch)
        self.nu = nu = -(-num_samples // u)
        self.tail = num_samples - (nu - 1) * u
        self.units = Permutation(nu, derive_key(self.key, _SHARDS))
        full = spread_profile(u, config.spread)
        short = spread_profile(self.tail, config.spread)
        self.D = D = max(len(full), len(short))
        self.n = np.array(full + (0,) * (D - len(full)), dtype=np.int64)
        self.n_short = np.array(short + (0,) * (D - len(short)), dtype=np.int64)
        self.cum = np.concatenate([[0], np.cumsum(self.n)])
        self.cum_short = np.concatenate([[0], np.cumsum(self.n_short)])
        # the turn the short unit arrives in (none: past the last turn)
        self.q = int(self.units.inverse(nu - 1)) if self.tail < u else nu + D
        self._dcum = np.concatenate([[0], np.cumsum(self.n - self.n_short)])
        self.num_turns = nu + D - 1
        self._unit_key = derive_key(self.key, _UNIT)
        self._turn_key = derive_key(self.key, _SLOT)
        # turns whose size is not u: the first D - 1, the last D - 1, the short unit's D
        odd = np.concatenate(
            [np.arange(D), np.arange(nu - 1, nu + D), np.arange(self.q, self.q + D + 1)]
        )
        self._anchors = np.unique(np.clip(odd, 0, self.num_turns))
        self._anchor_starts = self.turn_start(self._anchors)
        self._anchor_next = self.turn_start(np.minimum(self._anchors + 1, self.num_turns))

    def turn_start(self, t: np.ndarray) -> np.ndarray:
        """First slot of turn ``t`` (``t == num_turns`` gives S)."""
        t = np.asarray(t, dtype=np.int64)
        d = np.arange(self.D, dtype=np.int64)
        dealt = (self.n * np.clip(t[..., None] - d, 0, self.nu)).sum(-1)
        return dealt - self._dcum[np.clip(t - self.q, 0, self.D)]

    @property
    def num_windows(self) -> int:
        """Windows: ``window_shards`` consecutive turns (the unit of locality)."""
        return -(-self.num_turns // self.ws) if self.shuffle else -(-self.S // (self.ws * self.u))

    def window_start(self, w: np.ndarray) -> np.ndarray:
        """First slot of window ``w`` (``w == num_windows`` gives S)."""
        w = np.asarray(w, dtype=np.int64)
        if not self.shuffle:
            return np.minimum(w * self.ws * self.u, self.S)
        return self.turn_start(np.minimum(w * self.ws, self.num_turns))

    def window_spans(self, w: int) -> list[tuple[int, int]]:
        """The samples window ``w``'s slots hold, as ranges ``[a, b)`` of sample ids: the
        units that arrive in its turns or up to ``D - 1`` turns before."""
        if not self.shuffle:
            lo, hi = (int(x) for x in self.window_start(np.array([w, w + 1])))
            return [(lo, hi)]
        first = max(0, w * self.ws - self.D + 1)
        last = min((w + 1) * self.ws, self.nu)
        units = self.units(np.arange(first, last, dtype=np.int64)) if last > first else ()
        return [(int(x) * self.u, min((int(x) + 1) * self.u, self.S)) for x in units]

    def turn_of(self, k: np.ndarray) -> np.ndarray:
        """The turn slot ``k`` is emitted in."""
        return self._locate(np.asarray(k, dtype=np.int64))[0]

    def _locate(self, k: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The turn of each slot ``k`` and that turn's first slot: between two anchors
        every turn holds ``u`` slots."""
        i = np.searchsorted(self._anchor_starts, k, side="right") - 1
        a = self._anchors[i]
        nxt = self._anchor_next[i]
        t = np.where(k < nxt, a, a + 1 + (k - nxt) // self.u)
        start = np.where(k < nxt, self._anchor_starts[i], nxt + (t - a - 1) * self.u)
        return t, start

    def samples(self, k: np.ndarray) -> np.ndarray:
        """Sample ids at slots ``k`` (an array of ints in ``[0, S)``)."""
        k = np.asarray(k, dtype=np.int64)
        if not self.shuffle:
            return k.copy()
        flat = k.reshape(-1)
        t, start = self._locate(flat)
        i = flat - start
        D, nu, u = self.D, self.nu, self.u
        regular = (t >= D - 1) & (t < nu) & ((t < self.q) | (t >= self.q + D))
        out = np.empty_like(flat)
        if regular.any():  # u samples from D full units, in one vectorised pass
            tr = t[regular]
            lo, hi = int(tr.min()), int(tr.max())
            turns = np.arange(lo, hi + 1, dtype=np.int64)
            r = permute(i[regular], derive_keys(self._turn_key, turns), u, tr - lo)
            arrival = tr - (np.searchsorted(self.cum, r, side="right") - 1)
            units = self.units(np.arange(lo - D + 1, hi + 1, dtype=np.int64))  # all regular
            row = arrival - (lo - D + 1)
            unit_keys = derive_keys(self._unit_key, units)
            out[regular] = units[row] * u + permute(r, unit_keys, u, row)
        if not regular.all():
            out[~regular] = self._odd(t[~regular], i[~regular])
        return out.reshape(k.shape)

    def _odd(self, t: np.ndarray, i: np.ndarray) -> np.ndarray:
        """Samples at indices ``i`` of turns ``t`` with fewer than D units or the short one.

        What depends on the turn alone (what each delay deals to it, its key) or on the
        unit alone (its key) is worked out once per distinct turn and unit, not per
        index: a call's indices fall in a few turns (a small epoch's turns are nearly
        all of this kind)."""
        D, u = self.D, self.u
        turns, at = np.unique(t, return_inverse=True)
        arrived = turns[:, None] - np.arange(D, dtype=np.int64)
        valid = (arrived >= 0) & (arrived < self.nu)
        short = arrived == self.q
        dealt = np.where(valid, np.where(short, self.n_short, self.n), 0)  # (turns, D)
        ends = np.cumsum(dealt, axis=1)
        r = permute(i, derive_keys(self._turn_key, turns), ends[at, -1], at)
        # the delay group each index falls in: how many of its turn's ends are <= r, by one
        # search of every turn's ends laid end to end (a turn's row offset past the last's)
        width = int(ends[:, -1].max()) + 1
        flat = (ends + np.arange(len(turns), dtype=np.int64)[:, None] * width).ravel()
        g = np.searchsorted(flat, at * width + r, side="right") - at * D
        within = r - (ends - dealt)[at, g]
        a = t - g
        is_short = a == self.q
        offset = np.where(is_short, self.cum_short[g], self.cum[g]) + within
        arrivals, of = np.unique(a, return_inverse=True)
        units = self.units(arrivals)
        size = np.where(is_short, self.tail, u)
        keys = derive_keys(self._unit_key, units)
        return units[of] * u + permute(offset, keys, size, of)


class Stream:
    """Stream position -> sample id over all data epochs."""

    def __init__(self, num_samples: int, config: ShuffleConfig) -> None:
        self.S = num_samples
        self.config = config
        self._order = lru_cache(maxsize=4)(lambda e: epoch_order(num_samples, config, e))

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
