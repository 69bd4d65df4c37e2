"""torch DataLoader workers' counts reach their parent's /metrics (real workers, real nginx)."""

from __future__ import annotations

import hashlib
import os
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families
from torch.utils.data import DataLoader, IterableDataset

from stoker import Metered, TokenDataset
from stoker.observe.export import export_dir
from stoker.observe.registry import serve

from .helpers import Written, assert_exactly_once

SEQ_LEN = 32


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of the endpoint: (name, sorted labels) -> value."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as r:
        text = r.read().decode()
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(m: dict, name: str, **labels: str) -> float:
    return m.get((name, tuple(sorted(labels.items()))), 0.0)


def test_dataloader_workers_counts_reach_the_parent(serve_dir, small_dataset: Written) -> None:
    origin, url = serve_dir(small_dataset.path)
    port = serve(0)
    ds = TokenDataset(url, SEQ_LEN, batch_size=4, shard_size=8, window_shards=4, seed=3)
    n_before = len(origin.access_log())
    before = scrape(port)
    dl = DataLoader(ds, batch_size=4, num_workers=2, timeout=120)

    # while the workers live: after a batch from each, both have reported
    it = iter(dl)
    ids = [*next(it)["sample_id"].tolist(), *next(it)["sample_id"].tolist()]
    live = scrape(port)
    for w in ("0", "1"):
        assert value(live, "stoker_loader_worker_busy_seconds_total", rank="0", worker=w) > 0
    assert value(live, "stoker_storage_read_bytes_total") > value(
        before, "stoker_storage_read_bytes_total"
    )
    for batch in it:
        ids += batch["sample_id"].tolist()
    assert_exactly_once(ids, ds.num_samples)
    del it  # the workers exit (not persistent)

    after = scrape(port)
    log = origin.access_log()[n_before:]
    assert log, "the workers read nothing from the origin"
    # every byte and request the workers made is counted once, none lost at their exit
    got = value(after, "stoker_storage_read_bytes_total") - value(
        before, "stoker_storage_read_bytes_total"
    )
    assert got == sum(r.bytes_sent for r in log)
    requests = value(after, "stoker_storage_requests_total") - value(
        before, "stoker_storage_requests_total"
    )
    assert requests == len(log)
    latency = value(after, "stoker_storage_request_seconds_count") - value(
        before, "stoker_storage_request_seconds_count"
    )
    assert latency == len(log)
    for w in ("0", "1"):
        busy = value(after, "stoker_loader_worker_busy_seconds_total", rank="0", worker=w)
        alive = value(after, "stoker_loader_worker_alive_seconds_total", rank="0", worker=w)
        assert 0 < busy <= alive
    threads = value(after, "stoker_loader_thread_busy_seconds_total") - value(
        before, "stoker_loader_thread_busy_seconds_total"
    )
    thread_time = value(after, "stoker_loader_thread_alive_seconds_total") - value(
        before, "stoker_loader_thread_alive_seconds_total"
    )
    assert 0 < threads <= thread_time
    # exited workers' files are folded into the parent's totals and removed
    d = Path(export_dir(os.getpid()))
    assert not d.exists() or not [p for p in d.iterdir() if p.suffix == ".json"]
    again = scrape(port)
    for key in (
        "stoker_storage_read_bytes_total",
        "stoker_storage_requests_total",
        "stoker_loader_thread_busy_seconds_total",
    ):
        assert value(again, key) == value(after, key)  # counted once, not on every scrape

    # a second epoch's new workers add to the same series
    ds.set_epoch(1)
    n_second = len(origin.access_log())
    assert len(list(DataLoader(ds, batch_size=4, num_workers=2, timeout=120))) > 0
    log2 = origin.access_log()[n_second:]
    final = scrape(port)
    assert value(final, "stoker_storage_read_bytes_total") - value(
        after, "stoker_storage_read_bytes_total"
    ) == sum(r.bytes_sent for r in log2)
    for w in ("0", "1"):
        assert value(final, "stoker_loader_worker_alive_seconds_total", rank="0", worker=w) > value(
            after, "stoker_loader_worker_alive_seconds_total", rank="0", worker=w
        )


