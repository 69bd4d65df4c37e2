"""What one process counts, and how Prometheus reads it.

Every part of stoker that runs in a training process counts into
:func:`registry` (plain numbers behind a lock, cheap to bump). Nothing is served
unless asked: :func:`serve` starts a ``/metrics`` endpoint (``stoker demo``, the
agent and the coordinator turn theirs on; a library user passes
``metrics_port=`` to :class:`~stoker.TokenLoader`). Worker processes count
into their own copy, and one endpoint per rank shows the whole rank, workers
included: :class:`~stoker.TokenLoader`'s workers send what changed to the main
process with each batch; the workers of torch's ``DataLoader`` iterating a
:class:`~stoker.TokenDataset` write their totals to a small file in shared
memory (:class:`WorkerExport`) that their parent's collector adds up, keeping
the counts of workers that have exited.

Names follow Prometheus conventions: ``stoker_<part>_<what>_<unit>``, counters
end in ``_total``, times are seconds and sizes bytes. The agent and the
coordinator export their own families (``stoker_agent_*``,
``stoker_coordinator_*``) from their processes.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger("stoker.metrics")

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


#: The storage counters (a process's reads from storage: datasets without an agent, or
#: the agent's own process).
STORAGE = ("requests", "bytes", "errors", "retries")


class Metrics:
    """One process's counters (thread-safe)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.storage = dict.fromkeys(STORAGE, 0)
        self.storage_latency = Histogram()
        self.threads = Threads()
        self.loaders: dict[int, LoaderStats] = {}  # by rank
        self.devices: dict[int, LoaderStats] = {}  # by rank: the device tier, as training sees it
        os.register_at_fork(after_in_child=self._forked)

    def _forked(self) -> None:
        # a fork can happen while another thread (the /metrics server) holds the lock;
        # the child's thread pools are its own (none yet)
        self.lock = threading.Lock()
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
            }

    def add(self, delta: dict[str, Any]) -> None:
        """Fold in what a worker process counted (a difference of :meth:`snapshot` s)."""
        with self.lock:
            for k in STORAGE:
                self.storage[k] += delta["storage"][k]
            self.storage_latency.add(delta["storage"]["latency"])
            self.threads.busy += delta["threads"]["busy"]
            self.threads.alive += delta["threads"]["alive"]

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
    (or their differences): storage counts, latency buckets, thread seconds."""
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
    return {"storage": storage, "threads": threads}


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
            "tokens_per_second": self.tokens / span if span > 0 else 0.0,
            "ready_batches": self.ready,
            "worker_busy_share": busy / alive if alive > 0 else None,
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


def __getattr__(name: str) -> Any:
    if name == "METRICS":  # its name before 0.2: the registry, made on first use
        return registry()
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


class Collector:
    """The Prometheus view of :func:`registry` (and of the GPU, when NVML sees one)."""

    def __init__(self, metrics: Metrics | None = None) -> None:
        self.metrics = metrics if metrics is not None else registry()

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import (
            CounterMetricFamily,
            GaugeMetricFamily,
            HistogramMetricFamily,
        )

        m = self.metrics
        own = m.snapshot()
        with m.lock:
            loaders = {r: (ls.summary(), ls.wait.to_dict(), ls.step.to_dict(),
                           dict(ls.busy), dict(ls.alive)) for r, ls in m.loaders.items()}  # fmt: skip
            devices = [(str(r), ls.batches, ls.wait.to_dict(), ls.step.to_dict())
                       for r, ls in m.devices.items()]  # fmt: skip
        workers: dict[tuple[int, int], list[float]] = {}  # rank, worker -> [busy, alive]
        if m is _registry:  # this process's own: its DataLoader workers' exports too
            from stoker.observe.export import with_exported

            own, workers = with_exported(own)
        storage, latency, threads = own["storage"], own["storage"]["latency"], own["threads"]
        for name, help_ in (
            ("requests", "Requests to storage"),
            ("bytes", "Bytes read from storage"),
            ("errors", "Failed storage requests (each attempt)"),
            ("retries", "Storage requests retried"),
        ):
            unit = "read_bytes" if name == "bytes" else name
            yield CounterMetricFamily(f"stoker_storage_{unit}", help_, value=storage[name])
        yield _histogram(
            HistogramMetricFamily,
            "stoker_storage_request_seconds",
            "Latency of storage requests",
            latency,
        )
        yield CounterMetricFamily(
            "stoker_loader_thread_busy_seconds",
            "Seconds the block threads (fetch, verify, decode) spent loading blocks",
            value=threads["busy"],
        )
        yield CounterMetricFamily(
            "stoker_loader_thread_alive_seconds",
            "Capacity of the block-thread pools, in thread-seconds (pool size x seconds)",
            value=threads["alive"],
        )
        batches = CounterMetricFamily(
            "stoker_loader_batches", "Batches handed to training", labels=["rank"]
        )
        samples = CounterMetricFamily(
            "stoker_loader_samples", "Samples handed to training", labels=["rank"]
        )
        tokens = CounterMetricFamily(
            "stoker_loader_tokens", "Tokens handed to training", labels=["rank"]
        )
        ready = GaugeMetricFamily(
            "stoker_loader_ready_batches",
            "Batches produced and waiting for training (the prefetch queue)",
            labels=["rank"],
        )
        busy = CounterMetricFamily(
            "stoker_loader_worker_busy_seconds",
            "Seconds loader workers spent producing batches",
            labels=["rank", "worker"],
        )
        alive = CounterMetricFamily(
            "stoker_loader_worker_alive_seconds",
            "Seconds loader workers existed",
            labels=["rank", "worker"],
        )
        waits = []
        steps = []
        for rank, (s, wait, step, b, a) in loaders.items():
            lab = [str(rank)]
            batches.add_metric(lab, s["batches"])
            samples.add_metric(lab, s["samples"])
            tokens.add_metric(lab, s["tokens"])
            ready.add_metric(lab, s["ready_batches"])
            for w in b:
                acc = workers.setdefault((rank, w), [0.0, 0.0])
                acc[0] += b[w]
                acc[1] += a.get(w, 0.0)
            waits.append((lab, wait))
            steps.append((lab, step))
        for (rank, w), (b_, a_) in sorted(workers.items()):
            busy.add_metric([str(rank), str(w)], b_)
            alive.add_metric([str(rank), str(w)], a_)
        yield from (batches, samples, tokens, ready, busy, alive)
        yield _histogram(
            HistogramMetricFamily,
            "stoker_loader_wait_seconds",
            "Time the training loop waited for each batch (the data stall)",
            None,
            waits,
        )
        yield _histogram(
            HistogramMetricFamily,
            "stoker_loader_step_seconds",
            "Time between handing out a batch and the next request (the training step)",
            None,
            steps,
        )
        if devices:
            dev_batches = CounterMetricFamily(
                "stoker_device_batches",
                "Batches the device tier handed to training",
                labels=["rank"],
            )
            for drank, n, _, _ in devices:
                dev_batches.add_metric([drank], n)
            yield dev_batches
            yield _histogram(
                HistogramMetricFamily,
                "stoker_device_wait_seconds",
                "Time training waited for each batch on the device (the stall it sees)",
                None,
                [([r], w) for r, _, w, _ in devices],
            )
            yield _histogram(
                HistogramMetricFamily,
                "stoker_device_step_seconds",
                "Time between a device batch handed out and the next request (the step)",
                None,
                [([r], s) for r, _, _, s in devices],
            )
        from stoker.observe import nvml

        yield from nvml.collect()


def _histogram(
    family: Any,
    name: str,
    help_: str,
    one: dict[str, Any] | None,
    labelled: list[tuple[list[str], dict[str, Any]]] | None = None,
) -> Any:
    fam = family(name, help_, labels=["rank"] if labelled is not None else None)
    rows: list[tuple[list[str], dict[str, Any] | None]] = (
        list(labelled) if labelled is not None else [([], one)]
    )
    for labels, h in rows:
        assert h is not None
        fam.add_metric(labels, cumulative(h["counts"]), h["sum"])
    return fam


def cumulative(counts: list[int]) -> list[tuple[str, int]]:
    """Prometheus buckets (``le`` label, cumulative count) of a :class:`Histogram`'s counts."""
    buckets, acc = [], 0
    for bound, n in zip([*BUCKETS, float("inf")], counts, strict=True):
        acc += n
        buckets.append(("+Inf" if bound == float("inf") else repr(bound), acc))
    return buckets


