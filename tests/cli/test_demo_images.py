"""`stoker demo --images`: pictures drawn, built into a records dataset, a tiny CNN trained
on 2 CPU ranks; it reports images/s and the data wait, learns, and resumes exactly."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path


def test_the_image_demo_trains_and_resumes_exactly(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "stoker.cli", "demo", "--images", "--steps", "40",
         "--workdir", str(tmp_path)],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    text = out.stdout
    assert re.search(r"throughput: [\d,]+ images/s over 2 ranks", text)
    assert re.search(r"data wait: [\d.]+% of step time", text)
    assert "exact resume (images, crops and flips included" in text and ": OK" in text
    right = int(re.search(r"last 10 steps (\d+)% right", text).group(1))  # type: ignore[union-attr]
    assert right > 30  # ten classes: a model that learned nothing is right 10% of the time
    assert (tmp_path / "records" / "manifest.json").exists()
