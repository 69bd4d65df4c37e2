"""Where a running job's data path is stuck, from its metrics: ``stoker doctor`` and ``stoker top``.

Two scrapes of every endpoint (training ranks, node agents, the coordinator)
some seconds apart give rates; :func:`evidence` turns them into the figures
that matter (each rank's stall share and throughput, the workers' busy share,
the cache's hit ratio and evictions, remote bandwidth and latency, each rank's
consumption at the coordinator) and :func:`diagnose` reads them against
thresholds. Both are pure; scraping is at the edge (:func:`scrape`,
:func:`scrape_prometheus`).

Which endpoints: those given (``--endpoint``, repeated or several after one flag), else
a Prometheus server (``--prometheus``), else every endpoint the stoker processes of this
machine recorded in the runtime directory (:func:`discover`, :mod:`stoker.runtime`).

The rules, in order:

* no stall (every rank waits for data less than ``stall`` of its time):
  the GPU, i.e. the training step, is the bottleneck; nothing to change here;
* one rank stalls far more than the others: that rank straggles (named);
* a mixture's consumers wait on one source's reads most of the time they wait on
  sources, at several times the others' cost a sample: that source stalls the job
  (named);
* training waits for batches on the device while the loader keeps the device tier
  fed: the host-to-device copy;
* the node cache misses and evicts: it is smaller than the working set;
* the cache misses without evicting and storage is busy (near the bandwidth
  given, or slow to answer): storage bandwidth;
* the loader workers are busy nearly all the time: decode / preprocessing CPU;
* otherwise the batches are ready too late for another reason: prefetch depth
  (or, with the device tier, the host-to-device copy).
"""

from __future__ import annotations

import json
import math
import statistics
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from typing import Any

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


# -- scraping (I/O) -------------------------------------------------------------------
def parse(text: str) -> Samples:
    """Samples of a Prometheus text exposition: ``(name, sorted labels) -> value``."""
    from prometheus_client.parser import text_string_to_metric_families

    out: Samples = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name.startswith("stoker_"):
                out[(s.name, tuple(sorted(s.labels.items())))] = float(s.value)
    return out


def discover() -> list[str]:
    """The metrics endpoints of the stoker processes running on this machine, as their
    processes recorded them in the runtime directory (:mod:`stoker.runtime`)."""
    from stoker import runtime

    return [r["address"] for r in runtime.endpoints()]


def endpoints_or_discover(given: list[str] | None) -> list[str]:
    """``given`` (``--endpoint``), else the endpoints :func:`discover` finds; raises
    :class:`~stoker.errors.ConfigError` naming the runtime directory when there are none."""
    if given:
        return list(given)
    found = discover()
    if not found:
        from stoker import runtime
        from stoker.errors import ConfigError

        where = runtime.runtime_dir(create=False) / "endpoints"
        raise ConfigError(
            f"no running stoker process recorded a metrics endpoint in {where}; "
            "give --endpoint HOST:PORT (or --prometheus URL)"
        )
    return found


def scrape(endpoints: list[str], timeout: float = 5.0) -> dict[str, Samples]:
    """Each endpoint's samples (``host:port`` or a URL); an unreachable one is left out
    with its error under ``"!errors"``."""
    out: dict[str, Samples] = {}
    errors: dict[str, str] = {}
    for ep in endpoints:
        url = ep if "://" in ep else f"http://{ep}/metrics"
        try:
            with urllib.request.urlopen(url, timeout=timeout) as r:
                out[ep] = parse(r.read().decode())
        except OSError as exc:
            errors[ep] = str(exc)
    if errors:
        out["!errors"] = {(k, ()): 0.0 for k in errors}
    return out


