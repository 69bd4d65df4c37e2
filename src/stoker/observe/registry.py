"""What one process counts, and how Prometheus reads it.

Every part of stoker that runs in a training process counts into
:func:`registry` (plain numbers behind a lock, cheap to bump). Nothing is served
unless asked: :func:`~stoker.observe.serving.serve` starts a ``/metrics`` endpoint
(``stoker demo``, the agent and the coordinator turn theirs on; a library user
passes ``metrics_port=`` to :class:`~stoker.TokenLoader`). Worker processes count
into their own copy, and one endpoint per rank shows the whole rank, workers
included: :class:`~stoker.TokenLoader`'s workers send what changed to the main
process with each batch; the workers of torch's ``DataLoader`` iterating a
:class:`~stoker.TokenDataset` write their totals to a small file in shared
memory (:class:`~stoker.observe.export.WorkerExport`) that their parent's
collector adds up, keeping the counts of workers that have exited.

Names follow Prometheus conventions: ``stoker_<part>_<what>_<unit>``, counters
end in ``_total``, times are seconds and sizes bytes. The agent and the
coordinator export their own families (``stoker_agent_*``,
``stoker_coordinator_*``) from their processes.

This module holds the counting (:class:`Metrics`, :func:`registry`, :func:`timed`);
the rest has a module of its own and is still importable from here:
:mod:`~stoker.observe.instruments` (:class:`Histogram`, its buckets),
:mod:`~stoker.observe.exposition` (:class:`Collector`, the Prometheus view),
:mod:`~stoker.observe.workers` (a :class:`~stoker.TokenLoader` worker's counts, sent
with its batches) and :mod:`~stoker.observe.serving` (the ``/metrics`` endpoint).
"""

from __future__ import annotations

import importlib
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from stoker.observe.instruments import BUCKETS as BUCKETS
from stoker.observe.instruments import Histogram as Histogram

if TYPE_CHECKING:
    from stoker.observe.exposition import Collector as Collector
    from stoker.observe.exposition import _histogram as _histogram
    from stoker.observe.exposition import cumulative as cumulative
    from stoker.observe.serving import HTTP_CONNECTIONS as HTTP_CONNECTIONS
    from stoker.observe.serving import HTTP_TIMEOUT as HTTP_TIMEOUT
    from stoker.observe.serving import _http_server as _http_server
    from stoker.observe.serving import _served as _served
    from stoker.observe.serving import log as log
    from stoker.observe.serving import rank_port as rank_port
    from stoker.observe.serving import serve as serve
    from stoker.observe.serving import serve_once as serve_once
    from stoker.observe.serving import serve_registry as serve_registry
    from stoker.observe.workers import WorkerMeter as WorkerMeter
    from stoker.observe.workers import apply_worker as apply_worker

#: The storage counters (a process's reads from storage: datasets without an agent, or
#: the agent's own process).
STORAGE = ("requests", "bytes", "errors", "retries")
#: A records reader's images: decoded in this process, and skipped (on_error="skip").
IMAGES = ("decoded", "skipped")


