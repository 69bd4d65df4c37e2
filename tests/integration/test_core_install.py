"""The core package alone, in a fresh virtualenv: no S3, tokenizer or parquet packages, and
every core path works (local and HTTP datasets, the node agent, the coordinator, doctor).

Slow: it creates a virtualenv and installs torch and the package into it (pip's cache and the
local wheel of torch keep that to a minute or two).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import stoker

from .helpers import Written

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
READER = Path(__file__).with_name("_core_reader.py")
EXTRAS_ONLY = ("s3fs", "aiobotocore", "aiohttp", "tokenizers", "pyarrow", "tqdm")
SEQ, BATCH = 16, 4


def pip(venv: Path, *args: str, timeout: float = 420) -> str:
    result = subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pip", "--disable-pip-version-check", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert result.returncode == 0, f"pip {' '.join(args)}:\n{result.stdout}\n{result.stderr}"
    return result.stdout


def installed(venv: Path) -> set[str]:
    rows = json.loads(pip(venv, "list", "--format", "json"))
    return {row["name"].lower().replace("_", "-") for row in rows}


@pytest.fixture(scope="module")
def core_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A virtualenv (no system site-packages) with torch==2.13.0 and stoker without extras."""
    root = tmp_path_factory.mktemp("core-install")
    # a copy of the source tree, so that building the package writes nothing into the checkout
    src = root / "src"
    shutil.copytree(
        REPO,
        src,
        ignore=shutil.ignore_patterns(
            ".git",
            ".venv*",
            "build",
            "dist",
            "*.egg-info",
            "__pycache__",
            ".*_cache",
            ".hypothesis",
            ".work",
        ),
    )
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    pip(venv, "install", "-q", "torch==2.13.0")  # first: unpinned would pull a CUDA build
    pip(venv, "install", "-q", str(src))
    return venv


def reads_here(url: str) -> list[list[int]]:
    ds = stoker.TokenDataset(url, SEQ, batch_size=BATCH, seed=5, agent=False)
    ids: list[int] = []
    sums: list[int] = []
    for batch in stoker.TokenLoader(ds, 0):
        ids += batch["sample_id"].tolist()
        sums += batch["tokens"].sum(dim=1).tolist()
    return [ids, sums]


def test_the_core_package_reads_local_and_http_and_names_the_s3_extra(
    core_venv: Path, small_dataset: Written, serve_dir: Any, tmp_path: Path
) -> None:
    assert installed(core_venv).isdisjoint(EXTRAS_ONLY), installed(core_venv) & set(EXTRAS_ONLY)
    _, http_url = serve_dir(small_dataset.path)
    local = str(small_dataset.path)
    cfg = {
        "urls": [local, http_url],
        "agent_url": http_url,
        "cache_dir": str(tmp_path / "cache"),
        "s3_url": "s3://bucket/dataset",
        "seq_len": SEQ,
        "batch_size": BATCH,
    }
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    result = subprocess.run(
        [str(core_venv / "bin" / "python"), str(READER), json.dumps(cfg)],
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
        cwd=tmp_path,  # not the checkout: the venv's own stoker is the one imported
    )
    assert result.returncode == 0, result.stderr[-4000:]
    out = json.loads(result.stdout.strip().splitlines()[-1])
    want = reads_here(local)
    assert sorted(want[0]) == list(range(small_dataset.num_samples(SEQ)))
    assert out["reads"][local] == want
    assert out["reads"][http_url] == want
    assert out["reads"]["agent:" + http_url] == want
    is_config_error, message = out["s3_error"]
    assert is_config_error, message
    assert "s3://bucket/dataset" in message and "pip install 'stoker[s3]'" in message

    version = subprocess.run(
        [str(core_venv / "bin" / "stoker"), "--version"], capture_output=True, text=True
    )
    assert version.stdout.strip() == f"stoker {stoker.__version__}"


def test_the_core_package_installs_beside_the_newest_boto3(core_venv: Path) -> None:
    pip(core_venv, "install", "-q", "--upgrade", "boto3")
    assert "boto3" in installed(core_venv)
    pip(core_venv, "check")  # no conflict between stoker's requirements and boto3's
