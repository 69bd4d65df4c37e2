"""``python -m stoker`` is the ``stoker`` command."""

from __future__ import annotations

import subprocess
import sys


def test_python_m_stoker_runs_the_cli() -> None:
    out = subprocess.run([sys.executable, "-m", "stoker", "--help"], capture_output=True,
                         text=True, timeout=120)  # fmt: skip
    assert out.returncode == 0, out.stderr
    for verb in ("build-tokens", "coordinator", "agent", "doctor"):
        assert verb in out.stdout
    bad = subprocess.run([sys.executable, "-m", "stoker", "no-such-verb"], capture_output=True,
                         text=True, timeout=120)  # fmt: skip
    assert bad.returncode == 2 and "no-such-verb" in bad.stderr
