"""The committed protobuf modules are exactly what scripts/gen-proto generates from proto/."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
GENERATED = ROOT / "src" / "stoker" / "_proto"


def test_generated_code_is_up_to_date(tmp_path: Path) -> None:
    protos = sorted((ROOT / "proto").glob("*.proto"))
    assert protos
    subprocess.run(
        [sys.executable, "-m", "grpc_tools.protoc", f"-I{ROOT / 'proto'}",
         f"--python_out={tmp_path}", f"--pyi_out={tmp_path}", *map(str, protos)],
        check=True,
    )  # fmt: skip
    fresh = sorted(p.name for p in tmp_path.iterdir())
    committed = sorted(
        p.name for p in GENERATED.iterdir() if p.name.endswith(("_pb2.py", "_pb2.pyi"))
    )
    assert fresh == committed
    for name in fresh:
        assert (tmp_path / name).read_text() == (GENERATED / name).read_text(), (
            f"src/stoker/_proto/{name} is stale: run scripts/gen-proto"
        )
    shutil.rmtree(tmp_path)
