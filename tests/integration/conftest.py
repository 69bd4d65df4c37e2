"""Fixtures shared by stoker's integration tests (servers come from tests/conftest.py)."""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from .helpers import Written, write_dataset
from .test_agent import Agents


@pytest.fixture(scope="session")
def small_dataset(tmp_path_factory: pytest.TempPathFactory) -> Written:
    """A read-only uint16 dataset: ~6k tokens in 256-token blocks, 4 blocks per file.

    Lives at ``<root>/ds`` so that ``<root>`` can be served by nginx. Tests that
    modify a dataset must ``copy_to`` their own directory first.
    """
    root = tmp_path_factory.mktemp("small-root")
    return write_dataset(root / "ds", num_docs=40, seed=1, block_tokens=256, blocks_per_file=4)


@pytest.fixture
def agents() -> Iterator[Agents]:
    """Starts ``stoker agent`` processes (:class:`Agents`); kills them at the end."""
    a = Agents()
    yield a
    a.close()


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


@pytest.fixture
def loopback_only() -> Iterator[list[str]]:
    """The command prefix that runs a process in a fresh namespace of loopback only
    (none without root: the run then uses this machine's loopback)."""
    if os.geteuid() != 0 or shutil.which("ip") is None:
        yield []
        return
    name = f"stoker-ray-{os.getpid()}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        subprocess.run(["ip", "-n", name, "link", "set", "lo", "up"], check=True)
        yield ["ip", "netns", "exec", name]
    finally:
        subprocess.run(["ip", "netns", "del", name], check=False)
