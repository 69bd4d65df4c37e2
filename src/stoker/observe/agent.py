"""The node agent's counters, and their Prometheus view (histograms as everywhere in
stoker: :class:`~stoker.observe.instruments.Histogram`, one bucket set)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

from stoker.observe.exposition import cumulative
from stoker.observe.instruments import BUCKETS, Histogram

#: The remote-latency buckets: the one bucket set of every stoker histogram.
LATENCY_BUCKETS = BUCKETS


class Counters:
    """The agent's counters and the remote-latency histogram (thread-safe)."""

    NAMES = (
        "memory_hits",
        "memory_misses",
        "disk_hits",
        "disk_misses",
        "remote_requests",
        "remote_bytes",
        "remote_errors",
        "memory_evictions",
        "disk_evictions",
        "decodes",
        "images_decoded",
        "image_errors",
        "prefetches",
        "inline_fallbacks",
        "checksum_refetches",
        "pins_released_on_disconnect",
        "connections",
        "connections_refused",
        "bad_frames",
        "relay_messages",
        "relay_calls",
        "relay_dropped",
    )

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.values = dict.fromkeys(self.NAMES, 0)
        self.latency = Histogram()

    def add(self, name: str, n: int = 1) -> None:
        with self._lock:
            self.values[name] += n

    def observe(self, seconds: float) -> None:
        with self._lock:
            self.latency.observe(seconds)

    def latency_stats(self) -> dict[str, Any]:
        """The remote-latency histogram as :meth:`Agent.stats` reports it."""
        with self._lock:
            return {
                "remote_latency_buckets": list(BUCKETS),
                "remote_latency_counts": list(self.latency.counts),
                "remote_latency_sum": self.latency.sum,
            }


class AgentCollector:
    """Prometheus view of an agent's stats (a callable returning :meth:`Agent.stats`)."""

    def __init__(self, stats: Callable[[], dict[str, Any]]) -> None:
        self.stats = stats

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import (
            CounterMetricFamily,
            GaugeMetricFamily,
            HistogramMetricFamily,
        )

        s = self.stats()
        for tier in ("memory", "disk"):
            c = CounterMetricFamily(
                f"stoker_agent_{tier}_requests",
                f"Block requests to the {tier} tier",
                labels=["result"],
            )
            c.add_metric(["hit"], s[f"{tier}_hits"])
            c.add_metric(["miss"], s[f"{tier}_misses"])
            yield c
            yield CounterMetricFamily(
                f"stoker_agent_{tier}_evictions",
                f"Blocks evicted from the {tier} tier",
                value=s[f"{tier}_evictions"],
            )
            yield GaugeMetricFamily(
                f"stoker_agent_{tier}_bytes",
                f"Bytes held in the {tier} tier",
                value=s[f"{tier}_bytes"],
            )
            yield GaugeMetricFamily(
                f"stoker_agent_{tier}_limit_bytes",
                f"Capacity of the {tier} tier",
                value=s[f"{tier}_limit"],
            )
        yield CounterMetricFamily(
            "stoker_agent_remote_read_bytes",
            "Bytes read from remote storage",
            value=s["remote_bytes"],
        )
        yield CounterMetricFamily(
            "stoker_agent_remote_requests",
            "Range requests to remote storage",
            value=s["remote_requests"],
        )
        yield CounterMetricFamily(
            "stoker_agent_remote_errors",
            "Failed range requests (after retries)",
            value=s["remote_errors"],
        )
        if list(s["remote_latency_buckets"]) != list(BUCKETS):  # an agent of another version
            raise ValueError("the agent's latency buckets are not this stoker's")
        buckets = cumulative(list(s["remote_latency_counts"]))
        yield HistogramMetricFamily(
            "stoker_agent_remote_latency_seconds",
            "Latency of range requests to remote storage",
            buckets=buckets,
            sum_value=s["remote_latency_sum"],
        )
        yield CounterMetricFamily("stoker_agent_decodes", "Blocks decoded", value=s["decodes"])
        yield CounterMetricFamily(
            "stoker_agent_images_decoded",
            "Images of records datasets decoded by the agent (held for every local reader)",
            value=s.get("images_decoded", 0),
        )
        yield CounterMetricFamily(
            "stoker_agent_image_errors",
            "Images of records datasets that did not decode (the reader names each)",
            value=s.get("image_errors", 0),
        )
        yield CounterMetricFamily(
            "stoker_agent_prefetches",
            "Block loads started ahead of a request",
            value=s["prefetches"],
        )
        yield CounterMetricFamily(
            "stoker_agent_inline_fallbacks",
            "Blocks served inline because the memory tier had no room",
            value=s["inline_fallbacks"],
        )
        yield GaugeMetricFamily(
            "stoker_agent_pinned_bytes", "Bytes pinned by readers", value=s["pinned_bytes"]
        )
        yield GaugeMetricFamily(
            "stoker_agent_prefetch_lead_blocks",
            "Blocks resident ahead of the slowest reader",
            value=s["prefetch_lead"],
        )
        yield GaugeMetricFamily("stoker_agent_clients", "Connected readers", value=s["clients"])
        yield CounterMetricFamily(
            "stoker_agent_relay_messages",
            "Batch messages the agent sent the coordinator for its node's readers",
            value=s.get("relay_messages", 0),
        )
        yield CounterMetricFamily(
            "stoker_agent_relay_calls",
            "Coordinator calls of the node's readers those messages carried",
            value=s.get("relay_calls", 0),
        )
        yield CounterMetricFamily(
            "stoker_agent_connections_refused",
            "Connections refused because the agent served its maximum already",
            value=s.get("connections_refused", 0),
        )
        yield CounterMetricFamily(
            "stoker_agent_bad_frames",
            "Connections dropped for a malformed, oversized or unfinished frame",
            value=s.get("bad_frames", 0),
        )
