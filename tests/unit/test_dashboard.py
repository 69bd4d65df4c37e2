"""Every query of the Grafana dashboard names only metrics stoker exports."""

from __future__ import annotations

import json
import re
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest

from stoker.coordinator.metrics import CoordinatorCollector
from stoker.coordinator.service import Coordinator
from stoker.observe import nvml as gpu
from stoker.observe.agent import LATENCY_BUCKETS, AgentCollector, Counters
from stoker.observe.registry import Collector, Metrics

DASHBOARD = Path(__file__).resolve().parents[2] / "dashboards" / "stoker.json"


def exported(tmp_path: Path) -> set[str]:
    """Sample names in the exposition of every part (the GPU's from its family list)."""
    metrics = Metrics()
    stats = metrics.loader(0)
    stats.handed(8, 8 * 129, 0.01, 0.1)
    stats.worker(0, 0.5, 1.0)
    metrics.device(0).handed(8, 8 * 129, 0.02, 0.1)
    agent_stats = {name: 0 for name in Counters.NAMES}
    agent_stats.update(
        memory_bytes=0, memory_limit=1, disk_bytes=0, disk_limit=1, pinned_bytes=0,
        clients=0, prefetch_lead=0, remote_latency_buckets=list(LATENCY_BUCKETS),
        remote_latency_counts=[0] * (len(LATENCY_BUCKETS) + 1), remote_latency_sum=0.0,
    )  # fmt: skip
    coordinator = Coordinator(100, 2, str(tmp_path / "state"))
    coordinator.metrics.observe("Lease", 0.001)
    registry = CollectorRegistry(auto_describe=False)
    for c in (Collector(metrics), AgentCollector(lambda: agent_stats),
              CoordinatorCollector(coordinator)):  # fmt: skip
        registry.register(c)
    text = generate_latest(registry).decode()
    names = {line.split("{")[0].split(" ")[0] for line in text.splitlines() if line[:1] != "#"}
    return names | set(gpu.FAMILIES)


def test_every_dashboard_query_names_an_exported_metric(tmp_path: Path) -> None:
    dash = json.loads(DASHBOARD.read_text())
    names = exported(tmp_path)
    queries = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
    assert len(queries) >= 20
    used = set()
    for q in queries:
        for name in re.findall(r"\bstoker_[a-z0-9_]+", q):
            assert name in names, f"{name} (in {q!r}) is not exported"
            used.add(name)
    # the health table and the stall, cache and coordinator panels are all there
    for needed in ("stoker_agent_remote_read_bytes_total", "stoker_gpu_sm_active_ratio",
                   "stoker_loader_worker_busy_seconds_total", "stoker_loader_wait_seconds_sum",
                   "stoker_agent_memory_requests_total", "stoker_coordinator_steals_total"):  # fmt: skip
        assert needed in used, needed
    # variables the queries use are defined
    defined = {v["name"] for v in dash["templating"]["list"]}
    for q in queries:
        for var in re.findall(r"\$([a-z_]+)", q):
            assert var in defined, var
