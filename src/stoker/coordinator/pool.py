"""The preprocessing pool's table, kept by the coordinator (pure: time is given).

Workers offer themselves (their address and the rows a second they made lately) every
few seconds; one silent past the timeout, or leaving, is out. Trainers ask which
workers there are, and say how many rows a second they would consume were they never
kept waiting on the pool (rows over the time not spent waiting). What the job needs is
that demand over a worker's mean rate: the workers an autoscaler should keep (``stoker
doctor`` reads it from the coordinator's metrics).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

#: Seconds between a worker's offers (and a trainer's asks): it is out after three
#: missed (or the coordinator's heartbeat timeout, when longer).
OFFER_SECONDS = 2.0


@dataclass
class _Seen:
    rate: float  # rows a second, as last told
    at: float  # when last told


@dataclass
class PoolTable:
    """Workers by address and trainers' demand by consumer, each dropped ``timeout``
    seconds after it last spoke."""

    timeout: float = 15.0
    workers: dict[str, _Seen] = field(default_factory=dict)
    demand: dict[int, _Seen] = field(default_factory=dict)

    def offer(self, address: str, rate: float, now: float, leaving: bool = False) -> None:
        """Worker ``address`` is up (made ``rate`` rows a second lately), or leaving."""
        if leaving:
            self.workers.pop(address, None)
            return
        self.workers[address] = _Seen(max(0.0, rate), now)

    def ask(self, consumer: int, rate: float, now: float) -> list[str]:
        """Trainer ``consumer`` consumes ``rate`` rows a second: the workers up, in the
        order they first offered themselves."""
        self.demand[consumer] = _Seen(max(0.0, rate), now)
        self.expire(now)
        return list(self.workers)

    def expire(self, now: float) -> None:
        """Forget workers and trainers silent longer than the timeout."""
        for gone in [a for a, s in self.workers.items() if now - s.at > self.timeout]:
            del self.workers[gone]
        for quiet in [c for c, s in self.demand.items() if now - s.at > self.timeout]:
            del self.demand[quiet]

    def needed(self, now: float) -> float:
        """Workers the trainers' demand needs at the workers' mean rate (0 without
        demand; without a worker that told its rate, at least one while there is)."""
        self.expire(now)
        want = sum(s.rate for s in self.demand.values())
        rates = [s.rate for s in self.workers.values() if s.rate > 0]
        if want <= 0:
            return 0.0
        if not rates:
            return 1.0
        return want / (sum(rates) / len(rates))

    def needed_whole(self, now: float) -> int:
        """:meth:`needed`, rounded up."""
        return math.ceil(self.needed(now) - 1e-9)
