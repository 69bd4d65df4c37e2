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
