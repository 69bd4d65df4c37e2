"""The decoded-block file: what write_decoded writes is what map_block reads back."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from stoker.cache.layout import decoded_size, map_block, write_decoded


@pytest.mark.parametrize("dtype", [np.uint16, np.uint32])
def test_blocks_round_trip(tmp_path: Path, dtype: type) -> None:
    rng = np.random.default_rng(0)
    for i, n in enumerate([1000, 3, 70_000, 5, 1000]):  # longer and shorter than before
        toks = rng.integers(0, 30_000, n).astype(dtype)
        starts = np.unique(rng.integers(0, n, 1 + n // 100)) if i % 2 == 0 else np.zeros(0, int)
        path = tmp_path / f"{i}.tok"
        write_decoded(path, toks, starts)
        assert path.stat().st_size == decoded_size(n, np.dtype(dtype).itemsize, len(starts))
        got, offsets = map_block(path, n, np.dtype(dtype))
        np.testing.assert_array_equal(got, toks)
        np.testing.assert_array_equal(offsets, starts)  # none left from an earlier block
        assert not got.flags.writeable and not offsets.flags.writeable
    assert not list(tmp_path.glob("*.tmp"))


def test_a_strided_block_is_written_contiguously(tmp_path: Path) -> None:
    toks = np.arange(20, dtype=np.uint16)[::2]
    write_decoded(tmp_path / "s.tok", toks, np.array([0, 4]))
    got, offsets = map_block(tmp_path / "s.tok", 10, np.dtype(np.uint16))
    np.testing.assert_array_equal(got, toks)
    assert offsets.tolist() == [0, 4]


def test_a_block_of_one_token_and_no_start_is_its_padded_token(tmp_path: Path) -> None:
    write_decoded(tmp_path / "one.tok", np.array([7], dtype=np.uint16), np.zeros(0, int))
    assert (tmp_path / "one.tok").read_bytes() == b"\x07" + bytes(7)
    got, offsets = map_block(tmp_path / "one.tok", 1, np.dtype(np.uint16))
    assert got.tolist() == [7] and offsets.tolist() == []
