"""The coordinator's counters across epochs and its Prometheus view (``stoker_coordinator_*``)."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

from stoker.coordinator.leases import LeaseTable
from stoker.observe.instruments import Histogram

if TYPE_CHECKING:
    from stoker.coordinator.service import Coordinator


class CoordinatorMetrics:
    """The coordinator's counters across epochs, and call latencies by method."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.latency: dict[str, Histogram] = {}
        self.done = {"granted": 0, "steals": 0, "requeued": 0}
        self.by_rank: dict[int, int] = {}
        self._histogram = Histogram

    def observe(self, method: str, seconds: float) -> None:
        if not method:
            return
        with self._lock:
            h = self.latency.get(method)
            if h is None:
                h = self.latency[method] = self._histogram()
            h.observe(seconds)

    def close_table(self, t: LeaseTable) -> None:
        with self._lock:
            self.done["granted"] += t.granted
            self.done["steals"] += t.steals
            self.done["requeued"] += t.requeued
            for r, n in enumerate(t.by_rank):
                self.by_rank[r] = self.by_rank.get(r, 0) + n


class CoordinatorCollector:
    """The Prometheus view of a coordinator (``stoker_coordinator_*``)."""

    def __init__(self, coordinator: Coordinator) -> None:
        self.c = coordinator

    def collect(self) -> Any:
        from prometheus_client.core import (
            CounterMetricFamily,
            GaugeMetricFamily,
            HistogramMetricFamily,
        )

        from stoker.observe.exposition import cumulative

        c, m = self.c, self.c.metrics
        with c._lock, m._lock:
            t = c.table
            live = sum(x.alive for x in t.consumers.values())
            totals = {k: v + getattr(t, k) for k, v in m.done.items()}
            by_rank = dict(m.by_rank)
            for r, n in enumerate(t.by_rank):
                by_rank[r] = by_rank.get(r, 0) + n
            epoch, quota = t.epoch, t.quota
            consumed = t.consumed_count - sum(b - a for a, b in t.base)
            latency = {k: (list(h.counts), h.sum) for k, h in m.latency.items()}
        yield GaugeMetricFamily("stoker_coordinator_epoch", "Epoch in progress", value=epoch)
        yield GaugeMetricFamily(
            "stoker_coordinator_quota_positions", "Positions per rank this epoch", value=quota
        )
        yield GaugeMetricFamily(
            "stoker_coordinator_epoch_consumed_positions",
            "Positions of this epoch confirmed",
            value=consumed,
        )
        yield GaugeMetricFamily(
            "stoker_coordinator_live_consumers", "Consumers that have not expired", value=live
        )
        with c._pool_lock:
            now = c._now()
            needed = c.pool.needed(now)
            workers = len(c.pool.workers)
            demand = sum(s.rate for s in c.pool.demand.values())
        yield GaugeMetricFamily(
            "stoker_preprocess_workers", "Preprocessing workers offering themselves", value=workers
        )
        yield GaugeMetricFamily(
            "stoker_preprocess_workers_needed",
            "Preprocessing workers the trainers' demand needs at the workers' mean rate",
            value=needed,
        )
        yield GaugeMetricFamily(
            "stoker_preprocess_demand_rows_per_second",
            "Rows a second the trainers reading through the pool consume",
            value=demand,
        )
        yield CounterMetricFamily(
            "stoker_coordinator_leases_granted", "Leases granted", value=totals["granted"]
        )
        yield CounterMetricFamily(
            "stoker_coordinator_steals", "Leases split for an idle consumer", value=totals["steals"]
        )
        yield CounterMetricFamily(
            "stoker_coordinator_requeued_positions",
            "Positions put back in the queue when their consumer went silent",
            value=totals["requeued"],
        )
        ranks = CounterMetricFamily(
            "stoker_coordinator_consumed_positions",
            "Positions each rank confirmed (its consumption rate shows a straggler)",
            labels=["rank"],
        )
        for r in sorted(by_rank):
            ranks.add_metric([str(r)], by_rank[r])
        yield ranks
        lat = HistogramMetricFamily(
            "stoker_coordinator_request_seconds",
            "Time to answer a call, journal write included",
            labels=["method"],
        )
        for method, (counts, total) in sorted(latency.items()):
            lat.add_metric([method], cumulative(counts), total)
        yield lat
