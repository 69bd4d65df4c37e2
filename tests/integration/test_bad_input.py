"""Bad datasets, bad arguments and bad states fail with the documented error, naming the culprit."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from servers import free_port
from torch.utils.data import DataLoader

import stoker
from stoker import TokenDataset, TokenSource

from .helpers import Written, check_samples, write_dataset

SEQ_LEN = 16


@pytest.fixture
def dataset(small_dataset: Written, tmp_path: Path) -> Written:
    """A private copy of the small dataset, at ``<tmp>/root/ds``, to break."""
    return small_dataset.copy_to(tmp_path / "root" / "ds")


# --------------------------------------------------------------------------- manifest


@pytest.mark.parametrize("via", ["local", "http"])
def test_missing_manifest(dataset: Written, serve_dir, via: str) -> None:
    (dataset.path / "manifest.json").unlink()
    url = str(dataset.path) if via == "local" else serve_dir(dataset.path)[1]
    with pytest.raises(stoker.ManifestError) as info:
        TokenSource(url)
    assert f"{url}/manifest.json" in str(info.value)
    assert "no manifest" in str(info.value)
    with pytest.raises(stoker.ManifestError):
        TokenDataset(url, SEQ_LEN)


def test_not_json_manifest(dataset: Written) -> None:
    dataset.write_manifest('{"format": "stoker-tokens", ')
    with pytest.raises(stoker.ManifestError) as info:
        TokenSource(str(dataset.path))
    assert f"{dataset.path}/manifest.json" in str(info.value)
    assert "JSON" in str(info.value)


def _drop(raw: dict[str, Any], *keys: str) -> None:
    for key in keys[:-1]:
        raw = raw[key]
    del raw[keys[-1]]


def _set(value: Any, *keys: str | int):
    def edit(raw: dict[str, Any]) -> None:
        for key in keys[:-1]:
            raw = raw[key]
        raw[keys[-1]] = value

    return edit


MALFORMED = {
    "missing-dataset_id": (lambda raw: _drop(raw, "dataset_id"), "dataset_id"),
    "missing-num_tokens": (lambda raw: _drop(raw, "num_tokens"), "num_tokens"),
    "missing-files": (lambda raw: _drop(raw, "files"), "files"),
    "missing-compression-level": (lambda raw: _drop(raw, "compression", "level"), "level"),
    "missing-file-bytes": (lambda raw: _drop(raw, "files", 0, "bytes"), "bytes"),
    "str-block_tokens": (_set("256", "block_tokens"), "block_tokens"),
    "bool-num_tokens": (_set(True, "num_tokens"), "num_tokens"),
    "float-vocab_size": (_set(50000.0, "vocab_size"), "vocab_size"),
    "negative-num_documents": (_set(-1, "num_documents"), "num_documents"),
    "zero-block_tokens": (_set(0, "block_tokens"), "block_tokens"),
    "dict-files": (_set({}, "files"), "files"),
    "int-dtype": (_set(2, "dtype"), "dtype"),
    "unknown-dtype": (_set("int8", "dtype"), "dtype"),
    "null-index": (_set(None, "index"), "index"),
    "list-manifest": (None, None),
}


@pytest.mark.parametrize("case", list(MALFORMED))
def test_malformed_manifest_names_the_field(dataset: Written, case: str) -> None:
    edit, field = MALFORMED[case]
    if edit is None:
        dataset.write_manifest(json.dumps([dataset.manifest_dict()]))
    else:
        raw = dataset.manifest_dict()
        edit(raw)
        dataset.write_manifest(raw)
    with pytest.raises(stoker.ManifestError) as info:
        TokenSource(str(dataset.path))
    msg = str(info.value)
    assert f"{dataset.path}/manifest.json" in msg
    if field is not None:
        assert repr(field) in msg or f"field {field}" in msg, msg


def test_inconsistent_manifest(dataset: Written) -> None:
    raw = dataset.manifest_dict()
    raw["num_tokens"] += raw["block_tokens"] * raw["blocks_per_file"]  # a file more than listed
    dataset.write_manifest(raw)
    with pytest.raises(stoker.ManifestError, match="data files listed"):
        TokenSource(str(dataset.path))


@pytest.mark.parametrize("version", [2, 0, "1", None])
def test_unsupported_format_version(dataset: Written, version: Any) -> None:
    raw = dataset.manifest_dict()
    raw["format_version"] = version
    dataset.write_manifest(raw)
    with pytest.raises(stoker.UnsupportedFormatError) as info:
        TokenSource(str(dataset.path))
    assert "format_version" in str(info.value)
    assert repr(version) in str(info.value)


def test_other_format(dataset: Written) -> None:
    raw = dataset.manifest_dict()
    raw["format"] = "mds"
    dataset.write_manifest(raw)
    with pytest.raises(stoker.ManifestError, match="'format'") as info:
        TokenSource(str(dataset.path))
    assert not isinstance(info.value, stoker.UnsupportedFormatError)


@pytest.mark.parametrize(
    "bad_path",
    [
        "../x.bin",
        "data/../../x.bin",
        "/etc/passwd",
        "s3://other/x",
        "file:///etc/passwd",
        "~/x",
        # what a backend decodes: an HTTP origin turns %2e%2e into .., a URL ends at ? or #
        "%2e%2e/x.bin",
        "data/%2E%2E/%2e%2e/x.bin",
        "..%2fx.bin",
        "data/x.bin?../../x.bin",
        "data/x.bin#frag",
        "c:/x.bin",
        "data\\..\\..\\x.bin",
        "./data/../../x.bin",
        "data//x.bin",
    ],
)
@pytest.mark.parametrize("where", ["data-file", "index", "dictionary", "tokenizer"])
def test_paths_outside_the_dataset(dataset: Written, bad_path: str, where: str) -> None:
    outside = dataset.path.parent / "x.bin"
    outside.write_bytes(b"\0" * 64)  # something there to read, should a path slip through
    raw = dataset.manifest_dict()
    if where == "data-file":
        raw["files"][-1]["path"] = bad_path
    elif where == "index":
        raw["index"]["path"] = bad_path
    elif where == "dictionary":
        raw["compression"]["dictionary"] = {"path": bad_path, "bytes": 64, "xxh64": None}
    else:
        raw["tokenizer"] = {"name": "t", "sha256": "0" * 64, "path": bad_path}
    dataset.write_manifest(raw)
    with pytest.raises(stoker.ManifestError, match="outside the dataset") as info:
        TokenSource(str(dataset.path))
    assert repr(bad_path) in str(info.value)


def test_missing_index(dataset: Written) -> None:
    (dataset.path / dataset.manifest.index.path).unlink()
    with pytest.raises(stoker.ManifestError) as info:
        TokenSource(str(dataset.path))
    assert dataset.manifest.index.path in str(info.value)


def test_missing_data_file(dataset: Written) -> None:
    ref = dataset.manifest.files[1]
    (dataset.path / ref.path).unlink()
    src = TokenSource(str(dataset.path))
    src.block(0)  # file 0 is still there
    with pytest.raises((FileNotFoundError, stoker.DatasetError)) as info:
        src.block(dataset.manifest.blocks_per_file)
    assert ref.path in str(info.value)


# --------------------------------------------------------------------------- checksums


def _corrupt(dataset: Written, block: int) -> str:
    """Flip bytes in the middle of a block's record; returns its data file."""
    path, start, stop = dataset.record_span(block)
    file = dataset.path / path
    data = bytearray(file.read_bytes())
    mid = (start + stop) // 2
    for i in range(mid, min(mid + 4, stop)):
        data[i] ^= 0xFF
    file.write_bytes(bytes(data))
    return path


