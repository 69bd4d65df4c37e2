"""One conformance suite for every storage backend stoker reads from.

``_BackendConformance`` holds the tests; each ``Test*`` subclass provides a
``backend`` fixture that yields ``(url, storage_options)`` for the same dataset
(written locally with stoker's writer, then served by that backend). The HTTP
and S3 backends talk to real servers on loopback (nginx, moto).
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import stoker
from stoker import RetryPolicy, Storage, TokenDataset, TokenSource

from .helpers import Written, assert_exactly_once, check_samples, write_dataset

SEQ_LEN = 24

Backend = tuple[str, dict[str, Any]]


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> Written:
    """uint32 tokens, byte-shuffle and a trained dictionary: every file kind a dataset has.

    ~37 blocks of 512 tokens, 4 per file (10 data files, the last block short).
    """
    root = tmp_path_factory.mktemp("backend-root")
    w = write_dataset(
        root / "ds",
        num_docs=120,
        vocab_size=70_000,
        seed=7,
        block_tokens=512,
        blocks_per_file=4,
        shuffle=True,
        dictionary=True,
    )
    m = w.manifest
    assert m.dtype == "uint32"
    assert m.compression.dictionary is not None
    assert len(m.files) >= 3 and m.num_tokens % m.block_tokens != 0
    return w


def _ranges(size: int) -> list[tuple[int, int]]:
    return [(0, 1), (0, size), (size - 1, size), (3, size - 5), (size // 3, size // 2)]


class _BackendConformance:
    """Tests every backend must pass. Subclasses define the ``backend`` fixture."""

    def test_manifest_and_index(self, backend: Backend, written: Written) -> None:
        url, opts = backend
        src = TokenSource(url, opts)
        assert src.url == url.rstrip("/")
        assert src.manifest == written.manifest
        np.testing.assert_array_equal(src.index, written.index())

    def test_every_block_matches_the_written_stream(
        self, backend: Backend, written: Written
    ) -> None:
        url, opts = backend
        src = TokenSource(url, opts)
        m = src.manifest
        for b in range(m.num_blocks):
            lo, hi = written.block_range(b)
            tokens, starts = src.block(b)
            assert tokens.dtype == np.uint32
            np.testing.assert_array_equal(tokens, written.stream[lo:hi], err_msg=f"block {b}")
            np.testing.assert_array_equal(
                starts, np.flatnonzero(written.starts[lo:hi]), err_msg=f"doc starts of block {b}"
            )
        # a span that crosses blocks and data files
        lo, hi = m.block_tokens * 3 + 17, m.block_tokens * 9 + 5
        np.testing.assert_array_equal(src.tokens(lo, hi), written.stream[lo:hi])

    def test_read_range_returns_exact_bytes(self, backend: Backend, written: Written) -> None:
        url, opts = backend
        storage = Storage(url, opts)
        for ref in [
            *written.manifest.files[:2],
            written.manifest.files[-1],
            written.manifest.index,
        ]:
            local = (written.path / ref.path).read_bytes()
            assert storage.size(ref.path) == len(local) == ref.bytes
            for start, stop in _ranges(len(local)):
                got = storage.read_range(ref.path, start, stop)
                assert got == local[start:stop], (ref.path, start, stop)
            assert storage.read(ref.path) == local
        assert storage.stats.requests > 0
        assert storage.stats.bytes_read > 0

    def test_exists_and_missing_files(self, backend: Backend) -> None:
        url, opts = backend
        storage = Storage(url, opts, retry=RetryPolicy(attempts=2, backoff=0.01))
        assert storage.exists("manifest.json")
        assert not storage.exists("no-such-file.bin")
        with pytest.raises(FileNotFoundError):
            storage.read_range("data/no-such-file.bin", 0, 10)
        with pytest.raises(FileNotFoundError):
            storage.read("no-such-file.bin")

    def test_dataset_epoch_delivers_every_sample_once(
        self, backend: Backend, written: Written
    ) -> None:
        url, opts = backend
        ds = TokenDataset(
            url, SEQ_LEN, storage_options=opts, shard_size=16, window_shards=4, seed=3
        )
        assert ds.num_samples == written.num_samples(SEQ_LEN)
        ids = check_samples(written, SEQ_LEN, ds)
        assert_exactly_once(ids, ds.num_samples)
        assert ids != sorted(ids)  # shuffled


# --------------------------------------------------------------------------- backends


class TestLocalPath(_BackendConformance):
    @pytest.fixture
    def backend(self, written: Written) -> Backend:
        return str(written.path), {}

    def test_list_names_a_directory(self, written: Written) -> None:
        storage = Storage(str(written.path))
        files = sorted({f.path.rsplit("/", 1)[1] for f in written.manifest.files})
        assert storage.list("data") == files
        assert storage.list("no-such-dir") == []

    def test_append_is_durable_and_continues_the_file(self, tmp_path: Path) -> None:
        storage = Storage(str(tmp_path / "state"))
        assert storage.appends
        storage.append("journal/job/1.jsonl", b"one\n")
        storage.append("journal/job/1.jsonl", b"two\n")
        assert storage.read("journal/job/1.jsonl") == b"one\ntwo\n"  # seen before closing
        storage.close_append("journal/job/1.jsonl")
        storage.append("journal/job/1.jsonl", b"three\n")  # reopened: appended, not replaced
        storage.close_append("journal/job/1.jsonl")
        assert storage.read("journal/job/1.jsonl") == b"one\ntwo\nthree\n"
        assert storage.list("journal/job") == ["1.jsonl"]


class TestRelativeLocalPath(_BackendConformance):
    @pytest.fixture
    def backend(self, written: Written, monkeypatch: pytest.MonkeyPatch) -> Backend:
        monkeypatch.chdir(written.path.parent)
        return "ds/", {}


class TestFileURL(_BackendConformance):
    @pytest.fixture
    def backend(self, written: Written) -> Backend:
        return f"file://{written.path}", {}


class TestHTTP(_BackendConformance):
    @pytest.fixture
    def origin_url(self, serve_dir, written: Written):
        return serve_dir(written.path)

    @pytest.fixture
    def backend(self, origin_url) -> Backend:
        return origin_url[1], {}

    # -- HTTP only ------------------------------------------------------------------

    def test_each_block_is_one_range_request(self, origin_url, written: Written) -> None:
        origin, url = origin_url
        src = TokenSource(url)
        origin.clear_access_log()
        m = src.manifest
        blocks = list(range(m.num_blocks - 1, -1, -2))  # some blocks, out of order
        for b in blocks:
            src.block(b)
        log = origin.access_log()
        expected = []
        for b in blocks:
            path, start, stop = written.record_span(b)
            expected.append(("GET", f"/ds/{path}", 206, f"bytes={start}-{stop - 1}", stop - start))
        assert [(r.method, r.path, r.status, r.range, r.bytes_sent) for r in log] == expected

    @pytest.mark.parametrize("small_windows", [False, True], ids=["one-window", "small-windows"])
    def test_epoch_without_cache_fetches_each_block_once(
        self, origin_url, written: Written, small_windows: bool
    ) -> None:
        """When the decoded-block arena can hold the whole dataset, an epoch reads each block once."""
        origin, url = origin_url
        if small_windows:
            n = written.manifest.num_blocks
            ds = TokenDataset(url, SEQ_LEN, shard_size=16, window_shards=2, arena_blocks=n)
        else:  # default shards: the small dataset is a single shuffle window
            ds = TokenDataset(url, SEQ_LEN)
        origin.clear_access_log()
        ids = check_samples(written, SEQ_LEN, ds)
        assert_exactly_once(ids, ds.num_samples)
        log = origin.access_log()
        assert all(r.status == 206 and r.range is not None for r in log), log
        assert all(r.path.startswith("/ds/data/") for r in log), log
        spans = {written.record_span(b) for b in range(written.blocks_needed(SEQ_LEN))}
        expected = {(f"/ds/{p}", f"bytes={a}-{b - 1}") for p, a, b in spans}
        got = [(r.path, r.range) for r in log]
        # every block is read (the epoch needs them all) and none twice
        assert sorted(got) == sorted(expected)

    def test_flaky_origin_is_retried(self, serve_dir, written: Written) -> None:
        origin, url = serve_dir(written.path, via="flaky", flaky_every=3)
        storage = Storage(url, retry=RetryPolicy(attempts=3, backoff=0.001))
        src = TokenSource(url, storage=storage)
        for b in range(src.manifest.num_blocks):
            lo, hi = written.block_range(b)
            np.testing.assert_array_equal(src.block(b)[0], written.stream[lo:hi])
        log = origin.access_log()
        failures = sum(1 for r in log if r.status == 503)
        assert failures >= written.manifest.num_blocks // 3
        assert storage.stats.retries == failures
        assert all(r.path.startswith("/flaky/ds/") for r in log)

    def test_flaky_origin_dataset_epoch(self, serve_dir, written: Written) -> None:
        _, url = serve_dir(written.path, via="flaky", flaky_every=3)
        ds = TokenDataset(url, SEQ_LEN)
        # Blocks are fetched on several threads at once, so which request gets the
        # 503 is up to the scheduler; a generous budget makes "every attempt of one
        # read failed" negligible (3**-10).
        ds.source.storage.retry = RetryPolicy(attempts=10, backoff=0.001)
        ids = check_samples(written, SEQ_LEN, ds)
        assert_exactly_once(ids, ds.num_samples)
        assert ds.source.storage.stats.retries > 0

    def test_down_origin_raises_after_retry_budget(self, serve_dir, written: Written) -> None:
        origin, url = serve_dir(written.path, via="down")
        storage = Storage(url, retry=RetryPolicy(attempts=3, backoff=0.01))
        with pytest.raises(stoker.StorageError) as info:
            TokenSource(url, storage=storage)
        assert not isinstance(info.value, stoker.UnreachableError)
        assert not isinstance(info.value, stoker.ManifestError)
        assert f"{url}/manifest.json" in str(info.value)
        log = origin.access_log()
        assert [(r.path, r.status) for r in log] == [("/down/ds/manifest.json", 503)] * 3
        assert storage.stats.retries == 2

    def test_dropped_connections_raise_after_retry_budget(
        self, serve_dir, written: Written
    ) -> None:
        origin, url = serve_dir(written.path, via="drop")
        storage = Storage(url, retry=RetryPolicy(attempts=3, backoff=0.01))
        with pytest.raises(stoker.StorageError) as info:
            storage.read_range("manifest.json", 0, 10)
        assert f"{url}/manifest.json" in str(info.value)
        assert storage.stats.errors == 3
        log = origin.access_log()
        # the HTTP client may resend a request once on its own when the connection
        # drops; stoker's three attempts are at least three requests
        assert len(log) >= 3
        assert {(r.path, r.status) for r in log} == {("/drop/ds/manifest.json", 444)}


@pytest.fixture(scope="module")
def s3_url(s3_server, written: Written) -> str:
    bucket = f"stoker-it-{uuid.uuid4().hex[:12]}"
    keys = s3_server.upload_dir(written.path, bucket, "some/prefix/ds")
    assert "some/prefix/ds/manifest.json" in keys
    return f"s3://{bucket}/some/prefix/ds"


class TestS3(_BackendConformance):
    @pytest.fixture
    def backend(self, s3_server, s3_url: str) -> Backend:
        return s3_url, s3_server.storage_options()

    def test_list_names_a_prefix_and_append_is_refused(
        self, s3_server, s3_url: str, written: Written
    ) -> None:
        storage = Storage(s3_url, s3_server.storage_options())
        files = sorted({f.path.rsplit("/", 1)[1] for f in written.manifest.files})
        assert storage.list("data") == files
        assert storage.list("no-such-prefix") == []
        assert not storage.appends
        with pytest.raises(stoker.ConfigError, match="cannot append"):
            storage.append("journal/x.jsonl", b"x")

    def test_blocks_are_ranged_gets(self, s3_server, s3_url: str, written: Written) -> None:
        opts = s3_server.storage_options()
        src = TokenSource(s3_url, opts)
        bucket, _, prefix = s3_url.removeprefix("s3://").partition("/")
        path = written.manifest.files[1].path
        before = s3_server.count_requests(bucket, f"{prefix}/{path}", method="GET")
        for b in range(4, 8):  # the blocks of data file 1
            assert written.manifest.block_file(b).path == path
            src.block(b)
        after = s3_server.count_requests(bucket, f"{prefix}/{path}", method="GET")
        assert after - before == 4
        gets = [r for r in s3_server.request_log() if r.path == f"/{bucket}/{prefix}/{path}"]
        assert [r.status for r in gets[-4:]] == [206] * 4