def scrape_prometheus(url: str, at: float, timeout: float = 10.0) -> dict[str, Samples]:
    """Every ``stoker_*`` series a Prometheus server holds at time ``at``, by instance."""
    q = urllib.parse.urlencode({"query": '{__name__=~"stoker_.+"}', "time": f"{at:.3f}"})
    with urllib.request.urlopen(f"{url.rstrip('/')}/api/v1/query?{q}", timeout=timeout) as r:
        body = json.load(r)
    out: dict[str, Samples] = {}
    for series in body["data"]["result"]:
        labels = dict(series["metric"])
        name = labels.pop("__name__")
        instance = labels.pop("instance", "?")
        labels.pop("job", None)
        out.setdefault(instance, {})[(name, tuple(sorted(labels.items())))] = float(
            series["value"][1]
        )
    return out


# -- evidence (pure) --------------------------------------------------------------------
def _sum(s: Samples, name: str, **match: str) -> float:
    return sum(
        v
        for (n, labels), v in s.items()
        if n == name and all(dict(labels).get(k) == want for k, want in match.items())
    )


def _by(s: Samples, name: str, label: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for (n, labels), v in s.items():
        if n == name:
            key = dict(labels).get(label)
            if key is not None:
                out[key] = out.get(key, 0.0) + v
    return out


@dataclass
class Evidence:
    """Rates over the window between two scrapes."""

    seconds: float
    stall: dict[str, float] = field(default_factory=dict)  # rank -> share of time waiting
    host_stall: dict[str, float] = field(default_factory=dict)  # the loader's, under a device tier
    tokens_per_s: dict[str, float] = field(default_factory=dict)  # rank
    worker_busy: float | None = None  # share of workers' time producing batches
    busy_by_worker: dict[str, float] = field(default_factory=dict)  # "rank/worker" -> share
    thread_busy: float | None = None  # share of the block threads' time loading blocks
    hit_ratio: float | None = None  # node cache (memory tier, else disk) hits / requests
    evictions_per_s: float = 0.0
    remote_bytes_per_s: float = 0.0
    remote_latency: float | None = None  # mean seconds per remote request
    consumed_per_s: dict[str, float] = field(default_factory=dict)  # rank, at the coordinator
    gpu_sm_active: float | None = None
    #: a mixture's sources (every rank together): tokens/s, the share of the samples
    #: handed out in the window, and the share the current weights give (mean of ranks)
    source_tokens_per_s: dict[str, float] = field(default_factory=dict)
    source_share: dict[str, float] = field(default_factory=dict)
    source_target: dict[str, float] = field(default_factory=dict)
    #: seconds the consumers waited on each source's reader in the window, and the
    #: samples those reads handed (every process together)
    source_read_seconds: dict[str, float] = field(default_factory=dict)
    source_read_samples: dict[str, float] = field(default_factory=dict)
    #: the preprocessing pool, from the coordinator: its workers, and those the trainers'
    #: demand needs at the workers' mean rate
    pool_workers: float | None = None
    pool_needed: float | None = None

    def source_read_share(self) -> dict[str, float]:
        """Each source's share of the time the consumers waited on the sources' readers."""
        total = sum(self.source_read_seconds.values())
        return {k: v / total for k, v in self.source_read_seconds.items()} if total > 0 else {}


def evidence(before: dict[str, Samples], after: dict[str, Samples], seconds: float) -> Evidence:
    """The figures of :class:`Evidence`, from two scrapes ``seconds`` apart."""
    ev = Evidence(seconds)

    def delta(name: str, label: str | None = None, **match: str) -> Any:
        if label is None:
            return sum(
                _sum(after.get(ep, {}), name, **match) - _sum(before.get(ep, {}), name, **match)
                for ep in after
            )
        out: dict[str, float] = {}
        for ep in after:
            a, b = _by(after[ep], name, label), _by(before.get(ep, {}), name, label)
            for k, v in a.items():
                out[k] = out.get(k, 0.0) + v - b.get(k, 0.0)
        return out

    wait = delta("stoker_loader_wait_seconds_sum", "rank")
    step = delta("stoker_loader_step_seconds_sum", "rank")
    tokens = delta("stoker_loader_tokens_total", "rank")
    for rank in wait:
        span = wait[rank] + step.get(rank, 0.0)
        if span > 0:
            ev.stall[rank] = wait[rank] / span
            ev.tokens_per_s[rank] = tokens.get(rank, 0.0) / seconds
    # with a device tier, training waits at the device; the loader's figures then measure
    # the tier's reading thread (does the host keep up?)
    dwait = delta("stoker_device_wait_seconds_sum", "rank")
    dstep = delta("stoker_device_step_seconds_sum", "rank")
    for rank in dwait:
        span = dwait[rank] + dstep.get(rank, 0.0)
        if span > 0:
            if rank in ev.stall:
                ev.host_stall[rank] = ev.stall[rank]
            ev.stall[rank] = dwait[rank] / span
    per: dict[str, list[float]] = {}
    for ep in after:
        for name, slot in (("stoker_loader_worker_busy_seconds_total", 0),
                           ("stoker_loader_worker_alive_seconds_total", 1)):  # fmt: skip
            for (n, labels), v in after[ep].items():
                if n != name:
                    continue
                lab = dict(labels)
                key = f"{lab.get('rank')}/{lab.get('worker')}"
                pair = per.setdefault(key, [0.0, 0.0])
                pair[slot] += v - before.get(ep, {}).get((n, labels), 0.0)
    ev.busy_by_worker = {k: b / a for k, (b, a) in per.items() if a > 0}
    busy = delta("stoker_loader_worker_busy_seconds_total")
    alive = delta("stoker_loader_worker_alive_seconds_total")
    if alive > 0:
        ev.worker_busy = busy / alive
    tbusy = delta("stoker_loader_thread_busy_seconds_total")
    talive = delta("stoker_loader_thread_alive_seconds_total")
    if talive > 0:
        ev.thread_busy = tbusy / talive
    for tier in ("memory", "disk"):
        hits = delta(f"stoker_agent_{tier}_requests_total", result="hit")
        misses = delta(f"stoker_agent_{tier}_requests_total", result="miss")
        if hits + misses > 0:
            ev.hit_ratio = hits / (hits + misses)
            break
    ev.evictions_per_s = (
        delta("stoker_agent_memory_evictions_total") + delta("stoker_agent_disk_evictions_total")
    ) / seconds
    remote = delta("stoker_agent_remote_read_bytes_total") + delta(
        "stoker_storage_read_bytes_total"
    )
    ev.remote_bytes_per_s = remote / seconds
    lat_sum = delta("stoker_agent_remote_latency_seconds_sum") + delta(
        "stoker_storage_request_seconds_sum"
    )
    lat_n = delta("stoker_agent_remote_latency_seconds_count") + delta(
        "stoker_storage_request_seconds_count"
    )
    if lat_n > 0:
        ev.remote_latency = lat_sum / lat_n
    ev.consumed_per_s = {
        r: v / seconds
        for r, v in delta("stoker_coordinator_consumed_positions_total", "rank").items()
    }
    gpu = [
        v for s in after.values() for (n, _), v in s.items() if n == "stoker_gpu_sm_active_ratio"
    ]
    if gpu:
        ev.gpu_sm_active = sum(gpu) / len(gpu)
    src_tokens = delta("stoker_loader_source_tokens_total", "source")
    src_samples = delta("stoker_loader_source_samples_total", "source")
    ev.source_tokens_per_s = {k: v / seconds for k, v in sorted(src_tokens.items())}
    total = sum(src_samples.values())
    if total > 0:
        ev.source_share = {k: v / total for k, v in sorted(src_samples.items())}
    targets: dict[str, list[float]] = {}
    for s in after.values():
        for (n, labels), v in s.items():
            if n == "stoker_loader_source_target_share":
                targets.setdefault(dict(labels).get("source", "?"), []).append(v)
    ev.source_target = {k: sum(v) / len(v) for k, v in sorted(targets.items())}
    ev.source_read_seconds = dict(
        sorted(delta("stoker_loader_source_read_seconds_total", "source").items())
    )
    ev.source_read_samples = dict(
        sorted(delta("stoker_loader_source_read_samples_total", "source").items())
    )
    for name, attr in (("stoker_preprocess_workers", "pool_workers"),
                       ("stoker_preprocess_workers_needed", "pool_needed")):  # fmt: skip
        seen = [v for s in after.values() for (n, _), v in s.items() if n == name]
        if seen:
            setattr(ev, attr, max(seen))
    return ev


# -- diagnosis (pure) ---------------------------------------------------------------------
@dataclass(frozen=True)
class Thresholds:
    stall: float = 0.05  # a rank waiting for data more than this share of its time
    straggler: float = 2.0  # a rank stalling this many times the median (and over `stall`)
    hit_ratio: float = 0.9  # a cache hitting less than this misses
    evictions_per_s: float = 0.0  # evicting faster than this while missing: too small
    storage_use: float = 0.85  # of the storage bandwidth given
    remote_latency: float = 0.05  # seconds per remote request that count as slow storage
    worker_busy: float = 0.85  # workers busier than this are the bottleneck
    worker_straggler: float = 1.5  # a worker this many times busier than the others
    source_read: float = 0.5  # a source taking this share of the time read on sources
    source_slower: float = 3.0  # ... and this many times the others' time a sample


@dataclass
class Diagnosis:
    # none | straggler | source | h2d | cache | storage | pool | cpu | prefetch | no-data
    bottleneck: str
    summary: str
    advice: str
    evidence: list[str]
    rank: str | None = None
    worker: str | None = None  # a straggling worker of ``rank``
    source: str | None = None  # a mixture's source whose reads stall the job

    def to_dict(self) -> dict[str, Any]:
        return {
            "bottleneck": self.bottleneck,
            "summary": self.summary,
            "advice": self.advice,
            "evidence": self.evidence,
            "rank": self.rank,
            "worker": self.worker,
            "source": self.source,
        }


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.1f}%"


