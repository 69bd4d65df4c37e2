"""The preprocessing pool: workers as real processes (``stoker preprocess-worker``) over
Arrow Flight on loopback, trainers whose records dataset names them. The rows are the
trainer's own bit for bit, whatever worker makes them; a worker killed with SIGKILL
mid-epoch loses nothing; with none left the trainer makes them itself, after one
warning; a bad image is named as it would be here; a worker takes no request without
its token."""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import warnings
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
import torch

import stoker
from stoker.preprocess import client
from stoker.preprocess.client import RemoteReader
from stoker.preprocess.spec import WorkSpec
from stoker.preprocess.worker import PreprocessWorker

from .helpers import one_rank, photo_jpeg, photo_records, same_batches  # noqa: F401 (one_rank: a fixture)
from .test_agent import Agents

N, B, SIZE = 96, 8, 32
TESTS = str(Path(__file__).resolve().parents[1])  # (what a worker imports a transform from)

pytestmark = pytest.mark.usefixtures("one_rank")


@pytest.fixture(scope="module")
def images(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return photo_records(tmp_path_factory.mktemp("pool") / "ds", N, 4, (40, 120), (5, 7), 20_000)


def dataset(root: Path | str, **kw: object) -> stoker.RecordDataset:
    kw.setdefault("batch_size", B)
    kw.setdefault("image_size", SIZE)
    return stoker.RecordDataset(str(root), seed=5, **kw)  # type: ignore[arg-type]


def seeded_flip(image: object, rng: np.random.Generator) -> np.ndarray:
    """A user's transform, imported by the workers by name: the top-left SIZE x SIZE
    window, flipped on a coin of the sample's own generator."""
    a = np.asarray(image)
    a = np.pad(a, ((0, max(0, SIZE - a.shape[0])), (0, max(0, SIZE - a.shape[1])), (0, 0)))
    a = a[:SIZE, :SIZE]
    return a[:, ::-1] if rng.random() < 0.5 else a


#: Each worker process's metrics endpoint, by pid (its /metrics: HOST:PORT).
metrics: dict[int, str] = {}


@contextmanager
def workers(n: int, *extra: str) -> Iterator[list[tuple[str, subprocess.Popen[str]]]]:
    """``n`` worker processes on loopback, each with the address it serves."""
    env = {**os.environ, "PYTHONPATH": TESTS + os.pathsep + os.environ.get("PYTHONPATH", "")}
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "stoker", "preprocess-worker", "--metrics-port", "0", *extra],
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        for _ in range(n)
    ]
    try:
        got = []
        for p in procs:
            assert p.stdout is not None
            for line in p.stdout:
                if "serving" in line:  # "serving HOST:PORT (metrics on HOST:PORT)"
                    got.append((line.split("serving ")[1].split()[0], p))
                    metrics[p.pid] = line.split("metrics on ")[1].split(")")[0]
                    break
            else:
                raise AssertionError(f"worker {p.pid} ended before serving")
        yield got
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs:
            p.wait(30)
            if p.stdout is not None:
                p.stdout.close()


def made_here(images: Path, ids: np.ndarray) -> dict[str, np.ndarray]:
    """The rows of ``ids`` (epoch 0) as the trainer makes them itself."""
    mine = dataset(images).open_reader(0)
    want = mine.layout.allocate(len(ids))
    mine.plan(ids)
    mine.fill(ids, want)
    mine.close()
    return want


def pool(addresses: list[str]) -> str:
    return "grpc://" + ",".join(addresses)


def test_workers_make_the_rows_the_trainer_would_bit_for_bit(images: Path) -> None:
    local = {
        nw: list(stoker.TokenLoader(dataset(images, transform=seeded_flip), nw)) for nw in (0, 2)
    }
    assert same_batches(local[0], local[2])
    with workers(2) as ws:
        for nw in (0, 2):
            ds = dataset(images, transform=seeded_flip, preprocess=pool([a for a, _ in ws]))
            with warnings.catch_warnings():
                warnings.simplefilter("error")  # (no fallback: the workers made them)
                got = list(stoker.TokenLoader(ds, nw))
            assert same_batches(got, local[nw])
            assert sorted(int(i) for b in got for i in b["sample_id"]) == list(range(N))


