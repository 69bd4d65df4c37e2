"""How often each node's relay may send the coordinator a message (pure).

A relay keeps one message in flight, so without a pace a thousand nodes keep a thousand
messages queued at the coordinator, and each waits for the others: the coordinator is
saturated, every call waits a round trip of about ``nodes / messages per second``, and
its other calls (Register, Status, Checkpoint) wait behind them. With a pace, each
node's relay waits ``pace`` seconds between messages, carrying everything that came
meanwhile in the next one, so that all nodes together send at most ``budget`` messages a
second: the coordinator answers each at once, and the wait moves to the nodes, where a
reader's lease is asked for ahead of need (half way through the one before) and its
read horizon reaches :attr:`~stoker.coordinator.model.Config.readahead_seconds` ahead.
"""

from __future__ import annotations

#: Messages per second the coordinator asks its relays, all together, to stay within:
#: about half of what it answers on two cores (benchmarks/scale_bench.py), so it is
#: never the queue.
BUDGET = 500.0
#: A sender not heard from for this long no longer counts.
WINDOW = 10.0
#: The longest pace asked: a relay's calls wait at most this long for their message
#: (beyond some 4,000 nodes the budget is exceeded rather than a rank's confirms or a
#: reader's next lease held up for longer; well within a consumer's 30 s timeout and a
#: process's wait for its agent).
MAX_PACE = 2.0


class Pacer:
    """The senders heard from lately, and the pace that keeps them within ``budget``."""

    def __init__(self, budget: float = BUDGET, window: float = WINDOW) -> None:
        self.budget = budget
        self.window = window
        self._last: dict[str, float] = {}
        self._swept = 0.0

    def heard(self, sender: str, now: float) -> float:
        """``sender`` sent a message at ``now`` (monotonic seconds); the pace (seconds
        between a sender's messages) for the senders heard from within ``window``."""
        if sender:
            self._last[sender] = now
        if now - self._swept > self.window:  # forget the silent, at most once a window
            self._swept = now
            cutoff = now - self.window
            self._last = {k: t for k, t in self._last.items() if t >= cutoff}
        if self.budget <= 0:
            return 0.0
        return min(MAX_PACE, len(self._last) / self.budget)

    @property
    def senders(self) -> int:
        return len(self._last)
