"""The committed protobuf modules are exactly what scripts/gen-proto generates from proto/."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
GENERATED = ROOT / "src" / "stoker" / "_proto"


def _generated(root: Path) -> dict[str, str]:
    folder = root / "src" / "stoker" / "_proto"
    return {p.name: p.read_text() for p in folder.iterdir() if "_pb2" in p.name and p.is_file()}


def test_generated_code_is_up_to_date(tmp_path: Path) -> None:
    # run the script on a copy of proto/ and the script, into an empty src/
    shutil.copytree(ROOT / "proto", tmp_path / "proto")
    (tmp_path / "scripts").mkdir()
    shutil.copy(ROOT / "scripts" / "gen-proto", tmp_path / "scripts" / "gen-proto")
    (tmp_path / "src" / "stoker" / "_proto").mkdir(parents=True)
    subprocess.run(
        ["bash", str(tmp_path / "scripts" / "gen-proto")],
        check=True,
        env={**os.environ, "PYTHON": sys.executable},
        capture_output=True,
    )
    fresh, committed = _generated(tmp_path), _generated(ROOT)
    assert sorted(fresh) == sorted(committed)
    for name, text in fresh.items():
        assert text == committed[name], f"src/stoker/_proto/{name} is stale: run scripts/gen-proto"