def pool_figures() -> dict[str, float]:
    """This process's preprocessing figures as Prometheus shows them (worker processes
    of the loader's included)."""
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    from stoker.observe.exposition import Collector

    reg = CollectorRegistry()
    reg.register(Collector())
    out = {}
    for fam in text_string_to_metric_families(generate_latest(reg).decode()):
        for x in fam.samples:
            if x.name.startswith("stoker_preprocess_"):
                out[x.name + "/" + x.labels.get("worker", "")] = x.value
    return out


def test_the_pool_s_rows_and_waits_are_counted_by_worker(images: Path) -> None:
    with workers(1) as ws:
        before = pool_figures()
        loader = stoker.TokenLoader(dataset(images, preprocess=pool([ws[0][0]])), 2)
        list(loader)
        loader.close()
        after = pool_figures()
    key = f"stoker_preprocess_rows_total/{ws[0][0]}"
    assert after[key] - before.get(key, 0.0) == N  # (made in the loader's workers, summed)
    secs = f"stoker_preprocess_request_seconds_total/{ws[0][0]}"
    assert after[secs] > before.get(secs, 0.0)
    # (each pass's first fill waits: its first request was sent as the pass planned)
    wait = "stoker_preprocess_wait_seconds_total/"
    assert after[wait] > before.get(wait, 0.0)


def test_a_worker_s_own_metrics_count_what_it_made(images: Path) -> None:
    import urllib.request

    with workers(1) as ws:
        list(stoker.TokenLoader(dataset(images, preprocess=pool([ws[0][0]])), 0))
        url = f"http://{metrics[ws[0][1].pid]}/metrics"
        with urllib.request.urlopen(url, timeout=10) as r:
            text = r.read().decode()
    got = {
        line.split()[0]: float(line.split()[1])
        for line in text.splitlines()
        if line.startswith("stoker_preprocess_worker_")
    }
    assert got["stoker_preprocess_worker_rows_total"] == N
    assert got["stoker_preprocess_worker_busy_seconds_total"] > 0
    assert got["stoker_preprocess_worker_refused_total"] == 0
    assert got["stoker_preprocess_worker_streams"] == 1


def test_the_plain_recipe_and_an_epoch_after_the_first_match_too(images: Path) -> None:
    loader = stoker.TokenLoader(dataset(images), 0)
    local = [list(loader), list(loader)]
    with workers(1) as ws:
        remote = stoker.TokenLoader(dataset(images, preprocess=pool([ws[0][0]])), 0)
        got = [list(remote), list(remote)]
    assert same_batches(got[0], local[0]) and same_batches(got[1], local[1])
    assert not same_batches(got[0], got[1])  # (a fresh shuffle and fresh crops)


def test_the_rows_are_shared_out_among_the_workers(images: Path) -> None:
    """Two in-process workers (real Flight servers on loopback, one shared token): both
    make rows, and together every row once."""
    a, b = PreprocessWorker(token="shared"), PreprocessWorker(token="shared")
    try:
        ds = dataset(images, preprocess=pool([a.address, b.address]), preprocess_token="shared")
        reader = ds.open_reader(0)
        assert isinstance(reader, RemoteReader)
        ids = np.arange(N)
        reader.plan(ids)
        out = ds.layout.allocate(N)
        reader.fill(ids, out)
        made = reader.made_by
        reader.close()
        want = made_here(images, ids)
    finally:
        a.shutdown()
        b.shutdown()
    assert np.array_equal(out["image"], want["image"])
    assert np.array_equal(out["label"], want["label"])
    assert made[a.address] > 0 and made[b.address] > 0
    assert made[a.address] + made[b.address] == N == a.rows + b.rows


