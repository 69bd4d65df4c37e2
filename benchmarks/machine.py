"""What the benchmarks record about where they ran: the CPU (lscpu) and the commit."""

from __future__ import annotations

import os
import platform
import subprocess
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def lscpu(keys: tuple[str, ...] = ("Model name", "CPU(s)", "Architecture", "Hypervisor vendor")
          ) -> dict[str, str]:  # fmt: skip
    """Those fields of ``lscpu`` (none where it is missing)."""
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return {}
    info = {}
    for line in out.splitlines():
        k, _, v = line.partition(":")
        if k.strip() in keys:
            info[k.strip()] = v.strip()
    return info


def git_info() -> str | None:
    """Commit of the checkout and whether src/ differs from it (what stoker was measured)."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "src"], cwd=ROOT, capture_output=True, text=True
        ).stdout.strip()
    except OSError:
        return None
    if not head:
        return None
    return head + (" with uncommitted changes in src/" if dirty else "")


def platform_info() -> dict[str, Any]:
    """The machine and the interpreter: cores, Python, kernel, torch, numpy, and lscpu's
    model, architecture and hypervisor."""
    import numpy as np
    import torch

    info: dict[str, Any] = {
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "kernel": platform.release(),
        "torch": torch.__version__,
        "numpy": np.__version__,
    }
    info.update(lscpu(("Model name", "Architecture", "Hypervisor vendor")))
    return info


def proc_cpu(pid: int) -> float | None:
    """CPU seconds (user + system) of process ``pid`` so far (Linux /proc; else None)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
