"""Self-tests of the real-server fixtures in tests/servers.py."""

from __future__ import annotations

import http.client
import multiprocessing
import time
import uuid
from pathlib import Path

import fsspec
import pytest
from servers import MotoS3Server, NginxOrigin


def _payload(n: int, seed: int = 0) -> bytes:
    # Non-repeating content so that an off-by-one range shows up.
    return bytes((i * 7 + seed + (i >> 8) * 13) % 251 for i in range(n))


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    root = tmp_path / "root"
    (root / "sub").mkdir(parents=True)
    (root / "shard-0.bin").write_bytes(_payload(100_000))
    (root / "sub" / "shard-1.bin").write_bytes(_payload(5_000, seed=1))
    return root


def _get(origin: NginxOrigin, path: str, headers: dict[str, str] | None = None):
    conn = http.client.HTTPConnection("127.0.0.1", origin.port, timeout=30)
    try:
        conn.request("GET", path, headers=headers or {})
        resp = conn.getresponse()
        return resp.status, dict(resp.getheaders()), resp.read()
    finally:
        conn.close()


# --------------------------------------------------------------------------- nginx


def test_nginx_range_request_exact_bytes_and_logged(nginx_origin, data_dir):
    origin = nginx_origin(data_dir)
    data = (data_dir / "shard-0.bin").read_bytes()

    status, headers, body = _get(origin, "/shard-0.bin", {"Range": "bytes=1000-1999"})
    assert status == 206
    assert body == data[1000:2000]
    assert headers["Content-Range"] == f"bytes 1000-1999/{len(data)}"

    status, headers, body = _get(origin, "/shard-0.bin")
    assert status == 200
    assert body == data
    assert headers["Accept-Ranges"] == "bytes"

    log = origin.access_log()
    assert [(r.method, r.path, r.status, r.range, r.bytes_sent) for r in log] == [
        ("GET", "/shard-0.bin", 206, "bytes=1000-1999", 1000),
        ("GET", "/shard-0.bin", 200, None, len(data)),
    ]

    origin.clear_access_log()
    assert origin.access_log() == []


def test_nginx_fsspec_cat_file_and_ls(nginx_origin, data_dir):
    origin = nginx_origin(data_dir)
    data = (data_dir / "shard-0.bin").read_bytes()
    fs = fsspec.filesystem("http", skip_instance_cache=True)

    url = origin.url_for("shard-0.bin")
    assert fs.cat_file(url, start=12_345, end=54_321) == data[12_345:54_321]
    assert fs.size(url) == len(data)

    names = {
        entry.rstrip("/").rsplit("/", 1)[-1] for entry in fs.ls(origin.url + "/", detail=False)
    }
    assert {"shard-0.bin", "sub"} <= names
    assert fs.cat_file(origin.url_for("sub/shard-1.bin")) == _payload(5_000, seed=1)

    ranged = [r for r in origin.access_log() if r.path == "/shard-0.bin" and r.method == "GET"]
    assert [(r.status, r.range, r.bytes_sent) for r in ranged] == [
        (206, "bytes=12345-54320", 54_321 - 12_345)
    ]


def test_nginx_down_and_drop(nginx_origin, data_dir):
    origin = nginx_origin(data_dir)
    status, _, _ = _get(origin, "/down/shard-0.bin")
    assert status == 503
    with pytest.raises(http.client.RemoteDisconnected):
        _get(origin, "/drop/shard-0.bin")
    log = origin.access_log()
    assert [(r.path, r.status) for r in log] == [
        ("/down/shard-0.bin", 503),
        ("/drop/shard-0.bin", 444),
    ]


def test_nginx_slow_is_throttled(nginx_origin, data_dir):
    rate = 16 * 1024
    (data_dir / "big.bin").write_bytes(_payload(4 * rate))
    origin = nginx_origin(data_dir, slow_rate=rate)
    t0 = time.monotonic()
    status, _, body = _get(origin, "/slow/big.bin")
    elapsed = time.monotonic() - t0
    assert status == 200
    assert body == _payload(4 * rate)
    # 4 s at the nominal rate; nginx lets the first chunk through at once.
    assert elapsed >= 1.5, elapsed
    t0 = time.monotonic()
    assert _get(origin, "/big.bin")[0] == 200
    assert time.monotonic() - t0 < 1.0