def test_more_trainer_streams_than_a_worker_keeps_readers_for_all_get_their_rows(
    images: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Six readers at once against a worker that keeps readers for two: a stream pushed
    out while a request of its uses it is closed only after that request (and the next
    request of it opens a fresh one)."""
    import threading

    from stoker.preprocess import worker as worker_module

    monkeypatch.setattr(worker_module, "READERS", 2)
    w = PreprocessWorker(token="t")
    ds = dataset(images, preprocess=pool([w.address]), preprocess_token="t")
    ids = np.arange(N)
    want = made_here(images, ids)
    failed: list[BaseException] = []
    same_rows: list[bool] = []

    def read() -> None:
        try:
            reader = ds.open_reader(0)
            reader.plan(ids)
            out = ds.layout.allocate(N)
            for i in range(0, N, 8):
                reader.fill(ids[i : i + 8], {k: v[i : i + 8] for k, v in out.items()})
            reader.close()
            same_rows.append(bool(np.array_equal(out["image"], want["image"])))
        except BaseException as exc:
            failed.append(exc)

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # (no worker set aside, no fallback)
            threads = [threading.Thread(target=read) for _ in range(6)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(120)
    finally:
        w.shutdown()
    assert not failed, failed[0]
    assert same_rows == [True] * 6
    assert w.rows == 6 * N


def test_a_worker_that_reads_another_dataset_at_the_url_is_set_aside(
    images: Path, tmp_path: Path
) -> None:
    other = photo_records(tmp_path / "other", N, 9, (40, 120), (5, 7), 20_000)
    w = PreprocessWorker(token="t")
    try:
        ds = dataset(images, preprocess=pool([w.address]), preprocess_token="t")
        forged = dataclasses.replace(ds._work, url=str(other))  # (the same url, elsewhere)
        reader = ds.open_reader(0)
        assert isinstance(reader, RemoteReader)
        reader.spec = forged
        ids = np.arange(16)
        reader.plan(ids)
        out = ds.layout.allocate(16)
        with pytest.warns(RuntimeWarning) as seen:
            reader.fill(ids, out)  # (made here instead)
        reader.close()
    finally:
        w.shutdown()
    said = " ".join(str(x.message) for x in seen)
    assert f"worker {w.address} is left alone" in said and "another dataset" in said
    assert reader.made_by[w.address] == 0


@pytest.mark.parametrize("allowed", ["dataset", "transform"])
def test_a_worker_serves_only_the_datasets_and_transforms_it_was_told_to(
    images: Path, allowed: str
) -> None:
    url = WorkSpec.of(dataset(images, transform=seeded_flip)).url  # (what a request names)
    module = __name__
    ok = PreprocessWorker(token="t", datasets=[url[: len(url) // 2]], transforms=[module])
    narrow = (
        PreprocessWorker(token="t", datasets=["s3://elsewhere/"])
        if allowed == "dataset"
        else PreprocessWorker(token="t", transforms=["json"])
    )
    ids = np.arange(16)
    try:
        got = {}
        for w in (ok, narrow):
            remote = dataset(images, transform=seeded_flip, preprocess=pool([w.address]),
                             preprocess_token="t")  # fmt: skip
            reader = remote.open_reader(0)
            reader.plan(ids)
            out = remote.layout.allocate(16)
            with warnings.catch_warnings(record=True) as seen:
                warnings.simplefilter("always")
                reader.fill(ids, out)
            reader.close()
            got[w.address] = (reader.made_by[w.address], [str(x.message) for x in seen])
    finally:
        ok.shutdown()
        narrow.shutdown()
    assert got[ok.address] == (16, [])
    made, said = got[narrow.address]
    assert made == 0  # (made here instead)
    why = "serves no dataset" if allowed == "dataset" else "runs no transform"
    assert any(f"worker {narrow.address} is left alone" in x and why in x for x in said), said


def test_a_worker_killed_mid_epoch_loses_nothing_and_none_left_falls_back(
    images: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # requests of 4 rows, one a worker in flight: at most 8 rows asked ahead, so most of
    # the epoch is asked for after each kill
    monkeypatch.setattr(client, "CHUNK", 4)
    monkeypatch.setattr(client, "INFLIGHT", 1)
    local = list(stoker.TokenLoader(dataset(images), 0))
    with workers(2) as ws:
        ds = dataset(images, preprocess=pool([a for a, _ in ws]))
        it = iter(stoker.TokenLoader(ds, 0))
        got = [next(it) for _ in range(3)]
        ws[0][1].send_signal(signal.SIGKILL)  # mid-epoch: what it was asked goes elsewhere
        ws[0][1].wait(30)
        got += [next(it) for _ in range(3)]
        ws[1][1].send_signal(signal.SIGKILL)  # the last one: made here from now on
        ws[1][1].wait(30)
        with pytest.warns(RuntimeWarning, match="no preprocessing worker answers") as seen:
            got += list(it)
    assert len([w for w in seen if "no preprocessing worker" in str(w.message)]) == 1
    assert same_batches(got, local)


def by_sample(batches: list[dict[str, torch.Tensor]]) -> dict[int, torch.Tensor]:
    return {int(i): b["image"][j] for b in batches for j, i in enumerate(b["sample_id"])}


def test_a_coordinator_fed_epoch_through_the_pool_is_exactly_once_though_a_worker_dies(
    images: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Leases and confirms stay the trainer's: every sample once, each the crop local
    production gives it, though a worker is SIGKILLed mid-epoch (its requests are asked
    again of the other)."""
    monkeypatch.setattr(client, "CHUNK", 4)
    monkeypatch.setattr(client, "INFLIGHT", 1)
    local = by_sample(list(stoker.TokenLoader(dataset(images), 0)))
    with workers(2) as ws:
        ds = dataset(images, preprocess=pool([a for a, _ in ws]))
        loader = stoker.TokenLoader(ds, 2, coordinator="rank0")
        try:
            it = iter(loader)
            got = [next(it) for _ in range(4)]
            ws[0][1].send_signal(signal.SIGKILL)
            ws[0][1].wait(30)
            got += list(it)
        finally:
            loader.close()
    seen = [int(i) for b in got for i in b["sample_id"]]
    assert sorted(seen) == list(range(N))
    mine = by_sample(got)
    assert all(torch.equal(mine[i], local[i]) for i in range(N))


def test_two_trainer_ranks_share_the_workers_and_an_epoch(images: Path) -> None:
    one = by_sample(list(stoker.TokenLoader(dataset(images, rank=0, world_size=1), 0)))
    with workers(2) as ws:
        remote = pool([a for a, _ in ws])
        ranks = [
            list(stoker.TokenLoader(dataset(images, rank=r, world_size=2, preprocess=remote), 0))
            for r in (0, 1)
        ]
    seen = [[int(i) for b in got for i in b["sample_id"]] for got in ranks]
    assert len(seen[0]) == len(seen[1]) and not set(seen[0]) & set(seen[1])
    assert set(seen[0]) | set(seen[1]) == set(range(N))
    for got in ranks:
        assert all(torch.equal(img, one[i]) for i, img in by_sample(got).items())


def test_a_run_resumed_through_the_pool_is_bit_identical(images: Path) -> None:
    whole = list(stoker.TokenLoader(dataset(images), 0))
    with workers(1) as ws:
        remote = pool([ws[0][0]])
        loader = stoker.TokenLoader(dataset(images, preprocess=remote), 2)
        it = iter(loader)
        head = [next(it) for _ in range(5)]
        state = loader.state_dict()
        it.close()
        loader.close()
        again = stoker.TokenLoader(dataset(images, preprocess=remote), 0)  # (other workers)
        again.load_state_dict(state)
        rest = list(again)
    assert same_batches(head + rest, whole)


def test_the_trainer_can_make_rows_too_as_one_more_worker(images: Path) -> None:
    w = PreprocessWorker(token="t")
    try:
        ds = dataset(images, preprocess=pool([w.address]), preprocess_token="t",
                     preprocess_local=True)  # fmt: skip
        reader = ds.open_reader(0)
        assert isinstance(reader, RemoteReader)
        ids = np.arange(N)
        reader.plan(ids)
        out = ds.layout.allocate(N)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # (no fallback: the local share is asked for)
            reader.fill(ids, out)
        made = reader.made_by
        reader.close()
    finally:
        w.shutdown()
    want = made_here(images, ids)
    assert np.array_equal(out["image"], want["image"])
    assert made["local"] > 0 and made[w.address] > 0 and sum(made.values()) == N


def test_no_worker_at_the_address_falls_back_with_one_warning(images: Path) -> None:
    import socket

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    local = list(stoker.TokenLoader(dataset(images), 0))
    ds = dataset(images, preprocess=f"grpc://127.0.0.1:{port}", preprocess_token="x")
    with pytest.warns(RuntimeWarning, match="no preprocessing worker answers") as seen:
        got = list(stoker.TokenLoader(ds, 0))
    assert len(seen) == 1
    assert same_batches(got, local)


def test_a_bad_image_is_named_by_row_and_file_through_a_worker(tmp_path: Path) -> None:
    rng = np.random.default_rng(2)
    rows = [{"image": photo_jpeg(rng, 40, 40), "label": 1} for _ in range(30)]
    rows[17]["image"] = rows[17]["image"][: len(rows[17]["image"]) // 2]  # truncated
    stoker.write_records(rows, str(tmp_path / "bad"), schema={"image": "binary", "label": "int64"},
                         block_bytes=5_000)  # fmt: skip
    src = stoker.RecordSource(str(tmp_path / "bad"))
    block = int(src.block_of(np.array([17]))[0])
    with workers(1) as ws:
        ds = dataset(tmp_path / "bad", preprocess=pool([ws[0][0]]))
        with pytest.raises(stoker.DatasetError) as info:
            list(stoker.TokenLoader(ds, 0))
    text = str(info.value)
    assert f"row 17 (block {block})" in text
    assert src.manifest.block_file(block).path in text
    assert f"worker {ws[0][0]}" in text


def test_a_worker_takes_no_request_without_its_token(images: Path) -> None:
    with pytest.raises(stoker.ConfigError, match="not loopback"):
        PreprocessWorker("0.0.0.0:0")
    w = PreprocessWorker(token="the-right-one")
    try:
        ds = dataset(images, preprocess=pool([w.address]), preprocess_token="a-wrong-one")
        with pytest.raises(stoker.StokerError, match="refused this trainer's token"):
            list(stoker.TokenLoader(ds, 0))
        assert w.rows == 0
    finally:
        w.shutdown()


def test_a_transform_a_worker_cannot_import_is_refused_at_the_dataset(images: Path) -> None:
    with pytest.raises(stoker.ConfigError, match="cannot be imported by a worker"):
        dataset(
            images, transform=lambda image, rng: np.asarray(image), preprocess="grpc://127.0.0.1:1"
        )
    with pytest.raises(stoker.ConfigError, match="grpc://HOST:PORT"):
        dataset(images, preprocess="grpc://nowhere")
    spec = WorkSpec.of(dataset(images, transform=seeded_flip))
    assert spec.transform == f"{__name__}:seeded_flip"
    assert WorkSpec.from_json(spec.to_json()) == spec


def listed(coordinator: str, address: str) -> None:
    """Wait until the coordinator lists the worker at ``address`` (it offers itself as it
    starts serving; bounded: a worker that never shows fails the test)."""
    import time

    from stoker.coordinator.client import CoordinatorClient

    c = CoordinatorClient(coordinator)
    try:
        deadline = time.monotonic() + 60
        while address not in c.pool(0, 0.0):
            assert time.monotonic() < deadline, f"{address} never offered itself"
            time.sleep(0.05)
    finally:
        c.close()


def start_coordinator(state: Path, *extra: str) -> tuple[subprocess.Popen[str], str]:
    """A coordinator process of one rank (metrics on ``--metrics-port``, default none),
    once it serves; the line that says where."""
    args = ["--metrics-port", "-1"] if "--metrics-port" not in extra else []
    proc = subprocess.Popen(
        [sys.executable, "-m", "stoker", "coordinator", "--state", str(state),
         "--world", "1", "--num-samples", str(N), *args, *extra],
        stdout=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    assert proc.stdout is not None
    return proc, next(x for x in proc.stdout if "serving" in x)


def test_workers_offered_to_the_coordinator_are_found_even_mid_epoch(
    images: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import urllib.request

    monkeypatch.setattr(client, "OFFER_SECONDS", 0.0)  # (the reader asks at every batch)
    # requests of 4 rows, one at a time: the rows after the first 32 are asked for after
    # the second worker offered itself
    monkeypatch.setattr(client, "CHUNK", 4)
    monkeypatch.setattr(client, "INFLIGHT", 1)
    coordinator, line = start_coordinator(tmp_path / "state", "--metrics-port", "0")
    try:
        address = line.split("serving ")[1].split()[0]
        metrics = line.split("metrics on ")[1].rstrip(")\n")
        ds = dataset(images, preprocess=f"coordinator://{address}")
        ids = np.random.default_rng(1).permutation(N)
        got = ds.layout.allocate(N)
        with workers(1, "--coordinator", address) as first:
            listed(address, first[0][0])
            reader = ds.open_reader(0)
            assert isinstance(reader, RemoteReader)
            reader.plan(ids)
            reader.fill(ids[:32], {k: v[:32] for k, v in got.items()})
            with workers(1, "--coordinator", address) as second:
                listed(address, second[0][0])
                for i in range(32, N, 8):
                    reader.fill(ids[i : i + 8], {k: v[i : i + 8] for k, v in got.items()})
                made = reader.made_by
                with urllib.request.urlopen(f"http://{metrics}/metrics", timeout=10) as r:
                    text = r.read().decode()
            reader.close()
    finally:
        coordinator.send_signal(signal.SIGTERM)
        coordinator.wait(30)
        if coordinator.stdout is not None:
            coordinator.stdout.close()
    want = made_here(images, ids)
    assert np.array_equal(got["image"], want["image"])
    assert made[first[0][0]] > 0 and made[second[0][0]] > 0  # the second from mid-epoch
    assert sum(made.values()) == N
    assert "stoker_preprocess_workers 2.0" in text
    assert "stoker_preprocess_workers_needed" in text


def test_a_coordinator_restart_loses_the_pool_nothing(
    images: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Killed, the coordinator's listing stops, not the rows (the reader keeps the
    workers it knows); restarted on its address, the workers' next offers list them
    again (the pool is not journaled: it is told again every few seconds)."""
    monkeypatch.setattr(client, "OFFER_SECONDS", 0.0)  # (the reader asks at every batch)
    procs = []
    try:
        first, line = start_coordinator(tmp_path / "state")
        procs.append(first)
        address = line.split("serving ")[1].split()[0]
        ds = dataset(images, preprocess=f"coordinator://{address}")
        ids = np.random.default_rng(2).permutation(N)
        got = ds.layout.allocate(N)
        with workers(1, "--coordinator", address) as ws:
            listed(address, ws[0][0])
            reader = ds.open_reader(0)
            assert isinstance(reader, RemoteReader)
            reader.plan(ids)
            reader.fill(ids[:32], {k: v[:32] for k, v in got.items()})
            first.send_signal(signal.SIGKILL)
            first.wait(30)
            reader.fill(ids[32:64], {k: v[32:64] for k, v in got.items()})
            again, _ = start_coordinator(tmp_path / "state", "--bind", address)
            procs.append(again)
            listed(address, ws[0][0])
            reader.fill(ids[64:], {k: v[64:] for k, v in got.items()})
            made = reader.made_by
            reader.close()
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
            p.wait(30)
            if p.stdout is not None:
                p.stdout.close()
    want = made_here(images, ids)
    assert np.array_equal(got["image"], want["image"])
    assert made == {ws[0][0]: N}  # (no fallback: every row the worker's)


def test_a_worker_reads_through_its_nodes_agent(
    serve_dir, images: Path, tmp_path: Path, agents: Agents
) -> None:
    """From a real origin (nginx), a worker given --cache-dir reads through the agent on
    it: two epochs fetch each block once, and the rows are the trainer's own."""
    origin, url = serve_dir(images)
    cache = tmp_path / "cache"
    agents.start(cache)
    loader = stoker.TokenLoader(dataset(url), 0)
    local = [list(loader), list(loader)]
    origin.clear_access_log()
    with workers(1, "--cache-dir", str(cache)) as ws:
        remote = stoker.TokenLoader(dataset(url, preprocess=pool([ws[0][0]])), 0)
        got = [list(remote), list(remote)]
    assert same_batches(got[0], local[0]) and same_batches(got[1], local[1])
    blocks = stoker.RecordSource(str(images)).num_blocks
    requests = Counter(r.path for r in origin.access_log() if "/data/" in r.path)
    assert sum(requests.values()) == blocks  # once each, for both epochs
    assert agents.stats(cache)["memory_blocks"] == blocks


def test_workers_share_the_blocks_out_not_each_read_them_all(serve_dir, images: Path) -> None:
    """Rows go to workers by their block: each block of the epoch is fetched from the
    origin by one worker (about: a block can move when its worker is busy), not by
    every worker that makes some of its rows."""
    origin, url = serve_dir(images)
    blocks = stoker.RecordSource(str(images)).num_blocks
    local = list(stoker.TokenLoader(dataset(url), 0))
    origin.clear_access_log()
    with workers(2) as ws:
        ds = dataset(url, preprocess=pool([a for a, _ in ws]))
        loader = stoker.TokenLoader(ds, 0)
        got = list(loader)
    assert same_batches(got, local)
    requests = Counter(r.path for r in origin.access_log() if "/data/" in r.path)
    assert sum(requests.values()) <= blocks * 1.25