def _bad_block(dataset: Written) -> int:
    """A block in the second data file, not its first."""
    return dataset.manifest.blocks_per_file + 1


def test_corrupted_block_local(dataset: Written) -> None:
    block = _bad_block(dataset)
    path = _corrupt(dataset, block)
    src = TokenSource(str(dataset.path))
    with (
        pytest.warns(UserWarning, match=f"block {block} failed its checksum; refetching"),
        pytest.raises(stoker.ChecksumError) as info,
    ):
        src.block(block)
    err = info.value
    assert (err.file, err.block) == (path, block)
    assert path in str(err) and f"block {block}" in str(err)
    # the other blocks of the file still read
    lo, hi = dataset.block_range(block - 1)
    np.testing.assert_array_equal(src.block(block - 1)[0], dataset.stream[lo:hi])


def test_corrupted_block_is_refetched_once_over_http(dataset: Written, serve_dir) -> None:
    block = _bad_block(dataset)
    path, start, stop = dataset.record_span(block)
    _corrupt(dataset, block)
    origin, url = serve_dir(dataset.path)
    src = TokenSource(url)
    origin.clear_access_log()
    with pytest.warns(UserWarning, match="refetching"), pytest.raises(stoker.ChecksumError) as info:
        src.block(block)
    assert f"{url}/{path}" in str(info.value)
    assert info.value.block == block
    log = origin.access_log()
    assert [(r.path, r.range, r.status) for r in log] == [
        (f"/ds/{path}", f"bytes={start}-{stop - 1}", 206)
    ] * 2