def diagnose(
    ev: Evidence, storage_bandwidth: float | None = None, t: Thresholds = Thresholds()
) -> Diagnosis:
    """The bottleneck :class:`Evidence` points at, with the numbers that show it."""
    if not ev.stall:
        return Diagnosis(
            "no-data",
            "no training rank reported batches in the window",
            "point stoker doctor at the ranks' metrics endpoints (TokenLoader(metrics_port=...)) "
            "while the job trains, or widen --window",
            [],
        )
    stalls = ev.stall
    median = statistics.median(stalls.values())
    worst = max(stalls, key=lambda r: stalls[r])
    lines = [
        "data stall by rank: "
        + ", ".join(f"{r}: {_pct(v)}" for r, v in sorted(stalls.items(), key=lambda x: int(x[0])))
        + f" (threshold {_pct(t.stall)})",
        f"worker busy share: {_pct(ev.worker_busy)} (threshold {_pct(t.worker_busy)}), "
        f"block threads busy {_pct(ev.thread_busy)}",
        f"cache hit ratio: {_pct(ev.hit_ratio)} (threshold {_pct(t.hit_ratio)}), "
        f"evictions {ev.evictions_per_s:.1f}/s",
        f"remote reads: {ev.remote_bytes_per_s / 1e6:.1f} MB/s"
        + (f" of {storage_bandwidth / 1e6:.1f} MB/s given" if storage_bandwidth else "")
        + ", mean request "
        + ("n/a" if ev.remote_latency is None else f"{1e3 * ev.remote_latency:.1f} ms")
        + f" (slow above {1e3 * t.remote_latency:.0f} ms)",
    ]
    if ev.consumed_per_s:
        lines.append(
            "consumption at the coordinator (positions/s): "
            + ", ".join(f"{r}: {v:.0f}" for r, v in sorted(ev.consumed_per_s.items()))
        )
    if ev.gpu_sm_active is not None:
        lines.append(f"GPU SM active: {_pct(ev.gpu_sm_active)} (healthy above 85%)")
    if ev.pool_workers is not None:
        lines.append(
            f"preprocessing pool: {ev.pool_workers:.0f} workers, the trainers' demand needs "
            f"{ev.pool_needed or 0:.1f}"
        )
    per_sample = _read_cost(ev)
    if per_sample:
        share = ev.source_read_share()
        lines.append(
            "a mixture's reads by source (share of the time waited on sources, ms a sample): "
            + ", ".join(
                f"{k}: {_pct(share.get(k))}, {1e3 * v:.2f} ms" for k, v in per_sample.items()
            )
        )
    if stalls[worst] <= t.stall:
        return Diagnosis(
            "none",
            "no data bottleneck: every rank waits for data less than "
            f"{_pct(t.stall)} of its time; the GPU (the training step) is the bottleneck",
            "nothing to change on the data side",
            lines,
        )
    if len(stalls) > 1:
        others = [v for r, v in stalls.items() if r != worst]
        rest = statistics.median(others)
        if rest <= t.stall and stalls[worst] > t.straggler * max(rest, t.stall / t.straggler):
            return Diagnosis(
                "straggler",
                f"rank {worst} straggles: it waits for data {_pct(stalls[worst])} of its time, "
                f"the others {_pct(rest)}",
                f"look at rank {worst}'s machine (its storage link, cache, CPU); with a "
                "coordinator its work is rebalanced, without one consider coordinator=",
                lines,
                rank=worst,
            )
    by = ev.busy_by_worker
    if len(by) > 1:
        slow = max(by, key=lambda k: by[k])
        rest = statistics.median(v for k, v in by.items() if k != slow)
        if by[slow] >= t.worker_busy and by[slow] > t.worker_straggler * max(rest, 0.05):
            rank, worker = slow.split("/")
            return Diagnosis(
                "straggler",
                f"worker {worker} of rank {rank} straggles: busy {_pct(by[slow])} of its time, "
                f"the others {_pct(rest)}; the rank hands batches out in order, so it waits "
                "for that worker",
                "look at what that worker reads (its share of the data, its core); more "
                "workers spread its share",
                [
                    *lines,
                    "worker busy share: "
                    + ", ".join(f"{k}: {_pct(v)}" for k, v in sorted(by.items())),
                ],
                rank=rank,
                worker=worker,
            )
    stalling = _slow_source(ev, per_sample, t)
    if stalling is not None:
        culprit, read_share, typical = stalling
        return Diagnosis(
            "source",
            f"source {culprit} of the mixture stalls the job: the consumers waited on its reads "
            f"{_pct(read_share)} of the time they waited on the sources, {1e3 * per_sample[culprit]:.2f} "
            f"ms a sample against {1e3 * typical:.2f} ms for the others",
            f"look at where {culprit} is stored (its storage's bandwidth and latency) and how: "
            "cache it on the nodes (cache_dir= on its dataset), store it in larger blocks or "
            "nearer the job; lowering its weight also lowers what it must deliver",
            lines,
            source=culprit,
        )
    if ev.host_stall and max(ev.host_stall.values()) <= t.stall:
        host = ", ".join(f"{r}: {_pct(v)}" for r, v in sorted(ev.host_stall.items()))
        return Diagnosis(
            "h2d",
            f"host-to-device copy: training waits {_pct(median)} of its time for batches on the "
            "GPU while the loader keeps its device tier fed (host stall "
            f"{_pct(max(ev.host_stall.values()))})",
            "raise the device tier's depth (device_depth=), check that its buffers are pinned "
            "(a CUDA machine), send narrower payloads (tokens as uint16), or overlap the copy "
            "with more of the step",
            [*lines, f"host stall under the device tier: {host}"],
        )
    missing = ev.hit_ratio is not None and ev.hit_ratio < t.hit_ratio
    if missing and ev.evictions_per_s > t.evictions_per_s:
        return Diagnosis(
            "cache",
            f"cache misses: the node cache hits {_pct(ev.hit_ratio)} and evicts "
            f"{ev.evictions_per_s:.1f} blocks/s, so it is smaller than the working set",
            "raise the cache's size (TokenDataset cache_limit / shm_limit, or the agent's "
            "--cache-limit / --shm-limit), or shrink the shuffle window (window_shards)",
            lines,
        )
    busy_storage = (
        storage_bandwidth is not None and ev.remote_bytes_per_s >= t.storage_use * storage_bandwidth
    ) or (ev.remote_latency is not None and ev.remote_latency >= t.remote_latency)
    if (missing or ev.hit_ratio is None) and busy_storage:
        return Diagnosis(
            "storage",
            f"storage bandwidth: reads from storage run at {ev.remote_bytes_per_s / 1e6:.1f} MB/s"
            + (
                f" (mean request {1e3 * ev.remote_latency:.0f} ms)"
                if ev.remote_latency is not None
                else ""
            )
            + " and the ranks wait for them",
            "cache the dataset on the nodes (cache_dir=) so later epochs read locally, use "
            "larger blocks, or raise the storage's bandwidth; more parallel requests help only "
            "while the link is not full",
            lines,
        )
    # (demand is what the trainers would read were they never kept waiting on the pool:
    # past the workers there are by a tenth, not by a window's noise)
    if ev.pool_needed is not None and ev.pool_needed > 1.1 * (ev.pool_workers or 0):
        return Diagnosis(
            "pool",
            f"the preprocessing pool is too small: {ev.pool_workers or 0:.0f} workers make the "
            f"rows the ranks wait for, and their demand needs {ev.pool_needed:.1f} at the "
            "workers' mean rate",
            f"start {math.ceil(ev.pool_needed - (ev.pool_workers or 0)):.0f} more "
            "preprocessing workers (stoker preprocess-worker --coordinator ...), or let an "
            "autoscaler follow stoker_preprocess_workers_needed",
            lines,
        )
    if ev.worker_busy is not None and ev.worker_busy >= t.worker_busy:
        return Diagnosis(
            "cpu",
            f"decode / preprocessing CPU: the loader workers are busy {_pct(ev.worker_busy)} "
            "of their time",
            "add loader workers (num_workers), move heavy preprocessing off the training "
            "machine, or store data that is cheaper to decode (lower zstd level)",
            lines,
        )
    return Diagnosis(
        "prefetch",
        f"the ranks wait for data ({_pct(median)} median) though storage, cache and workers "
        "have room: batches are requested before they are ready",
        "raise prefetch (TokenLoader prefetch=) or num_workers; with the device tier, check the "
        "host-to-device copy",
        lines,
    )


def _read_cost(ev: Evidence) -> dict[str, float]:
    """Seconds a sample each source's reads cost in the window (sources read from)."""
    return {
        k: secs / ev.source_read_samples[k]
        for k, secs in ev.source_read_seconds.items()
        if ev.source_read_samples.get(k, 0) > 0
    }


def _slow_source(
    ev: Evidence, per_sample: dict[str, float], t: Thresholds
) -> tuple[str, float, float] | None:
    """The source whose reads take most of the time the consumers wait on sources, at
    several times the others' cost a sample, with that share and the others' median cost;
    None when no one source does."""
    if len(per_sample) < 2:
        return None
    share = ev.source_read_share()
    slow = max(per_sample, key=lambda k: share.get(k, 0.0))
    rest = statistics.median(v for k, v in per_sample.items() if k != slow)
    if share.get(slow, 0.0) >= t.source_read and per_sample[slow] > t.source_slower * rest:
        return slow, share[slow], rest
    return None


def render(d: Diagnosis) -> str:
    lines = [f"bottleneck: {d.bottleneck}", f"  {d.summary}", f"  what to change: {d.advice}"]
    if d.evidence:
        lines.append("evidence:")
        lines += [f"  {e}" for e in d.evidence]
    return "\n".join(lines)
