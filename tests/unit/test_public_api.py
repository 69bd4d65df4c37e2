"""The public surface of the stoker package."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import stoker


def test_all_is_sorted_and_unique() -> None:
    assert list(stoker.__all__) == sorted(stoker.__all__)
    assert len(set(stoker.__all__)) == len(stoker.__all__)


def test_every_public_name_exists() -> None:
    missing = [name for name in stoker.__all__ if not hasattr(stoker, name)]
    assert missing == []


def test_star_import_gives_exactly_all() -> None:
    namespace: dict[str, object] = {}
    exec("from stoker import *", namespace)
    namespace.pop("__builtins__")
    assert sorted(namespace) == sorted(stoker.__all__)


def test_errors_form_the_documented_hierarchy() -> None:
    assert issubclass(stoker.ManifestError, stoker.DatasetError)
    assert issubclass(stoker.UnsupportedFormatError, stoker.ManifestError)
    assert issubclass(stoker.ChecksumError, stoker.DatasetError)
    assert issubclass(stoker.UnreachableError, stoker.StorageError)
    for cls in (stoker.DatasetError, stoker.StateError, stoker.InputError, stoker.ConfigError):
        assert issubclass(cls, stoker.StokerError)
        assert issubclass(cls, ValueError)
    assert issubclass(stoker.StorageError, stoker.StokerError)
    assert issubclass(stoker.StorageError, OSError)
    assert issubclass(stoker.AgentRunningError, stoker.AgentError)
    assert issubclass(stoker.AgentError, stoker.StokerError)
    assert issubclass(stoker.AgentError, RuntimeError)


def run_python(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    clean.update(env)
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=clean,
        capture_output=True,
        text=True,
        timeout=240,
    )


def test_importing_stoker_does_not_initialise_torch_distributed(tmp_path: Path) -> None:
    # in a fresh interpreter, with the launcher's variables set as torchrun would set them
    code = """
        import numpy as np
        import stoker
        import torch.distributed as dist

        assert not (dist.is_available() and dist.is_initialized()), "initialised on import"
        # 199 tokens + EOS: (200 - 1) // 8 == 24 samples, 12 for each of 2 ranks
        stoker.write_tokens([np.arange(1, 200)], {url!r}, vocab_size=1000, eos_id=0, block_tokens=64)
        ds = stoker.TokenDataset({url!r}, 8)
        n = sum(1 for _ in ds)  # rank and world come from RANK / WORLD_SIZE
        assert n == 12, n
        ds.state_dict()
        assert not (dist.is_available() and dist.is_initialized()), "initialised by use"
        print("ok")
    """.format(url=os.path.join(str(tmp_path), "ds"))
    proc = run_python(
        code, RANK="1", WORLD_SIZE="2", LOCAL_RANK="1", MASTER_ADDR="127.0.0.1", MASTER_PORT="1"
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "ok"


def test_the_services_start_without_torch() -> None:
    # `import stoker`, the coordinator and the agent import no torch: it costs seconds, which
    # coordinator="rank0" would add to the job's first batch; the loader's names still resolve
    code = """
        import sys
        import stoker, stoker.cli, stoker.coordinator.cli, stoker.coordinator.service
        import stoker.cache.agent
        assert "torch" not in sys.modules, "torch imported"
        assert stoker.TokenLoader.__name__ == "TokenLoader" and "torch" in sys.modules
        print("ok")
    """
    proc = run_python(code)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "ok"
