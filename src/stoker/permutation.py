"""Seeded bijections on ``[0, n)`` in O(1) memory (pure).

A four-round Feistel network over the smallest even-bit domain that holds
``n``, with cycle walking to stay inside ``[0, n)``. Vectorised over numpy
arrays: permuting a million indices takes milliseconds and no table is ever
materialised, so plans over billions of samples cost nothing to build.
"""

from __future__ import annotations

import numpy as np

_M64 = (1 << 64) - 1
_ROUNDS = 4
#: indices left to walk that :func:`permute` finishes in plain ints: a vectorised step
#: costs tens of numpy calls whatever its size, a scalar one a few microseconds
_SCALAR_WALK = 8


def mix64(x: int) -> int:
    """splitmix64's finaliser on a Python int (for key derivation)."""
    x &= _M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _M64
    return x ^ (x >> 31)


def derive_key(*parts: int) -> int:
    """A 64-bit key from integers (seed, epoch, window, ...)."""
    key = 0x5EED5EED5EED5EED
    for part in parts:
        key = mix64(key ^ mix64(int(part) & _M64))
    return key


def _mix_array(x: np.ndarray) -> np.ndarray:
    x = x ^ (x >> np.uint64(30))
    x = x * np.uint64(0xBF58476D1CE4E5B9)
    x = x ^ (x >> np.uint64(27))
    x = x * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


#: splitmix64's finaliser over a uint64 array (hashes that need no permutation).
mix_array = _mix_array


class Permutation:
    """A bijection of ``[0, n)`` chosen by ``key``."""

    __slots__ = ("_half", "_keys", "_mask", "n")

    def __init__(self, n: int, key: int) -> None:
        if n < 1:
            raise ValueError(f"permutation domain must be >= 1, got {n}")
        self.n = n
        bits = max(2, (n - 1).bit_length())
        self._half = np.uint64((bits + 1) // 2)
        self._mask = np.uint64((1 << int(self._half)) - 1)
        self._keys = [np.uint64(derive_key(key, r)) for r in range(_ROUNDS)]

    def _round(self, x: np.ndarray, k: np.uint64) -> np.ndarray:
        return _mix_array(x ^ k) & self._mask

    def _encrypt(self, x: np.ndarray) -> np.ndarray:
        left, right = x >> self._half, x & self._mask
        for k in self._keys:
            left, right = right, left ^ self._round(right, k)
        return (left << self._half) | right

    def _decrypt(self, x: np.ndarray) -> np.ndarray:
        left, right = x >> self._half, x & self._mask
        for k in reversed(self._keys):
            left, right = right ^ self._round(left, k), left
        return (left << self._half) | right

    def _walk(self, idx: np.ndarray | int, step) -> np.ndarray:  # type: ignore[no-untyped-def]
        x = np.asarray(idx, dtype=np.int64)
        shape = x.shape
        x = x.reshape(-1)
        if x.size and (x.min() < 0 or x.max() >= self.n):
            raise IndexError(f"index out of range [0, {self.n})")
        if self.n == 1:
            return x.reshape(shape).copy()
        with np.errstate(over="ignore"):
            y = step(x.astype(np.uint64))
            out = y >= np.uint64(self.n)
            while out.any():
                y[out] = step(y[out])
                out = y >= np.uint64(self.n)
        return y.astype(np.int64).reshape(shape)

    def __call__(self, idx: np.ndarray | int) -> np.ndarray:
        """The image of ``idx`` (an int or an array of ints)."""
        return self._walk(idx, self._encrypt)

    def inverse(self, idx: np.ndarray | int) -> np.ndarray:
        return self._walk(idx, self._decrypt)


def derive_keys(prefix: int, parts: np.ndarray) -> np.ndarray:
    """``derive_key(*prefix_parts, p)`` for each ``p`` in ``parts``, vectorised, where
    ``prefix = derive_key(*prefix_parts)`` (uint64 keys)."""
    with np.errstate(over="ignore"):
        p = np.asarray(parts, dtype=np.int64).astype(np.uint64)
        return _mix_array(np.uint64(prefix) ^ _mix_array(p))


def permute(
    idx: np.ndarray, keys: np.ndarray, n: int | np.ndarray, rows: np.ndarray | None = None
) -> np.ndarray:
    """``Permutation(n, k)(i)`` for every pair ``(i, k)`` of ``idx`` and ``keys``
    (uint64, one per index; or, with ``rows``, a table of keys and the row of each
    index): the same bijections as :class:`Permutation`, many keys (and domains: ``n``
    may be one per index) in one vectorised pass."""
    x = np.asarray(idx, dtype=np.int64)
    size = np.asarray(n, dtype=np.int64)
    if x.size and (x.min() < 0 or bool((x >= size).any())):
        raise IndexError(f"index out of range [0, {n})")
    if int(size.max(initial=1)) >= 1 << 52:  # float64 bit lengths are exact below 2^53
        raise ValueError(f"permute: domain {int(size.max())} too large (below 2^52)")
    bits = np.maximum(2, np.frexp((size - 1).astype(np.float64))[1])  # (n - 1).bit_length()
    half = ((bits + 1) // 2).astype(np.uint64)
    mask = (np.uint64(1) << half) - np.uint64(1)
    bound = size.astype(np.uint64)
    per = half.ndim > 0  # domains per index: select them with the indices walked again
    with np.errstate(over="ignore"):
        base = _mix_array(np.uint64(0x5EED5EED5EED5EED) ^ _mix_array(keys.astype(np.uint64)))
        rounds = [_mix_array(base ^ np.uint64(mix64(r))) for r in range(_ROUNDS)]
        if rows is not None:
            rounds = [k[rows] for k in rounds]

        def step(y: np.ndarray, sel: np.ndarray | slice) -> np.ndarray:
            h, m = (half[sel], mask[sel]) if per else (half, mask)
            left, right = y >> h, y & m
            for k in rounds:
                left, right = right, left ^ (_mix_array(right ^ k[sel]) & m)
            return (left << h) | right

        y = step(x.astype(np.uint64), slice(None))
        out = np.nonzero(y >= bound)[0]
        while out.size > _SCALAR_WALK:
            y[out] = step(y[out], out)
            out = out[y[out] >= (bound[out] if per else bound)]
        for j in out.tolist():  # the walk's last few, each a step at a time in plain ints
            h, m = (int(half[j]), int(mask[j])) if per else (int(half), int(mask))
            v, b, ks = int(y[j]), int(bound[j] if per else bound), [int(k[j]) for k in rounds]
            while v >= b:
                left, right = v >> h, v & m
                for k in ks:
                    left, right = right, left ^ (mix64(right ^ k) & m)
                v = (left << h) | right
            y[j] = v
    return (
        np.where(size == 1, 0, y.astype(np.int64))
        if per
        else (x.copy() if int(size) == 1 else y.astype(np.int64))
    )