class Metrics:
    """One process's counters (thread-safe)."""

    def __init__(self) -> None:
        # re-entrant: a collection can run a storage pool's finalizer (threads_closed) in
        # a thread that holds the lock already (a loader counting a batch under it)
        self.lock = threading.RLock()
        self.storage = dict.fromkeys(STORAGE, 0)
        self.storage_latency = Histogram()
        self.threads = Threads()
        self.loaders: dict[int, LoaderStats] = {}  # by rank
        self.devices: dict[int, LoaderStats] = {}  # by rank: the device tier, as training sees it
        #: a mixture's sources, by name: [seconds its readers took to hand rows, rows]
        self.sources: dict[str, list[float]] = {}
        self.images = dict.fromkeys(IMAGES, 0)
        #: the preprocessing pool, by worker address ("local": this process): [rows it
        #: made for this process's readers, seconds those requests took]
        self.pool: dict[str, list[float]] = {}
        self.pool_wait = 0.0  # seconds this process's readers waited on the pool's rows
        os.register_at_fork(after_in_child=self._forked)

    def _forked(self) -> None:
        # a fork can happen while another thread (the /metrics server) holds the lock;
        # the child's thread pools are its own (none yet)
        self.lock = threading.RLock()
        self.threads = Threads(busy=self.threads.busy, alive=self.threads.alive)

    # -- block threads ---------------------------------------------------------------
    def threads_opened(self, n: int) -> None:
        """A pool of up to ``n`` block threads (fetch, verify, decode) now exists; its
        capacity counts from now (the pool starts its threads as work arrives)."""
        with self.lock:
            self.threads.tick(time.monotonic())
            self.threads.count += n

    def threads_closed(self, n: int) -> None:
        """A pool of ``n`` block threads is gone."""
        with self.lock:
            self.threads.tick(time.monotonic())
            self.threads.count = max(0, self.threads.count - n)

    def thread_busy(self, seconds: float) -> None:
        with self.lock:
            self.threads.busy += seconds

    # -- the process's counters, for a worker's report ----------------------------
    def snapshot(self) -> dict[str, Any]:
        """What this process counted in storage and its block threads (cumulative)."""
        with self.lock:
            self.threads.tick(time.monotonic())
            return {
                "storage": {**self.storage, "latency": self.storage_latency.to_dict()},
                "threads": {"busy": self.threads.busy, "alive": self.threads.alive},
                "sources": {k: list(v) for k, v in self.sources.items()},
                "images": dict(self.images),
                "pool": {k: list(v) for k, v in self.pool.items()},
                "pool_wait": self.pool_wait,
            }

    def add(self, delta: dict[str, Any]) -> None:
        """Fold in what a worker process counted (a difference of :meth:`snapshot` s)."""
        with self.lock:
            for k in STORAGE:
                self.storage[k] += delta["storage"][k]
            self.storage_latency.add(delta["storage"]["latency"])
            self.threads.busy += delta["threads"]["busy"]
            self.threads.alive += delta["threads"]["alive"]
            for k, (secs, rows) in delta.get("sources", {}).items():
                acc = self.sources.setdefault(k, [0.0, 0.0])
                acc[0] += secs
                acc[1] += rows
            for k, n in delta.get("images", {}).items():
                self.images[k] = self.images.get(k, 0) + n
            for k, (rows, secs) in delta.get("pool", {}).items():
                acc = self.pool.setdefault(k, [0.0, 0.0])
                acc[0] += rows
                acc[1] += secs
            self.pool_wait += delta.get("pool_wait", 0.0)

    # -- the preprocessing pool ----------------------------------------------------------
    def pool_made(self, worker: str, rows: int, seconds: float) -> None:
        """Worker ``worker`` made ``rows`` rows for a reader of this process in a request
        of ``seconds``."""
        with self.lock:
            acc = self.pool.setdefault(worker, [0.0, 0.0])
            acc[0] += rows
            acc[1] += seconds

    def pool_waited(self, seconds: float) -> None:
        """A reader of this process waited ``seconds`` for the pool's rows."""
        with self.lock:
            self.pool_wait += seconds

    # -- a records reader's images ------------------------------------------------------
    def image_event(self, name: str, n: int = 1) -> None:
        """``n`` images ``decoded`` in this process, or ``skipped`` (see :data:`IMAGES`)."""
        with self.lock:
            self.images[name] += n

    # -- a mixture's sources ----------------------------------------------------------
    def source_read(self, name: str, seconds: float, rows: int) -> None:
        """Source ``name``'s reader took ``seconds`` to hand ``rows`` rows (the time a
        mixture's consumer waited on that source)."""
        with self.lock:
            acc = self.sources.get(name)
            if acc is None:
                acc = self.sources[name] = [0.0, 0.0]
            acc[0] += seconds
            acc[1] += rows

    # -- storage -------------------------------------------------------------------
    def storage_read(self, nbytes: int, seconds: float) -> None:
        with self.lock:
            self.storage["requests"] += 1
            self.storage["bytes"] += nbytes
            self.storage_latency.observe(seconds)

    def storage_event(self, name: str) -> None:
        with self.lock:
            self.storage[name] += 1

    # -- loaders ---------------------------------------------------------------------
    def loader(self, rank: int) -> LoaderStats:
        with self.lock:
            if rank not in self.loaders:
                self.loaders[rank] = LoaderStats(rank)
            return self.loaders[rank]

    def device(self, rank: int) -> LoaderStats:
        """The device tier's figures: its ``wait`` is what training waits for a batch on
        the GPU (the loader's own then measure the tier's reading thread)."""
        with self.lock:
            if rank not in self.devices:
                self.devices[rank] = LoaderStats(rank)
            return self.devices[rank]


