"""The one histogram of stoker's latencies: :data:`BUCKETS` (seconds) and
:class:`Histogram`, shared by the loader, the node agent and the coordinator."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

#: Buckets (seconds) of the latency histograms: storage requests, data waits, steps.
BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


@dataclass
class Histogram:
    counts: list[int] = field(default_factory=lambda: [0] * (len(BUCKETS) + 1))
    sum: float = 0.0

    def observe(self, seconds: float) -> None:
        i = 0
        while i < len(BUCKETS) and seconds > BUCKETS[i]:
            i += 1
        self.counts[i] += 1
        self.sum += seconds

    @property
    def count(self) -> int:
        return sum(self.counts)

    def add(self, other: dict[str, Any]) -> None:
        for i, n in enumerate(other["counts"]):
            self.counts[i] += n
        self.sum += other["sum"]

    def to_dict(self) -> dict[str, Any]:
        return {"counts": list(self.counts), "sum": self.sum}