class WorkerMeter:
    """A loader worker's counting: what changed since its last batch message."""

    def __init__(self) -> None:
        self.last = registry().snapshot()  # a forked worker starts with its parent's counts
        self.since = time.monotonic()

    def delta(self, busy: float) -> dict[str, Any]:
        now, t = registry().snapshot(), time.monotonic()
        out = {**delta(now, self.last), "busy": busy, "alive": t - self.since}
        self.last, self.since = now, t
        return out


def apply_worker(rank: int, worker: int, change: dict[str, Any]) -> None:
    """Fold a worker's :meth:`WorkerMeter.delta` into this (the main) process's metrics."""
    reg = registry()
    reg.add(change)
    stats = reg.loader(rank)
    with reg.lock:
        stats.worker(worker, change["busy"], change["alive"])


_served: dict[int, int | None] = {}


def rank_port(port: int, local_rank: int) -> int:
    """The port a rank serves on: ``port`` plus its local rank (``0``: any free port)."""
    return 0 if port == 0 else port + local_rank


def serve_once(port: int, local_rank: int = 0, addr: str = "127.0.0.1") -> int | None:
    """:func:`serve` on :func:`rank_port` unless this process already serves for it."""
    key = rank_port(port, local_rank)
    with registry().lock:
        if _served.get(key) is not None:
            return _served[key]
    got = serve(key, addr, role=f"rank {local_rank}")
    with registry().lock:
        _served[key] = got
    return got


