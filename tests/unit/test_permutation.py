"""stoker.permutation: seeded bijections on [0, n) in O(1) memory."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stoker.permutation import Permutation, derive_key, mix64

KEYS = st.integers(min_value=0, max_value=2**64 - 1)
FAST = settings(deadline=None, max_examples=40)


@FAST
@given(n=st.integers(min_value=1, max_value=100_000), key=KEYS)
def test_is_a_bijection_on_the_whole_domain(n: int, key: int) -> None:
    p = Permutation(n, key)
    x = np.arange(n, dtype=np.int64)
    y = p(x)
    assert y.dtype == np.int64
    assert y.shape == (n,)
    assert np.array_equal(np.sort(y), x)  # onto [0, n), no duplicates
    assert np.array_equal(p.inverse(y), x)
    assert np.array_equal(p(p.inverse(x)), x)


def test_every_small_domain_exhaustively() -> None:
    for n in range(1, 130):
        for key in (0, 1, 2**64 - 1):
            p = Permutation(n, key)
            y = p(np.arange(n))
            assert sorted(y.tolist()) == list(range(n)), (n, key)
            assert p.inverse(y).tolist() == list(range(n)), (n, key)


@FAST
@given(
    n=st.integers(min_value=1, max_value=2**40),
    key=KEYS,
    data=st.data(),
)
def test_inverse_undoes_the_permutation_on_huge_domains(
    n: int, key: int, data: st.DataObject
) -> None:
    xs = data.draw(st.lists(st.integers(min_value=0, max_value=n - 1), min_size=1, max_size=200))
    x = np.asarray(xs, dtype=np.int64)
    p = Permutation(n, key)
    y = p(x)
    assert ((y >= 0) & (y < n)).all()
    assert np.array_equal(p.inverse(y), x)
    # injective on the sample: equal images only for equal inputs
    assert len(set(y.tolist())) == len(set(xs))


@FAST
@given(n=st.integers(min_value=1_000, max_value=50_000), key=KEYS)
def test_is_not_close_to_the_identity(n: int, key: int) -> None:
    y = Permutation(n, key)(np.arange(n))
    fixed = int((y == np.arange(n)).sum())
    assert fixed < n // 10  # a random permutation has about one fixed point


@FAST
@given(n=st.integers(min_value=50, max_value=20_000), k1=KEYS, k2=KEYS)
def test_different_keys_give_different_orders(n: int, k1: int, k2: int) -> None:
    if k1 == k2:
        k2 = (k1 + 1) % 2**64
    x = np.arange(n)
    assert not np.array_equal(Permutation(n, k1)(x), Permutation(n, k2)(x))


@FAST
@given(n=st.integers(min_value=1, max_value=2**40), key=KEYS)
def test_same_key_gives_the_same_order(n: int, key: int) -> None:
    x = np.linspace(0, n - 1, num=min(n, 500)).astype(np.int64)
    assert np.array_equal(Permutation(n, key)(x), Permutation(n, key)(x))
    assert np.array_equal(Permutation(n, key).inverse(x), Permutation(n, key).inverse(x))


def test_scalars_and_shapes() -> None:
    n = 1000
    p = Permutation(n, 7)
    full = p(np.arange(n))
    assert int(p(5)) == full[5]
    assert int(p.inverse(int(full[5]))) == 5
    grid = np.arange(12).reshape(3, 4)
    out = p(grid)
    assert out.shape == (3, 4)
    assert np.array_equal(out.reshape(-1), full[:12])
    assert p(np.zeros(0, dtype=np.int64)).shape == (0,)


def test_the_input_array_is_not_modified() -> None:
    p = Permutation(100, 3)
    x = np.arange(100, dtype=np.int64)
    p(x)
    p.inverse(x)
    assert np.array_equal(x, np.arange(100))


@pytest.mark.parametrize("bad", [-1, 10, 11, 2**40])
def test_out_of_range_indices_raise(bad: int) -> None:
    p = Permutation(10, 0)
    with pytest.raises(IndexError):
        p(np.array([0, bad]))
    with pytest.raises(IndexError):
        p.inverse(bad)


@pytest.mark.parametrize("n", [0, -5])
def test_empty_domain_is_rejected(n: int) -> None:
    with pytest.raises(ValueError, match="domain"):
        Permutation(n, 0)


def test_domain_of_one() -> None:
    p = Permutation(1, 12345)
    assert p(0) == 0
    assert p.inverse(np.array([0, 0])).tolist() == [0, 0]


# -- key derivation -----------------------------------------------------------------


def test_mix64_is_splitmix64() -> None:
    # splitmix64 seeded with 0: state += golden gamma, then the finaliser. Its first
    # output is the published test vector 0xE220A8397B1DCDAF.
    assert mix64(0x9E3779B97F4A7C15) == 0xE220A8397B1DCDAF


@settings(deadline=None)
@given(parts=st.lists(st.integers(min_value=-(2**70), max_value=2**70), max_size=5))
def test_derive_key_is_a_deterministic_64_bit_int(parts: list[int]) -> None:
    key = derive_key(*parts)
    assert isinstance(key, int)
    assert 0 <= key < 2**64
    assert derive_key(*parts) == key


def test_derive_key_separates_its_inputs() -> None:
    keys = {derive_key(seed, epoch) for seed in range(60) for epoch in range(60)}
    assert len(keys) == 60 * 60
    assert derive_key(1, 2) != derive_key(2, 1)  # order matters
    assert derive_key(0) != derive_key(0, 0) != derive_key()  # so does the number of parts
    assert derive_key(5, 0) != derive_key(5)


def test_derive_key_reads_parts_modulo_2_64() -> None:
    assert derive_key(-1) == derive_key(2**64 - 1)
    assert derive_key(3, 2**64 + 4) == derive_key(3, 4)
