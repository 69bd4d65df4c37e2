"""Fixtures shared by stoker's integration tests (servers come from tests/conftest.py)."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from .helpers import Written, write_dataset


@pytest.fixture(scope="session")
def small_dataset(tmp_path_factory: pytest.TempPathFactory) -> Written:
    """A read-only uint16 dataset: ~6k tokens in 256-token blocks, 4 blocks per file.

    Lives at ``<root>/ds`` so that ``<root>`` can be served by nginx. Tests that
    modify a dataset must ``copy_to`` their own directory first.
    """
    root = tmp_path_factory.mktemp("small-root")
    return write_dataset(root / "ds", num_docs=40, seed=1, block_tokens=256, blocks_per_file=4)


@pytest.fixture
def bucket() -> str:
    """A fresh bucket name (the moto server is shared by the whole session)."""
    return f"stoker-it-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def serve_dir(nginx_origin):
    """``serve_dir(dataset_dir, **origin_kwargs)`` -> (origin, url of the dataset)."""

    def make(dataset_dir: Path, via: str = "", **kwargs):
        dataset_dir = Path(dataset_dir)
        origin = nginx_origin(dataset_dir.parent, **kwargs)
        return origin, origin.url_for(dataset_dir.name, via=via).rstrip("/")

    return make
