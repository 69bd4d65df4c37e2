"""TokenDataset through torch's DataLoader and torchdata's StatefulDataLoader, with real workers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

import stoker
from stoker import TokenDataset

from .helpers import (
    Written,
    assert_exactly_once,
    check_samples,
    dir_bytes,
    unbatch,
)

SEQ_LEN = 32
SHUFFLE = {"shard_size": 8, "window_shards": 4, "seed": 11}


def make_ds(url: str, batch_size: int, **kwargs: Any) -> TokenDataset:
    return TokenDataset(url, SEQ_LEN, batch_size=batch_size, **{**SHUFFLE, **kwargs})


def loader(ds: TokenDataset, batch_size: int, num_workers: int, **kwargs: Any) -> DataLoader:
    if num_workers:
        kwargs.setdefault("timeout", 120)  # a hung worker fails the test instead of hanging it
    return DataLoader(ds, batch_size=batch_size, num_workers=num_workers, **kwargs)


def run_epoch(ds: TokenDataset, batch_size: int, num_workers: int, **kwargs: Any) -> list[dict]:
    """Collated batches of one pass over ``ds``."""
    return list(loader(ds, batch_size, num_workers, **kwargs))


def ids_of(batches: list[dict]) -> list[int]:
    return [i for b in batches for i in b["sample_id"].tolist()]


def check_batches(written: Written, batches: list[dict], batch_size: int) -> list[int]:
    """Batch shapes and dtypes, and every sample's content; returns the id stream."""
    assert batches, "no batches"
    for i, b in enumerate(batches):
        n = batch_size if i < len(batches) - 1 else len(b["sample_id"])
        assert 1 <= n <= batch_size
        assert b["tokens"].shape == (n, SEQ_LEN + 1)
        assert b["tokens"].dtype == torch.int64
        assert b["doc_start_mask"].shape == (n, SEQ_LEN + 1)
        assert b["doc_start_mask"].dtype == torch.bool
        assert b["sample_id"].shape == (n,)
    return check_samples(written, SEQ_LEN, unbatch(batches))


# --------------------------------------------------------------------------- order


