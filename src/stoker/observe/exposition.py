"""The Prometheus view of a process's :class:`~stoker.observe.registry.Metrics`:
:class:`Collector` (with the counts of torch DataLoader workers and of the GPU) and
:func:`cumulative`, a :class:`~stoker.observe.instruments.Histogram` as Prometheus buckets."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from stoker.observe import registry as _process
from stoker.observe.instruments import BUCKETS
from stoker.observe.registry import Metrics, registry


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
        if m is _process._registry:  # this process's own: its DataLoader workers' exports too
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
        images = own.get("images", {})
        yield CounterMetricFamily(
            "stoker_images_decoded",
            "Images a records reader decoded in this process (and its workers)",
            value=images.get("decoded", 0),
        )
        yield CounterMetricFamily(
            "stoker_images_skipped",
            "Images that did not decode, skipped (on_error='skip'; their rows are zeros, "
            "label -100)",
            value=images.get("skipped", 0),
        )
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
        mixed = [(rank, s["sources"]) for rank, (s, *_) in loaders.items() if "sources" in s]
        if mixed:
            src_samples, src_tokens = (
                CounterMetricFamily(
                    f"stoker_loader_source_{what}",
                    f"{what.capitalize()} of each source of a mixture handed to training",
                    labels=["rank", "source"],
                )
                for what in ("samples", "tokens")
            )
            target = GaugeMetricFamily(
                "stoker_loader_source_target_share",
                "The share of its samples a mixture's current weights give each source",
                labels=["rank", "source"],
            )
            for rank, per in mixed:
                for name, f in per.items():
                    lab = [str(rank), name]
                    src_samples.add_metric(lab, f["samples"])
                    src_tokens.add_metric(lab, f["tokens"])
                    if f["target"] is not None:
                        target.add_metric(lab, f["target"])
            yield from (src_samples, src_tokens, target)
        if own.get("sources"):
            read_s = CounterMetricFamily(
                "stoker_loader_source_read_seconds",
                "Seconds a mixture's consumers waited on each source's reader for rows",
                labels=["source"],
            )
            read_n = CounterMetricFamily(
                "stoker_loader_source_read_samples",
                "Samples a mixture's consumers read from each source",
                labels=["source"],
            )
            for name, (secs, rows) in sorted(own["sources"].items()):
                read_s.add_metric([name], secs)
                read_n.add_metric([name], rows)
            yield from (read_s, read_n)
        if own.get("pool"):
            rows_f = CounterMetricFamily(
                "stoker_preprocess_rows",
                "Rows each preprocessing worker made for this process's readers "
                '("local": this process)',
                labels=["worker"],
            )
            secs_f = CounterMetricFamily(
                "stoker_preprocess_request_seconds",
                "Seconds the requests to each preprocessing worker took",
                labels=["worker"],
            )
            for name, (rows, secs) in sorted(own["pool"].items()):
                rows_f.add_metric([name], rows)
                secs_f.add_metric([name], secs)
            yield from (rows_f, secs_f)
            yield CounterMetricFamily(
                "stoker_preprocess_wait_seconds",
                "Seconds this process's readers waited for the preprocessing pool's rows",
                value=own.get("pool_wait", 0.0),
            )
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