@dataclass
class Threads:
    """The block threads of a process: how many exist, and their busy and alive seconds."""

    count: int = 0
    busy: float = 0.0
    alive: float = 0.0  # thread-seconds: count x time, summed
    stamp: float = field(default_factory=time.monotonic)

    def tick(self, now: float) -> None:
        self.alive += self.count * (now - self.stamp)
        self.stamp = now


def combine(a: dict[str, Any], b: dict[str, Any], sign: int = 1) -> dict[str, Any]:
    """``a + b`` (or ``a - b`` with ``sign=-1``) of two :meth:`Metrics.snapshot` results
    (or their differences): storage counts, latency buckets, thread seconds, a mixture's
    per-source read seconds and rows, images decoded and skipped, the preprocessing
    pool's rows and seconds by worker and the wait on it (the last ones absent from a
    snapshot written before they were)."""
    s, t = a["storage"], b["storage"]
    storage: dict[str, Any] = {k: s[k] + sign * t[k] for k in STORAGE}
    storage["latency"] = {
        "counts": [
            x + sign * y
            for x, y in zip(s["latency"]["counts"], t["latency"]["counts"], strict=True)
        ],
        "sum": s["latency"]["sum"] + sign * t["latency"]["sum"],
    }
    threads = {k: a["threads"][k] + sign * b["threads"][k] for k in ("busy", "alive")}
    sa, sb = a.get("sources", {}), b.get("sources", {})
    sources = {
        k: [x + sign * y for x, y in zip(sa.get(k, (0.0, 0.0)), sb.get(k, (0.0, 0.0)), strict=True)]
        for k in {*sa, *sb}
    }
    ia, ib = a.get("images", {}), b.get("images", {})
    images = {k: ia.get(k, 0) + sign * ib.get(k, 0) for k in IMAGES}
    pa, pb = a.get("pool", {}), b.get("pool", {})
    pool = {
        k: [x + sign * y for x, y in zip(pa.get(k, (0.0, 0.0)), pb.get(k, (0.0, 0.0)), strict=True)]
        for k in {*pa, *pb}
    }
    return {
        "storage": storage,
        "threads": threads,
        "sources": sources,
        "images": images,
        "pool": pool,
        "pool_wait": a.get("pool_wait", 0.0) + sign * b.get("pool_wait", 0.0),
    }


def delta(now: dict[str, Any], before: dict[str, Any]) -> dict[str, Any]:
    """What changed between two :meth:`Metrics.snapshot` results."""
    return combine(now, before, -1)