def test_metered_dataloader_reports_the_stall_like_token_loader(small_dataset: Written) -> None:
    port = serve(0)
    ds = TokenDataset(
        str(small_dataset.path), SEQ_LEN, batch_size=4, shard_size=8, window_shards=4, seed=5
    )
    loader = Metered(DataLoader(ds, batch_size=4, num_workers=2, timeout=120), rank=0)
    before = scrape(port)
    batches = [b["sample_id"].tolist() for b in loader]
    after = scrape(port)

    def grew(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    assert_exactly_once([i for b in batches for i in b], ds.num_samples)
    assert len(loader) == len(batches)
    assert grew("stoker_loader_batches_total", rank="0") == len(batches)
    assert grew("stoker_loader_samples_total", rank="0") == ds.num_samples
    assert grew("stoker_loader_tokens_total", rank="0") == ds.num_samples * (SEQ_LEN + 1)
    assert grew("stoker_loader_wait_seconds_count", rank="0") == len(batches)
    assert grew("stoker_loader_step_seconds_count", rank="0") == len(batches) - 1
    stats = loader.stats()
    assert 0.0 <= stats["stall_share"] <= 1.0
    assert stats["worker_busy_share"] is not None and 0.0 < stats["worker_busy_share"] <= 1.0
    assert stats["storage"]["bytes"] >= value(after, "stoker_storage_read_bytes_total") > 0
    assert loader.dataset is ds  # the loader's own attributes pass through


def test_persistent_workers_count_every_epoch_once(serve_dir, small_dataset: Written) -> None:
    """A persistent worker iterates once per epoch: one file, the epochs' counts summed."""
    origin, url = serve_dir(small_dataset.path)
    port = serve(0)
    ds = TokenDataset(url, SEQ_LEN, batch_size=4, shard_size=8, window_shards=4, seed=9)
    dl = DataLoader(ds, batch_size=4, num_workers=2, timeout=120, persistent_workers=True)
    n_before = len(origin.access_log())
    before = scrape(port)
    for epoch in range(2):
        ds.set_epoch(epoch)
        assert_exactly_once([i for b in dl for i in b["sample_id"].tolist()], ds.num_samples)
    log = origin.access_log()[n_before:]
    mid = scrape(port)  # the workers still live: their files hold both epochs
    del dl  # the workers exit
    after = scrape(port)
    for m in (mid, after):
        got = value(m, "stoker_storage_read_bytes_total") - value(
            before, "stoker_storage_read_bytes_total"
        )
        assert got == sum(r.bytes_sent for r in log)


def test_token_loader_stats_count_what_training_took(small_dataset: Written) -> None:
    from stoker import TokenLoader

    ds = TokenDataset(
        str(small_dataset.path), SEQ_LEN, batch_size=4, shard_size=8, window_shards=4, seed=7
    )
    loader = TokenLoader(ds, num_workers=2)
    before = loader.stats()
    batches = [b["sample_id"].tolist() for b in loader]
    after = loader.stats()
    assert_exactly_once([i for b in batches for i in b], ds.num_samples)
    assert after["batches"] - before["batches"] == len(batches)
    assert after["samples"] - before["samples"] == ds.num_samples
    assert after["tokens"] - before["tokens"] == ds.num_samples * (SEQ_LEN + 1)
    assert 0.0 < after["worker_busy_share"] <= 1.0  # its two workers reported
    assert after["storage"]["bytes"] > before["storage"]["bytes"]  # read by the workers


class _Burning(IterableDataset):  # type: ignore[type-arg]
    """``dataset``'s samples, read in a DataLoader worker beside a thread of its own that
    burns CPU the whole time (hashing, without the interpreter lock), as a worker's
    read-ahead threads can."""

    def __init__(self, dataset: TokenDataset) -> None:
        self.dataset = dataset

    def __iter__(self) -> Iterator[dict[str, Any]]:
        stop = threading.Event()
        data = bytes(4 << 20)

        def burn() -> None:
            while not stop.is_set():
                hashlib.sha256(data).digest()

        t = threading.Thread(target=burn, daemon=True)
        t.start()
        try:
            yield from self.dataset
        finally:
            stop.set()
            t.join()


def test_a_worker_waiting_for_its_parent_is_idle_whatever_its_threads_do(
    small_dataset: Written,
) -> None:
    # one worker, far ahead of a training step of 40 ms a batch: it waits for the parent's
    # next request nearly all the time (well under a tenth of it busy, measured), while a
    # thread of its own burns a core; that thread's CPU is not the worker's busy time
    port = serve(0)
    ds = TokenDataset(
        str(small_dataset.path), SEQ_LEN, batch_size=4, shard_size=8, window_shards=4, seed=11
    )
    before = scrape(port)
    n = 0
    for _ in DataLoader(_Burning(ds), batch_size=4, num_workers=1, timeout=120):
        time.sleep(0.04)  # the training step
        n += 1
    after = scrape(port)

    def grew(name: str) -> float:
        return value(after, name, rank="0", worker="0") - value(before, name, rank="0", worker="0")

    busy = grew("stoker_loader_worker_busy_seconds_total")
    alive = grew("stoker_loader_worker_alive_seconds_total")
    assert n > 20 and alive > 0.04 * n / 2
    assert 0 < busy < 0.5 * alive, (busy, alive)
