"""The records manifest and block index (stoker.record_manifest): a round trip, and every
malformed field refused by name."""

from __future__ import annotations

import base64
import json
from dataclasses import replace

import numpy as np
import pytest

from stoker.errors import ManifestError, UnsupportedFormatError
from stoker.manifest import FileRef, Manifest
from stoker.record_manifest import (
    RECORD_INDEX_DTYPE,
    Column,
    RecordManifest,
    first_rows,
    parse_record_index,
)


def manifest(blocks: int = 3, per_file: int = 2, rows: int = 10) -> RecordManifest:
    files = tuple(FileRef(f"data/abc-{i:05d}.arrow", 1000) for i in range(-(-blocks // per_file)))
    return RecordManifest(
        dataset_id="abc",
        schema=base64.b64encode(b"schema bytes").decode(),
        columns=(Column("image", "binary"), Column("label", "int64", False)),
        num_rows=rows,
        num_blocks=blocks,
        blocks_per_file=per_file,
        files=files,
        index=FileRef("index-abc.bin", blocks * RECORD_INDEX_DTYPE.itemsize),
        statistics={"label": {"nulls": 0, "min": 0, "max": 9}},
    ).sealed()


def index(entries: list[tuple[int, int, int, int]]) -> bytes:
    return np.array(entries, dtype=RECORD_INDEX_DTYPE).tobytes()


def test_a_manifest_round_trips_through_json() -> None:
    m = manifest()
    again = RecordManifest.from_json(m.to_json())
    assert again == m
    assert again.column("label") == Column("label", "int64", False)
    assert again.block_file(2).path == "data/abc-00001.arrow"
    with pytest.raises(KeyError, match="no column 'x'"):
        again.column("x")


def edited(**fields: object) -> str:
    raw = json.loads(manifest().to_json())
    raw.update(fields)
    return json.dumps(raw)


@pytest.mark.parametrize(
    ("fields", "match"),
    [
        ({"format": "stoker-tokens"}, "field 'format'"),
        ({"kind": "tokens"}, "field 'kind'"),
        ({"schema": "not base64!"}, "field 'schema'"),
        ({"compression": "snappy"}, "field 'compression'"),
        ({"num_rows": 0}, "field 'num_rows'"),
        ({"num_blocks": 11}, "field 'num_blocks'"),
        ({"columns": []}, "lists no column"),
        ({"columns": [{"name": "a", "type": "int64"}, {"name": "a", "type": "int64"}]}, "twice"),
        ({"files": []}, "data files listed"),
        ({"statistics": {"nope": {}}}, "unknown columns"),
        ({"dataset_id": "../x"}, "field 'dataset_id'"),
    ],
)
def test_a_malformed_field_is_refused_by_name(fields: dict, match: str) -> None:
    with pytest.raises(ManifestError, match=match):
        RecordManifest.from_json(edited(**fields), "m.json")


def test_an_edit_to_how_the_data_is_read_is_caught_by_the_decode_digest() -> None:
    raw = json.loads(manifest().to_json())
    raw["columns"][1]["type"] = "int32"
    with pytest.raises(ManifestError, match="decode_xxh64"):
        RecordManifest.from_json(json.dumps(raw))
    raw = json.loads(manifest().to_json())
    raw["statistics"]["label"]["max"] = 99  # informational: not covered
    assert RecordManifest.from_json(json.dumps(raw)).statistics["label"]["max"] == 99


def test_another_version_is_unsupported_and_a_token_manifest_says_what_it_is() -> None:
    with pytest.raises(UnsupportedFormatError, match="format_version 2"):
        RecordManifest.from_json(edited(format_version=2))
    with pytest.raises(ManifestError, match=r"records dataset.*RecordSource"):
        Manifest.from_json(manifest().to_json())


def test_the_index_is_checked_against_the_manifest() -> None:
    m = manifest(blocks=3, per_file=2, rows=10)
    good = index([(0, 400, 4, 1), (400, 600, 3, 2), (0, 1000, 3, 3)])
    parsed = parse_record_index(good, m, "ix")
    assert first_rows(parsed).tolist() == [0, 4, 7, 10]
    bad = {
        "outside its file": [(0, 400, 4, 1), (400, 601, 3, 2), (0, 1000, 3, 3)],
        "no rows": [(0, 400, 0, 1), (400, 600, 7, 2), (0, 1000, 3, 3)],
        "empty": [(0, 0, 4, 1), (400, 600, 3, 2), (0, 1000, 3, 3)],
    }
    for what, entries in bad.items():
        with pytest.raises(ManifestError, match="entry of block"):
            parse_record_index(index(entries), m, what)
    with pytest.raises(ManifestError, match="hold 11 rows"):
        parse_record_index(index([(0, 400, 4, 1), (400, 600, 4, 2), (0, 1000, 3, 3)]), m, "ix")
    with pytest.raises(ManifestError, match="bytes, expected"):
        parse_record_index(good[:-1], m, "ix")
    with pytest.raises(ManifestError, match=r"index index-abc\.bin has"):
        replace(m, index=FileRef("index-abc.bin", 10)).validate()


def test_a_forged_row_count_cannot_wrap_the_running_total() -> None:
    """A block claiming 2^64 - 4 rows beside two honest ones adds up to num_rows modulo
    2^64: refused, not read as rows in the wrong blocks."""
    m = manifest(blocks=3, per_file=2, rows=4)
    forged = index([(0, 400, (1 << 64) - 4, 1), (400, 600, 4, 2), (0, 1000, 4, 3)])
    with pytest.raises(ManifestError, match="entry of block 0"):
        parse_record_index(forged, m, "ix")


@pytest.mark.parametrize(
    "stats",
    [{"label": "x"}, {"label": {"min": 1}}, {"label": {"nulls": "many"}},
     {"image": {"bytes": "lots"}}, {"label": {"min": "a", "max": 1}}, {"label": {"nulls": -1}}],
)  # fmt: skip
def test_malformed_statistics_are_refused_by_name(stats: dict) -> None:
    with pytest.raises(ManifestError, match="statistics of"):
        RecordManifest.from_json(edited(statistics=stats))