@dataclass
class LoaderStats:
    """A rank's loader, as training sees it.

    ``wait`` is the time the training loop spent inside ``next(loader)`` (the
    stall); ``step`` the time between getting a batch and asking for the next
    (the training step). Workers report the time they spent producing batches
    (``busy``) against the time they existed (``alive``).
    """

    rank: int
    batches: int = 0
    samples: int = 0
    tokens: int = 0
    wait: Histogram = field(default_factory=Histogram)
    step: Histogram = field(default_factory=Histogram)
    ready: int = 0  # batches produced and waiting for training, at the last hand-out
    busy: dict[int, float] = field(default_factory=dict)  # worker -> seconds producing
    alive: dict[int, float] = field(default_factory=dict)  # worker -> seconds alive
    started: float = field(default_factory=time.monotonic)
    #: a mixture's sources: name -> [samples, tokens] handed out, and the weights of the
    #: step last handed out (its target shares)
    sources: dict[str, list[int]] = field(default_factory=dict)
    targets: dict[str, float] = field(default_factory=dict)

    def sourced(
        self, names: tuple[str, ...], counts: list[int], per_row: int, targets: dict[str, float]
    ) -> None:
        """A mixture's batch: its samples per source (``counts[i]`` of ``names[i]``), the
        tokens a row holds, and its step's weights (kept, not copied)."""
        for name, n in zip(names, counts, strict=False):
            if n:
                acc = self.sources.get(name)
                if acc is None:
                    acc = self.sources[name] = [0, 0]
                acc[0] += n
                acc[1] += n * per_row
        self.targets = targets

    def handed(self, samples: int, tokens: int, wait: float, step: float | None) -> None:
        self.batches += 1
        self.samples += samples
        self.tokens += tokens
        self.wait.observe(wait)
        if step is not None:
            self.step.observe(step)

    def worker(self, worker: int, busy: float, alive: float) -> None:
        self.busy[worker] = self.busy.get(worker, 0.0) + busy
        self.alive[worker] = self.alive.get(worker, 0.0) + alive

    def summary(self) -> dict[str, Any]:
        """The stall and throughput figures, as numbers."""
        wait, step = self.wait.sum, self.step.sum
        span = wait + step
        busy, alive = sum(self.busy.values()), sum(self.alive.values())
        return {
            "rank": self.rank,
            "batches": self.batches,
            "samples": self.samples,
            "tokens": self.tokens,
            "wait_seconds": wait,
            "step_seconds": step,
            "stall_share": wait / span if span > 0 else 0.0,
            "batches_per_second": self.batches / span if span > 0 else 0.0,
            "samples_per_second": self.samples / span if span > 0 else 0.0,
            "tokens_per_second": self.tokens / span if span > 0 else 0.0,
            "ready_batches": self.ready,
            "worker_busy_share": busy / alive if alive > 0 else None,
            **({"sources": self._sources(span)} if self.sources else {}),
        }

    def _sources(self, span: float) -> dict[str, dict[str, Any]]:
        """Per source of a mixture: samples, tokens, tokens per second, the share of the
        samples handed out so far and the current target share."""
        total = sum(n for n, _ in self.sources.values())
        return {
            name: {
                "samples": n,
                "tokens": t,
                "tokens_per_second": t / span if span > 0 else 0.0,
                "share": n / total if total else 0.0,
                "target": self.targets.get(name),
            }
            for name, (n, t) in self.sources.items()
        }


_registry: Metrics | None = None
_registry_lock = threading.Lock()


def registry() -> Metrics:
    """This process's metrics, made (and its fork hook installed) on first use."""
    r = _registry
    if r is None:
        r = _make_registry()
    return r


def _make_registry() -> Metrics:
    global _registry
    with _registry_lock:
        if _registry is None:
            _registry = Metrics()
        return _registry


#: Names that lived in this module before it was split, by their module now: still
#: importable from here, each module imported when one of its names is first asked for.
_MOVED = {
    **dict.fromkeys(("Collector", "_histogram", "cumulative"), "exposition"),
    **dict.fromkeys(("WorkerMeter", "apply_worker"), "workers"),
    **dict.fromkeys(
        (
            "log",
            "_served",
            "rank_port",
            "serve_once",
            "serve",
            "HTTP_TIMEOUT",
            "HTTP_CONNECTIONS",
            "_http_server",
            "serve_registry",
        ),
        "serving",
    ),
}


def __getattr__(name: str) -> Any:
    if name == "METRICS":  # its name before 0.2: the registry, made on first use
        return registry()
    if name in _MOVED:
        return getattr(importlib.import_module(f"stoker.observe.{_MOVED[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def timed(
    batches: Iterator[Any],
    rank: int,
    count: Callable[[Any], tuple[int, int]],
    ready: Callable[[], int] | None = None,
) -> Iterator[Any]:
    """``batches``, each timed into ``rank``'s loader figures: the wait inside ``next()`` is
    the data stall, the time until the next ``next()`` the training step. ``count`` gives
    a batch's samples and tokens, ``ready`` the batches waiting after it."""
    reg = registry()
    stats = reg.loader(rank)
    handed: float | None = None
    while True:
        asked = time.perf_counter()
        try:
            batch = next(batches)
        except StopIteration:
            return
        got = time.perf_counter()
        samples, tokens = count(batch)
        with reg.lock:
            stats.handed(samples, tokens, got - asked, None if handed is None else asked - handed)
            if ready is not None:
                stats.ready = ready()
        handed = got
        yield batch
        batch = None  # (not held while the next one is read: its slot may be lent again)