def serve(
    port: int, addr: str = "127.0.0.1", extra: list[Any] | None = None, role: str = "rank"
) -> int | None:
    """Serve this process's metrics (and ``extra`` collectors) at ``http://addr:port/metrics``;
    returns the port bound (see :func:`serve_registry`)."""
    from prometheus_client import CollectorRegistry

    registry = CollectorRegistry(auto_describe=False)
    registry.register(Collector())
    for c in extra or []:
        registry.register(c)
    return serve_registry(registry, port, addr, role)


#: Seconds a /metrics client may take to send its request (and to read the answer).
HTTP_TIMEOUT = 10.0
#: Scrapes served at once; one more is closed unanswered.
HTTP_CONNECTIONS = 32


def _http_server(registry: Any, addr: str, port: int) -> Any:
    """A ``/metrics`` server (prometheus_client's WSGI app) that no client can hold: each
    connection gets :data:`HTTP_TIMEOUT` and a thread, at most :data:`HTTP_CONNECTIONS`."""
    import socketserver
    from wsgiref.simple_server import WSGIRequestHandler, WSGIServer

    from prometheus_client import make_wsgi_app

    class Handler(WSGIRequestHandler):
        timeout = HTTP_TIMEOUT  # a request sent in part and then silence is dropped

        def log_message(self, format: str, *args: Any) -> None:
            pass

    class Server(socketserver.ThreadingMixIn, WSGIServer):
        daemon_threads = True
        slots = threading.BoundedSemaphore(HTTP_CONNECTIONS)

        def process_request(self, request: Any, client_address: Any) -> None:
            if not self.slots.acquire(blocking=False):
                self.shutdown_request(request)
                return
            super().process_request(request, client_address)

        def process_request_thread(self, request: Any, client_address: Any) -> None:
            try:
                super().process_request_thread(request, client_address)
            finally:
                self.slots.release()

        def handle_error(self, request: Any, client_address: Any) -> None:
            # a client that stalled (timed out) or went away is dropped without a
            # traceback in the training job's log; anything else is still printed
            import sys

            if not isinstance(sys.exc_info()[1], (TimeoutError, ConnectionError)):
                super().handle_error(request, client_address)

    server = Server((addr, port), Handler)
    server.set_app(make_wsgi_app(registry))
    threading.Thread(target=server.serve_forever, daemon=True, name="stoker-metrics").start()
    return server


def serve_registry(registry: Any, port: int, addr: str = "127.0.0.1", role: str = "") -> int | None:
    """Serve ``registry`` on ``addr:port`` and record the address in the runtime directory
    (:func:`stoker.runtime.announce`), where ``stoker doctor`` and ``stoker top`` find it.

    ``port=0`` picks a free port. A port that is taken (another job, a second agent) is a
    warning, never an error: the endpoint moves to a free port, and None comes back only
    when no port can be bound at all. Metrics never stop training."""
    from stoker import runtime

    try:
        server = _http_server(registry, addr, port)
    except OSError as exc:
        if port == 0:
            log.warning("no metrics endpoint on %s: %s", addr, exc)
            return None
        try:
            server = _http_server(registry, addr, 0)
        except OSError as exc2:
            log.warning("no metrics endpoint: port %d: %s; no free port: %s", port, exc, exc2)
            return None
        log.warning(
            "metrics port %d is taken (%s); /metrics moved to %s:%d (stoker top finds it)",
            port,
            exc,
            addr,
            server.server_port,
        )
    got = int(server.server_port)
    runtime.announce(role or "metrics", addr, got)
    return got