def test_nginx_flaky_every(nginx_origin, data_dir):
    origin = nginx_origin(data_dir, flaky_every=3)
    data = (data_dir / "shard-0.bin").read_bytes()
    statuses = []
    for _ in range(9):
        status, _, body = _get(origin, "/flaky/shard-0.bin", {"Range": "bytes=10-19"})
        statuses.append(status)
        if status == 206:
            assert body == data[10:20]
    assert statuses == [206, 206, 503] * 3
    assert [r.status for r in origin.access_log()] == statuses


def test_nginx_startup_error_shows_error_log(nginx_bin, data_dir, tmp_path):
    origin = NginxOrigin(data_dir, nginx=nginx_bin, slow_rate=-1, prefix=tmp_path / "bad")
    with pytest.raises(RuntimeError, match="limit_rate"):
        origin.start()
    origin.stop()


# --------------------------------------------------------------------------- moto


def _bucket() -> str:
    return f"test-{uuid.uuid4().hex[:12]}"


def test_moto_roundtrip_through_s3fs(s3_server: MotoS3Server, data_dir):
    bucket = _bucket()
    keys = s3_server.upload_dir(data_dir, bucket, "ds")
    assert keys == ["ds/shard-0.bin", "ds/sub/shard-1.bin"]
    data = (data_dir / "shard-0.bin").read_bytes()

    fs = fsspec.filesystem("s3", skip_instance_cache=True, **s3_server.storage_options())
    assert fs.cat_file(f"{bucket}/ds/shard-0.bin") == data
    assert fs.cat_file(f"{bucket}/ds/shard-0.bin", start=777, end=8_888) == data[777:8_888]
    assert fs.size(f"{bucket}/ds/sub/shard-1.bin") == 5_000
    assert sorted(fs.find(f"{bucket}/ds")) == [f"{bucket}/{k}" for k in keys]

    gets = [
        r
        for r in s3_server.request_log()
        if r.method == "GET" and r.path == f"/{bucket}/ds/shard-0.bin"
    ]
    assert sorted(r.status for r in gets) == [200, 206]
    assert s3_server.count_requests(bucket, "ds/shard-0.bin", method="GET") == 2


def _child_read(storage_options, path, queue) -> None:
    # New filesystem in the child: nothing from the parent's s3fs instance is reused.
    import s3fs

    try:
        fs = s3fs.S3FileSystem(skip_instance_cache=True, **storage_options)
        queue.put(("ok", fs.cat_file(path), fs.cat_file(path, start=100, end=4_100)))
    except BaseException as exc:
        queue.put(("error", repr(exc), b""))


def test_moto_read_in_forked_child_after_parent_read(s3_server: MotoS3Server, data_dir):
    bucket = _bucket()
    s3_server.upload_dir(data_dir, bucket)
    data = (data_dir / "shard-0.bin").read_bytes()
    opts = s3_server.storage_options()
    path = f"{bucket}/shard-0.bin"

    # The parent reads first, which starts fsspec's event-loop thread and opens
    # aiohttp connections, then forks.
    parent_fs = fsspec.filesystem("s3", skip_instance_cache=True, **opts)
    assert parent_fs.cat_file(path, start=0, end=10) == data[:10]
    before = s3_server.count_requests(bucket, "shard-0.bin", method="GET")

    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    child = ctx.Process(target=_child_read, args=(opts, path, queue))
    child.start()
    try:
        outcome, full, ranged = queue.get(timeout=60)
    finally:
        child.join(timeout=30)
        if child.is_alive():
            child.kill()
            child.join()
    assert outcome == "ok", full
    assert full == data
    assert ranged == data[100:4_100]
    assert child.exitcode == 0
    assert s3_server.count_requests(bucket, "shard-0.bin", method="GET") == before + 2

    # The parent's filesystem still works after the fork.
    assert parent_fs.cat_file(path, start=10, end=20) == data[10:20]
