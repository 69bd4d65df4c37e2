"""What travels to and from a preprocessing worker: the work spec as JSON (each bad
field named), a request, and rows as an Arrow record batch (no pickle)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from stoker.errors import ConfigError, ProtocolError
from stoker.preprocess.client import Pool, parse_pool
from stoker.preprocess.spec import WorkSpec, import_transform, transform_path
from stoker.preprocess.wire import Request, from_batch, to_batch


def test_a_spec_survives_json_and_a_bad_field_is_named() -> None:
    spec = WorkSpec("s3://b/ds", image_size=64, transform="json:dumps", label_column=False)
    assert WorkSpec.from_json(spec.to_json()) == spec
    raw = json.loads(spec.to_json())
    for field, value, said in [
        ("image_size", "64", "image_size"),
        ("image_size", True, "image_size"),  # (a bool is not an int here)
        ("decode", 1, "decode"),
        ("transform", 3, "transform"),
    ]:
        with pytest.raises(ConfigError, match=said):
            WorkSpec.from_json(json.dumps({**raw, field: value}))
    with pytest.raises(ConfigError, match=r"unknown fields \['code'\]"):
        WorkSpec.from_json(json.dumps({**raw, "code": "import os"}))
    with pytest.raises(ConfigError, match="names no dataset"):
        WorkSpec.from_json(json.dumps({k: v for k, v in raw.items() if k != "url"}))
    with pytest.raises(ConfigError, match="not JSON"):
        WorkSpec.from_json(b"\x80(pickle")
    # sizes a worker would allocate or let an image claim are bounded
    for field, value in [("image_size", 60_000), ("max_bytes", 1 << 40), ("max_pixels", 1 << 40),
                         ("image_size", 0)]:  # fmt: skip
        with pytest.raises(ConfigError, match=rf"{field}.*not in \[1, "):
            WorkSpec.from_json(json.dumps({**raw, field: value}))


def test_a_transform_travels_by_name_only() -> None:
    assert import_transform("json:dumps") is json.dumps
    assert transform_path(json.dumps) == "json:dumps"
    with pytest.raises(ConfigError, match=r"package\.module:function"):
        import_transform("json.dumps")
    with pytest.raises(ConfigError, match="cannot import"):
        import_transform("no_such_module_here:f")
    with pytest.raises(ConfigError, match="has no"):
        import_transform("json:no_such_function")
    with pytest.raises(ConfigError, match="cannot be imported by a worker"):
        transform_path(lambda x: x)

    def local(x: object) -> object:
        return x

    with pytest.raises(ConfigError, match="cannot be imported by a worker"):
        transform_path(local)


def test_a_request_survives_bytes_and_a_malformed_one_is_refused() -> None:
    req = Request(WorkSpec("file:///d"), 3, [5, 1, 9], [2, 4], "s1", [3, 3, 4], order=7)
    assert Request.from_bytes(req.to_bytes()) == req
    raw = json.loads(req.to_bytes())
    with pytest.raises(ConfigError, match="order is -1"):
        Request.from_bytes(json.dumps({**raw, "order": -1}).encode())
    with pytest.raises(ConfigError, match="malformed"):
        Request.from_bytes(json.dumps({**raw, "ids": "all"}).encode())
    with pytest.raises(ConfigError, match="one a row"):
        Request.from_bytes(json.dumps({**raw, "epochs": [1]}).encode())
    with pytest.raises(ConfigError, match="unknown fields"):
        Request.from_bytes(json.dumps({**raw, "spec": {"url": "x", "evil": 1}}).encode())
    for ids, ahead in [([], []), (list(range(5000)), []), ([1], list(range(5000)))]:
        with pytest.raises(ConfigError, match="1 to 4096"):
            Request.from_bytes(
                json.dumps({**raw, "ids": ids, "ahead": ahead, "epochs": None}).encode()
            )


@given(
    n=st.integers(0, 5),
    shape=st.lists(st.integers(1, 4), max_size=3),
    dtype=st.sampled_from(["uint8", "int64", "bool", "float32", "int32"]),
)
def test_rows_survive_an_arrow_batch(n: int, shape: list[int], dtype: str) -> None:
    rng = np.random.default_rng(n)
    arrays = {
        "image": (rng.random((n, *shape)) * 100).astype(dtype),
        "sample_id": np.arange(n, dtype=np.int64),
    }
    back = from_batch(to_batch(arrays))
    assert set(back) == set(arrays)
    for k, a in arrays.items():
        assert back[k].dtype == a.dtype and back[k].shape == a.shape
        np.testing.assert_array_equal(back[k], a)


def test_a_batch_without_its_field_metadata_is_refused() -> None:
    import pyarrow as pa

    with pytest.raises(ProtocolError, match="metadata"):
        from_batch(pa.RecordBatch.from_pydict({"image": [b"x"]}))


def test_a_pool_is_grpc_addresses_or_a_coordinator() -> None:
    assert parse_pool("grpc://a:1,b:2") == Pool(addresses=("a:1", "b:2"))
    assert parse_pool(["grpc://a:1", "c:3"]) == Pool(addresses=("a:1", "c:3"))
    assert parse_pool("coordinator://h:7") == Pool(coordinator="h:7")
    for bad in ("grpc://nowhere", "a:b", "", "coordinator://h"):
        with pytest.raises(ConfigError, match="grpc://HOST:PORT"):
            parse_pool(bad)


def test_every_spec_field_is_checked() -> None:
    import dataclasses

    from stoker.preprocess import spec

    assert set(spec._KINDS) == {f.name for f in dataclasses.fields(WorkSpec)}
