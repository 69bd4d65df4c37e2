"""Fixtures of the unit tests (helpers live in _datasets.py)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from ._datasets import SmallDataset, writer


@pytest.fixture
def write_small(tmp_path: Path) -> Callable[..., SmallDataset]:
    """Factory: ``write_small(name, seed=, num_docs=, max_len=, vocab_size=, eos_id=, docs=, **write_kwargs)``.

    Writes under this test's tmp_path; ``write_kwargs`` go to stoker.write_tokens
    (block_tokens defaults to 256).
    """
    return writer(tmp_path)


@pytest.fixture(scope="module")
def write_small_module(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., SmallDataset]:
    """Like write_small, for datasets shared by the tests of one module."""
    return writer(tmp_path_factory.mktemp("datasets"))