@pytest.mark.parametrize("batch_size", [1, 4])
def test_sample_order_does_not_depend_on_num_workers(
    small_dataset: Written, batch_size: int
) -> None:
    url = str(small_dataset.path)
    streams = {}
    for num_workers in (0, 2):
        ds = make_ds(url, batch_size)
        batches = run_epoch(ds, batch_size, num_workers)
        assert len(batches) == -(-ds.num_samples // batch_size)
        streams[num_workers] = check_batches(small_dataset, batches, batch_size)
        assert_exactly_once(streams[num_workers], ds.num_samples)
    assert streams[0] == streams[2]
    assert streams[0] != sorted(streams[0])


def test_epochs_differ_and_each_is_complete(small_dataset: Written) -> None:
    url = str(small_dataset.path)
    per_workers = {}
    for num_workers in (0, 2):
        ds = make_ds(url, 4)
        epochs = []
        for epoch in range(2):
            ds.set_epoch(epoch)
            batches = run_epoch(ds, 4, num_workers)
            ids = check_batches(small_dataset, batches, 4)
            assert_exactly_once(ids, ds.num_samples)
            epochs.append(ids)
        assert epochs[0] != epochs[1]
        per_workers[num_workers] = epochs
    assert per_workers[0] == per_workers[2]


def test_loader_len_matches_delivered_batches(small_dataset: Written) -> None:
    ds = make_ds(str(small_dataset.path), 4)
    dl = loader(ds, 4, 2)
    batches = list(dl)
    assert len(batches) == len(dl) == -(-ds.num_samples // 4)


@pytest.mark.slow
def test_spawned_workers(small_dataset: Written) -> None:
    """Workers that get the dataset by pickle (spawn; forkserver is Python 3.14's default)."""
    url = str(small_dataset.path)
    reference = ids_of(run_epoch(make_ds(url, 4), 4, 0))
    ds = make_ds(url, 4)
    batches = run_epoch(ds, 4, 2, multiprocessing_context="spawn")
    assert check_batches(small_dataset, batches, 4) == reference


def test_dataset_pickle_roundtrip(small_dataset: Written) -> None:
    import pickle

    ds = make_ds(str(small_dataset.path), 4)
    fresh = pickle.loads(pickle.dumps(ds))
    first = [x["sample_id"] for x in ds]  # ds has read: clients, threads, stats exist
    after = pickle.loads(pickle.dumps(ds))
    assert [x["sample_id"] for x in fresh] == first
    after.set_epoch(0)
    assert [x["sample_id"] for x in after] == first


# --------------------------------------------------------------------------- resume


@pytest.mark.parametrize("k", [1, 5, 12, pytest.param(-1, id="end")])
def test_stateful_dataloader_resumes_exactly_through_workers(
    small_dataset: Written, k: int
) -> None:
    from torchdata.stateful_dataloader import StatefulDataLoader

    url = str(small_dataset.path)
    b = 4

    def new_loader() -> StatefulDataLoader:
        return StatefulDataLoader(make_ds(url, b), batch_size=b, num_workers=2, timeout=120)

    reference = list(new_loader())
    ref_ids = ids_of(reference)
    assert_exactly_once(ref_ids, make_ds(url, b).num_samples)
    if k < 0:  # the state after the epoch's last batch
        k = len(reference)
    assert len(reference) >= k

    first = new_loader()
    it = iter(first)
    taken = [next(it) for _ in range(k)]
    state = first.state_dict()
    assert ids_of(taken) == ids_of(reference[:k])
    del it, first

    resumed = new_loader()
    resumed.load_state_dict(state)
    rest = list(resumed)
    assert ids_of(rest) == ref_ids[len(ids_of(taken)) :]
    assert len(rest) == len(reference) - k
    for got, want in zip(rest, reference[k:]):
        assert torch.equal(got["tokens"], want["tokens"])
        assert torch.equal(got["doc_start_mask"], want["doc_start_mask"])


# --------------------------------------------------------------------------- S3 + fork


@pytest.mark.slow
def test_s3_forked_workers_after_parent_read(
    s3_server, small_dataset: Written, bucket: str
) -> None:
    s3_server.upload_dir(small_dataset.path, bucket, "ds")
    url, opts = f"s3://{bucket}/ds", s3_server.storage_options()
    ds = make_ds(url, 4, storage_options=opts)

    # The parent reads first: its fsspec filesystem, event loop thread, connection
    # pool and I/O threads exist when the workers are forked.
    it = iter(ds)
    parent_items = [next(it) for _ in range(5)]
    it.close()
    parent_ids = check_samples(small_dataset, SEQ_LEN, parent_items)
    assert ds.source.storage.stats.requests > 0

    # the workers continue the epoch the parent broke off (what it consumed is not read again)
    batches = run_epoch(ds, 4, 2, multiprocessing_context="fork")
    ids = check_batches(small_dataset, batches, 4)
    assert_exactly_once(parent_ids + ids, ds.num_samples)
    # the parent's client still works after the fork
    np.testing.assert_array_equal(ds.source.tokens(0, 100), small_dataset.stream[:100])


# --------------------------------------------------------------------------- disk cache


def _block_requests(origin) -> list:
    return [r for r in origin.access_log() if "/data/" in r.path]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_disk_cache_second_epoch_makes_no_requests(
    serve_dir, small_dataset: Written, tmp_path: Path, num_workers: int
) -> None:
    origin, url = serve_dir(small_dataset.path)
    cache_dir = tmp_path / "cache"
    ds = make_ds(url, 4, cache_dir=cache_dir, cache_limit=1 << 30, agent=False)
    origin.clear_access_log()

    ds.set_epoch(0)
    first = check_batches(small_dataset, run_epoch(ds, 4, num_workers), 4)
    assert_exactly_once(first, ds.num_samples)
    fetched = _block_requests(origin)
    needed = small_dataset.blocks_needed(SEQ_LEN)
    assert len(fetched) >= needed
    assert len(list(cache_dir.glob("*.blk"))) == needed

    origin.clear_access_log()
    ds.set_epoch(1)
    second = check_batches(small_dataset, run_epoch(ds, 4, num_workers), 4)
    assert_exactly_once(second, ds.num_samples)
    assert second != first
    assert origin.access_log() == []


def test_disk_cache_smaller_than_dataset_stays_under_limit(
    serve_dir, small_dataset: Written, tmp_path: Path
) -> None:
    # In-process iteration; with DataLoader workers the limit is not kept (see
    # test_disk_cache_limit_holds_across_processes).
    num_workers = 0
    m = small_dataset.manifest
    spans = [small_dataset.record_span(b) for b in range(m.num_blocks)]
    largest = max(stop - start for _, start, stop in spans)
    limit = m.compressed_bytes // 3
    assert largest * 3 < limit  # room for a few records, not for the dataset

    origin, url = serve_dir(small_dataset.path)
    cache_dir = tmp_path / "cache"
    ds = make_ds(url, 4, cache_dir=cache_dir, cache_limit=limit, agent=False)
    for epoch in range(2):
        ds.set_epoch(epoch)
        ids = check_batches(small_dataset, run_epoch(ds, 4, num_workers), 4)
        assert_exactly_once(ids, ds.num_samples)
        # the reader kept for the next epoch may be writing that epoch's first blocks:
        # a put makes room before it writes, so the limit holds at any moment
        size = dir_bytes(cache_dir)
        assert 0 < size <= limit, f"cache holds {size} bytes after epoch {epoch}, limit {limit}"
    # the kept reader would go on fetching the next epoch's blocks: let it go, so the
    # origin's log below holds only this read's requests
    ds.release_readers()
    assert 0 < len(list(cache_dir.glob("*.blk"))) < m.num_blocks
    # the cache is still used: a block it holds is read without a request
    held = sorted(cache_dir.glob("*.blk"))[0]
    block = int(held.stem.rsplit("__", 1)[1])
    src = stoker.TokenSource(url, cache=stoker.DiskCache(cache_dir, limit))
    origin.clear_access_log()
    lo, hi = small_dataset.block_range(block)
    np.testing.assert_array_equal(src.block(block)[0], small_dataset.stream[lo:hi])
    assert _block_requests(origin) == []


def _cache_putter(directory: str, limit: int, conn) -> None:
    """A process with its own DiskCache: puts what it is told, acknowledges each put."""
    cache = stoker.DiskCache(directory, limit)
    while True:
        msg = conn.recv()
        if msg is None:
            break
        key, size = msg
        cache.put(key, bytes([len(key)]) * size)
        conn.send("ok")
    conn.close()


def test_disk_cache_limit_holds_across_processes(tmp_path: Path) -> None:
    """Two processes take turns putting records into one cache directory."""
    import multiprocessing

    ctx = multiprocessing.get_context("fork")
    limit, record = 1000, 300
    directory = tmp_path / "cache"
    procs, conns = [], []
    for _ in range(2):
        parent, child = ctx.Pipe()
        proc = ctx.Process(target=_cache_putter, args=(str(directory), limit, child))
        proc.start()
        procs.append(proc)
        conns.append(parent)
    sizes = []
    try:
        for i in range(8):
            conn = conns[i % 2]
            conn.send((f"ds/{i}", record))
            assert conn.poll(60), "cache process did not answer"
            assert conn.recv() == "ok"
            sizes.append(dir_bytes(directory))
    finally:
        for conn in conns:
            conn.send(None)
        for proc in procs:
            proc.join(30)
            if proc.is_alive():
                proc.kill()
                proc.join()
    assert sizes[0] == record
    assert all(size <= limit for size in sizes), f"directory sizes after each put: {sizes}"