def test_corrupted_block_fails_a_dataset_epoch(dataset: Written) -> None:
    block = _bad_block(dataset)
    _corrupt(dataset, block)
    ds = TokenDataset(str(dataset.path), SEQ_LEN)
    with pytest.warns(UserWarning, match="refetching"), pytest.raises(stoker.ChecksumError) as info:
        list(ds)
    assert info.value.block == block


@pytest.mark.filterwarnings("default:.*failed its checksum; refetching:UserWarning")
def test_corrupted_block_through_dataloader_workers(dataset: Written) -> None:
    block = _bad_block(dataset)
    _corrupt(dataset, block)
    ds = TokenDataset(str(dataset.path), SEQ_LEN, batch_size=4)
    with pytest.raises(stoker.ChecksumError) as info:
        list(DataLoader(ds, batch_size=4, num_workers=2, timeout=120))
    assert f"block {block}" in str(info.value)


@pytest.mark.filterwarnings("default:.*failed its checksum; refetching:UserWarning")
def test_corrupted_block_through_coordinator_fed_workers(dataset: Written, tmp_path: Path) -> None:
    """A coordinator-fed loader's worker raises the same typed error a static one does."""
    block = _bad_block(dataset)
    path = _corrupt(dataset, block)
    ds = TokenDataset(str(dataset.path), SEQ_LEN, batch_size=4)
    loader = stoker.TokenLoader(
        ds, num_workers=2, coordinator="rank0", coordinator_state=str(tmp_path / "state")
    )
    try:
        with pytest.raises(stoker.ChecksumError) as info:
            list(loader)
    finally:
        loader.close()
    err = info.value
    assert f"block {block}" in str(err) and path in str(err)
    assert re.search(r"\(in loader worker [01]\)$", str(err))
    assert (err.file, err.block) == (path, block)


def test_corrupted_cache_entry_is_replaced(dataset: Written, tmp_path: Path) -> None:
    cache = stoker.DiskCache(tmp_path / "cache", 1 << 30)
    src = TokenSource(str(dataset.path), cache=cache)
    block = 2
    lo, hi = dataset.block_range(block)
    src.block(block)
    (entry,) = (tmp_path / "cache").glob("*.blk")
    good = entry.read_bytes()
    entry.write_bytes(b"\x00" + good[1:])  # the cache file rots
    np.testing.assert_array_equal(src.block(block)[0], dataset.stream[lo:hi])
    assert entry.read_bytes() == good


def test_corrupted_index(dataset: Written) -> None:
    index = dataset.path / dataset.manifest.index.path
    data = bytearray(index.read_bytes())
    data[8] ^= 0x01
    index.write_bytes(bytes(data))
    with pytest.raises(stoker.ChecksumError) as info:
        TokenSource(str(dataset.path))
    assert dataset.manifest.index.path in str(info.value)


# --------------------------------------------------------------------------- arguments


