"""How images_bench.py times a pass, the same for stoker and every peer (imported by
benchmarks/images_bench.py and peers/images_worker.py, so it needs nothing but the
standard library)."""

from __future__ import annotations

import time
from typing import Any


class PassClock:
    """A pass's rates: over the whole measurement (from just before the first batch is
    asked for, its wait included) and after the first batch (from its arrival to the
    last batch: the pass's start left out)."""

    def __init__(self) -> None:
        self.t0 = time.perf_counter()  # before the loader is made
        self.start = self.at_first = self.end = 0.0
        self.n = self.n_first = 0
        self.first: float | None = None  # seconds from t0 to the first batch

    def begin(self) -> None:
        """Just before the first batch is asked for."""
        self.start = time.perf_counter()

    def batch(self, rows: int) -> None:
        """A batch of ``rows`` images arrived."""
        self.end = time.perf_counter()
        if self.first is None:
            self.first, self.at_first, self.n_first = self.end - self.t0, self.end, rows
        self.n += rows

    def result(self) -> dict[str, Any]:
        dt = self.end - self.start
        after = self.end - self.at_first
        return {
            "images": self.n,
            "seconds": dt,
            "images_s": self.n / dt,
            "steady_images_s": (self.n - self.n_first) / after if after > 0 else None,
            "first_batch_s": self.first,
        }
