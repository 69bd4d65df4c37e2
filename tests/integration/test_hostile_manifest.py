"""A manifest that does not describe its data is refused by name, never read as garbage.

Each case edits a real dataset's manifest the way a hand edit, a buggy tool or a
forgery would, and checks that every process that can meet the dataset (the
reader in-process, a TokenLoader worker, a torch DataLoader worker, the node
agent) raises the typed error naming the file and the block or the field.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from torch.utils.data import DataLoader

import stoker
from stoker import TokenDataset, TokenLoader, TokenSource
from stoker.manifest import INDEX_DTYPE

from .helpers import Written, check_samples
from .test_agent import Agents

SEQ_LEN = 16


@pytest.fixture
def dataset(small_dataset: Written, tmp_path: Path) -> Written:
    return small_dataset.copy_to(tmp_path / "root" / "ds")


def _edit(dataset: Written, *path: str | int, value: Any, unseal: bool = False) -> None:
    raw = dataset.manifest_dict()
    if unseal:
        raw.pop("decode_xxh64", None)  # as a dataset written before the checksum existed
    obj = raw
    for key in path[:-1]:
        obj = obj[key]
    obj[path[-1]] = value
    dataset.write_manifest(raw)


# ------------------------------------------------------------------ field types and ranges

WRONG = [
    # the string "false" is truthy: read as a bool it turned every row into garbage
    (("compression", "shuffle"), "false", "shuffle"),
    (("compression", "shuffle"), 0, "shuffle"),
    (("compression", "shuffle"), None, "shuffle"),
    (("compression", "level"), 99, "level"),
    (("compression", "level"), "9", "level"),
    (("compression", "min_match"), "4", "min_match"),
    (("compression", "min_match"), 1, "min_match"),
    (("vocab_size",), 2**70, "vocab_size"),
    (("vocab_size",), 0, "vocab_size"),
    (("num_tokens",), 2**80, "num_tokens"),
    (("eos_id",), 50_000, "eos_id"),  # outside the vocabulary [0, 50000)
    (("eos_id",), "0", "eos_id"),
    (("eos_id",), -1, "eos_id"),
    (("num_documents",), 10**9, "num_documents"),  # more documents than tokens
    (("blocks_per_file",), 2**40, "blocks_per_file"),
    (("compressed_bytes",), "many", "compressed_bytes"),
    (("compressed_bytes",), -1, "compressed_bytes"),
    (("created",), 5, "created"),
    (("writer",), ["stoker"], "writer"),
    (("dataset_id",), "../../etc", "dataset_id"),
    (("dataset_id",), "", "dataset_id"),
    (("index", "xxh64"), 1234, "xxh64"),
    (("index", "xxh64"), "not-a-checksum!!", "xxh64"),
    (("files", 0, "bytes"), -5, "bytes"),
    (("files", 0, "bytes"), 1.5, "bytes"),
    (("files", 0, "xxh64"), True, "xxh64"),
    (("tokenizer",), {"name": "t", "sha256": "0" * 64, "eos_token": 7}, "eos_token"),
    (("decode_xxh64",), 17, "decode_xxh64"),
]


@pytest.mark.parametrize(("path", "value", "field"), WRONG, ids=lambda v: repr(v)[:24])
def test_every_field_is_checked_by_type_and_range(
    dataset: Written, path: tuple[str | int, ...], value: Any, field: str
) -> None:
    _edit(dataset, *path, value=value)
    with pytest.raises(stoker.ManifestError) as info:
        TokenSource(str(dataset.path))
    msg = str(info.value)
    assert f"{dataset.path}/manifest.json" in msg
    assert repr(field) in msg, msg


def test_a_written_manifest_carries_its_decode_checksum(dataset: Written) -> None:
    raw = dataset.manifest_dict()
    assert raw["decode_xxh64"] == dataset.manifest.decode_digest()
    assert TokenSource(str(dataset.path)).manifest.decode_xxh64 == raw["decode_xxh64"]


@pytest.mark.parametrize(
    ("path", "value"),
    [
        (("compression", "shuffle"), True),  # a valid value, but not how the data was written
        (("vocab_size",), 1000),
        (("dtype",), "uint32"),
        (("eos_id",), 1),
    ],
)
def test_an_edited_decoding_setting_fails_the_decode_checksum(
    dataset: Written, path: tuple[str, ...], value: Any
) -> None:
    _edit(dataset, *path, value=value)
    with pytest.raises(stoker.ManifestError, match="edited after it was written") as info:
        TokenSource(str(dataset.path))
    assert f"{dataset.path}/manifest.json" in str(info.value)


def test_informational_fields_may_change(dataset: Written) -> None:
    raw = dataset.manifest_dict()
    raw["created"] = "2030-01-01T00:00:00+00:00"
    raw["writer"] = "another tool"
    raw["compression"]["level"] = 3
    dataset.write_manifest(raw)
    ds = TokenDataset(str(dataset.path), SEQ_LEN, shuffle=False)
    assert len(check_samples(dataset, SEQ_LEN, ds)) == dataset.num_samples(SEQ_LEN)


# ------------------------------------------------------- a manifest that does not fit its data

#: Edits that type-check, on a manifest without the decode checksum (as written by an
#: older stoker), that make the blocks decode to something other than the data.
MISFITS = {
    "shuffle-flipped": (("compression", "shuffle"), True, "outside the manifest's vocabulary"),
    "vocab-too-small": (("vocab_size",), 1000, "outside the manifest's vocabulary"),
    "wider-dtype": (("dtype",), "uint32", "does not decode as the manifest describes"),
}


@pytest.mark.parametrize("case", list(MISFITS))
def test_a_misfit_manifest_fails_in_process(dataset: Written, case: str) -> None:
    path, value, text = MISFITS[case]
    _edit(dataset, *path, value=value, unseal=True)
    src = TokenSource(str(dataset.path))
    file = dataset.manifest.block_file(0).path
    with pytest.raises(stoker.ManifestError, match=text) as info:
        src.block(0)
    assert f"{file}: block 0" in str(info.value)
    with pytest.raises(stoker.ManifestError, match=text):
        list(TokenDataset(str(dataset.path), SEQ_LEN))


@pytest.mark.parametrize("front", ["token-loader", "dataloader"])
def test_a_misfit_manifest_fails_in_worker_processes(dataset: Written, front: str) -> None:
    _edit(dataset, "compression", "shuffle", value=True, unseal=True)
    ds = TokenDataset(str(dataset.path), SEQ_LEN, batch_size=4)
    loader: Any = (
        TokenLoader(ds, num_workers=2, timeout=120)
        if front == "token-loader"
        else DataLoader(ds, batch_size=4, num_workers=2, timeout=120)
    )
    with pytest.raises(stoker.ManifestError, match="outside the manifest's vocabulary") as info:
        list(loader)
    assert "block " in str(info.value)


def test_a_misfit_manifest_fails_through_the_node_agent(
    dataset: Written, tmp_path: Path, agents: Agents
) -> None:
    _edit(dataset, "compression", "shuffle", value=True, unseal=True)
    cache = tmp_path / "cache"
    agents.start(cache)
    ds = TokenDataset(str(dataset.path), SEQ_LEN, cache_dir=cache)
    assert ds.agent is not None
    agents.own(ds.agent)  # its connection is closed at the end
    with pytest.raises(stoker.ManifestError, match="outside the manifest's vocabulary") as info:
        list(ds)
    assert "from the stoker agent" in str(info.value)  # the agent decoded, and refused
    assert "block " in str(info.value)


def test_forged_index_entries_are_refused(dataset: Written) -> None:
    index_path = dataset.path / dataset.manifest.index.path
    index = np.frombuffer(index_path.read_bytes(), INDEX_DTYPE).copy()
    index[3]["offset"] = dataset.manifest.block_file(3).bytes + 10  # past the end of its file
    index_path.write_bytes(index.tobytes())
    raw = dataset.manifest_dict()
    raw.pop("decode_xxh64")
    raw["index"]["xxh64"] = None  # no checksum to catch it
    dataset.write_manifest(raw)
    with pytest.raises(stoker.ManifestError, match="entry of block 3") as info:
        TokenSource(str(dataset.path))
    assert dataset.manifest.block_file(3).path in str(info.value)


def test_document_starts_must_match_the_index(dataset: Written) -> None:
    index_path = dataset.path / dataset.manifest.index.path
    index = np.frombuffer(index_path.read_bytes(), INDEX_DTYPE).copy()
    index[1]["doc_starts"] += 1
    index_path.write_bytes(index.tobytes())
    raw = dataset.manifest_dict()
    raw.pop("decode_xxh64")
    raw["index"]["xxh64"] = None
    dataset.write_manifest(raw)
    src = TokenSource(str(dataset.path))
    with pytest.raises(stoker.ManifestError, match="document starts") as info:
        src.block(1)
    assert "block 1" in str(info.value)


def _forge_lead(dataset: Written, block: int, lead: int) -> None:
    index_path = dataset.path / dataset.manifest.index.path
    index = np.frombuffer(index_path.read_bytes(), INDEX_DTYPE).copy()
    index[block]["lead"] = lead
    index_path.write_bytes(index.tobytes())
    raw = dataset.manifest_dict()
    raw.pop("decode_xxh64")
    raw["index"]["xxh64"] = None
    dataset.write_manifest(raw)


def test_a_first_token_that_is_not_the_blocks_is_refused(dataset: Written) -> None:
    """The index's record of a block's first token is checked by every decode of it."""
    from stoker.manifest import encode_lead

    src = TokenSource(str(dataset.path))
    toks, _ = src.block(2)
    _forge_lead(dataset, 2, encode_lead((int(toks[0]) + 1) % dataset.manifest.vocab_size, False))
    src = TokenSource(str(dataset.path))
    src.block(1)  # the other blocks read as before
    with pytest.raises(stoker.ManifestError, match="index does not belong") as info:
        src.block(2)
    assert "block 2" in str(info.value)
    with pytest.raises(stoker.ManifestError, match="index does not belong"):
        src.decode(2, src.record(2), 5)  # a head of it too


@pytest.mark.parametrize(
    "lead",
    ["outside", "bit 31 alone", "start without starts"],
)
def test_a_first_token_that_cannot_be_is_refused_where_it_is_read(
    dataset: Written, lead: str
) -> None:
    from stoker.manifest import LEAD_DOC_START, encode_lead

    index = np.frombuffer((dataset.path / dataset.manifest.index.path).read_bytes(), INDEX_DTYPE)
    block = 3
    if lead == "start without starts":
        empty = np.flatnonzero(index["doc_starts"] == 0)
        if not len(empty):
            pytest.skip("every block of this dataset holds a document start")
        block = int(empty[0])
    value = {
        "outside": encode_lead(dataset.manifest.vocab_size + 7, False),
        "bit 31 alone": LEAD_DOC_START,
        "start without starts": encode_lead(1, True),
    }[lead]
    _forge_lead(dataset, block, value)
    src = TokenSource(str(dataset.path))
    with pytest.raises(stoker.ManifestError, match="cannot be") as info:
        src.leads()
    assert f"block {block}" in str(info.value)
    assert dataset.manifest.block_file(block).path in str(info.value)


def test_first_tokens_of_an_unchecked_index_are_not_taken_on_trust(dataset: Written) -> None:
    """Without the index's checksum in the manifest a reader does not fill samples from
    its recorded first tokens (a forged one would reach training before a decode of its
    block could refuse it): it reads the blocks, whose decode refuses the forgery."""
    from stoker.loader.samples import SampleReader
    from stoker.manifest import encode_lead

    src = TokenSource(str(dataset.path))
    toks, _ = src.block(2)
    _forge_lead(dataset, 2, encode_lead((int(toks[0]) + 1) % dataset.manifest.vocab_size, False))
    src = TokenSource(str(dataset.path))
    reader = SampleReader(src, SEQ_LEN, True, 64)
    try:
        assert reader.leads == 0 and not reader._lead_len.any()
    finally:
        reader.close()


def test_manifest_json_roundtrip_keeps_the_checksum(dataset: Written) -> None:
    m = TokenSource(str(dataset.path)).manifest
    again = stoker.Manifest.from_json(m.to_json())
    assert again == m
    assert json.loads(m.to_json())["decode_xxh64"] == m.decode_digest()


@pytest.mark.parametrize("frame", ["tokens", "document starts"])
def test_a_frame_claiming_more_than_its_block_is_refused_before_it_is_allocated(
    dataset: Written, frame: str
) -> None:
    """A forged record whose zstd header claims 256 MiB (an 8 KiB frame of zeros) is a
    ManifestError naming the block, not 256 MiB allocated (or a MemoryError)."""
    import xxhash
    import zstandard

    block = 2
    index_path = dataset.path / dataset.manifest.index.path
    index = np.frombuffer(index_path.read_bytes(), INDEX_DTYPE).copy()
    path, start, stop = dataset.record_span(block)
    file = dataset.path / path
    data = file.read_bytes()
    tokens_frame = data[start : start + int(index[block]["token_bytes"])]
    bounds_frame = data[start + int(index[block]["token_bytes"]) : stop]
    bomb = zstandard.ZstdCompressor(level=1).compress(bytes(256 << 20))
    assert len(bomb) < 64 << 10
    if frame == "tokens":
        tokens_frame = bomb
    else:
        bounds_frame = bomb
    record = tokens_frame + bounds_frame
    file.write_bytes(data + record)  # appended: the other blocks' records stay valid
    index[block]["offset"] = len(data)
    index[block]["token_bytes"] = len(tokens_frame)
    index[block]["bounds_bytes"] = len(bounds_frame)
    index[block]["xxh64"] = xxhash.xxh64_intdigest(record)
    index_path.write_bytes(index.tobytes())
    raw = dataset.manifest_dict()
    raw.pop("decode_xxh64")
    raw["index"]["xxh64"] = None
    raw["files"][block // dataset.manifest.blocks_per_file]["bytes"] = len(data) + len(record)
    dataset.write_manifest(raw)
    src = TokenSource(str(dataset.path))
    with pytest.raises(stoker.ManifestError, match="claims 268435456 bytes") as info:
        src.block(block)
    assert f"block {block}" in str(info.value)