def test_seq_len_longer_than_dataset(small_dataset: Written) -> None:
    url = str(small_dataset.path)
    n = small_dataset.manifest.num_tokens
    with pytest.raises(stoker.ConfigError) as info:
        TokenDataset(url, n)
    assert str(n) in str(info.value) and url in str(info.value)
    with pytest.raises(stoker.ConfigError):
        TokenDataset(url, 10 * n)
    # the longest seq_len that fits gives exactly one sample: the whole stream
    ds = TokenDataset(url, n - 1)
    items = list(ds)
    assert [item["sample_id"] for item in items] == [0]
    check_samples(small_dataset, n - 1, items)


@pytest.mark.parametrize("kwargs", [{"seq_len": 0}, {"seq_len": 8, "batch_size": 0}])
def test_bad_dataset_arguments(small_dataset: Written, kwargs: dict[str, int]) -> None:
    with pytest.raises(stoker.ConfigError):
        TokenDataset(str(small_dataset.path), **kwargs)


@pytest.mark.timeout(30)
def test_unreachable_url_fails_fast() -> None:
    url = f"http://127.0.0.1:{free_port()}/ds"  # nothing listens there
    with pytest.raises(stoker.UnreachableError) as info:
        TokenSource(url)
    assert url in str(info.value)
    with pytest.raises(stoker.UnreachableError):
        TokenDataset(url, SEQ_LEN)


# --------------------------------------------------------------------------- resume state


def _state_after(ds: TokenDataset, n: int) -> dict[str, Any]:
    it = iter(ds)
    for _ in range(n):
        next(it)
    state = ds.state_dict()
    it.close()
    return state


def test_state_from_another_dataset(small_dataset: Written, tmp_path: Path) -> None:
    # the same documents written again: same size and content, another dataset id
    twin = write_dataset(tmp_path / "twin", num_docs=40, seed=1, block_tokens=256)
    assert twin.manifest.num_tokens == small_dataset.manifest.num_tokens
    assert twin.manifest.dataset_id != small_dataset.manifest.dataset_id

    ds = TokenDataset(str(small_dataset.path), SEQ_LEN)
    state = _state_after(ds, 5)
    json.dumps(state)  # a state is plain JSON
    target = TokenDataset(str(twin.path), SEQ_LEN)
    with pytest.raises(stoker.StateError, match="dataset_id"):
        target.load_state_dict(state)


@pytest.mark.parametrize(
    "change",
    [
        {"seq_len": SEQ_LEN * 2},
        {"seed": 99},
        {"shuffle": False},
        {"shard_size": 3},
        {"window_shards": 2},
        {"drop_remainder": True},
    ],
)
def test_state_from_another_configuration(small_dataset: Written, change: dict[str, Any]) -> None:
    url = str(small_dataset.path)
    state = _state_after(TokenDataset(url, SEQ_LEN), 5)
    kwargs: dict[str, Any] = {"seq_len": SEQ_LEN, **change}
    target = TokenDataset(url, **kwargs)
    with pytest.raises(stoker.StateError) as info:
        target.load_state_dict(state)
    name = next(iter(change))
    # seq_len also changes the number of samples, which may be what is reported
    names = (name, "num_samples") if name == "seq_len" else (name,)
    assert any(n in str(info.value) for n in names), str(info.value)


@pytest.mark.parametrize(
    "state",
    [None, [], {}, {"stoker_state": 2}],
    ids=["none", "list", "empty", "future-version"],
)
def test_state_that_is_not_a_stoker_state(small_dataset: Written, state: Any) -> None:
    ds = TokenDataset(str(small_dataset.path), SEQ_LEN)
    with pytest.raises(stoker.StateError):
        ds.load_state_dict(state)


def test_tampered_state(small_dataset: Written) -> None:
    url = str(small_dataset.path)
    state = _state_after(TokenDataset(url, SEQ_LEN), 5)
    for field, value in [("consumed", -1), ("consumed", 10**9), ("epoch_set", "x"), ("world", 0)]:
        bad = {**state, field: value}
        with pytest.raises(stoker.StateError):
            TokenDataset(url, SEQ_LEN).load_state_dict(bad)
    # the untouched state still loads, and continues where it stopped
    ds = TokenDataset(url, SEQ_LEN)
    ds.load_state_dict(state)
    full = [item["sample_id"] for item in TokenDataset(url, SEQ_LEN)]
    assert [item["sample_id"] for item in ds] == full[5:]
