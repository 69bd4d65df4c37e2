"""`stoker verify`: every block checked against its checksum and the manifest, each bad
one reported with its file and byte range (a real dataset, damaged on disk; and served
by nginx)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import stoker
from stoker.formats.verify import verify
from stoker.manifest import INDEX_DTYPE, encode_lead

from .helpers import Written, write_dataset


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Written:
    # 12 blocks in 3 files
    root = tmp_path_factory.mktemp("verify-root")
    return write_dataset(root / "ds", num_docs=40, seed=4, block_tokens=512, blocks_per_file=4)


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "stoker.cli", "verify", *args, "--quiet"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def flip(dataset: Written, block: int, at: int = 7) -> tuple[str, int, int]:
    """Flip one byte of ``block``'s record on disk; its (file, start, stop)."""
    path, start, stop = dataset.record_span(block)
    f = dataset.path / path
    data = bytearray(f.read_bytes())
    data[start + at] ^= 0xFF
    f.write_bytes(bytes(data))
    return path, start, stop


def test_a_good_dataset_verifies(dataset: Written) -> None:
    n = dataset.manifest.num_blocks
    assert n >= 8
    seen: list[tuple[int, int]] = []
    report = verify(str(dataset.path), progress=lambda b, nbytes: seen.append((b, nbytes)))
    assert report.ok and report.blocks == n and report.decoded
    spans = [dataset.record_span(b) for b in range(n)]
    assert report.bytes == sum(stop - start for _, start, stop in spans)
    assert [b for b, _ in seen] == list(range(1, n + 1)) and seen[-1][1] == report.bytes
    out = cli(str(dataset.path))
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"all {n} blocks good" in out.stdout


def test_every_damaged_block_is_named_with_its_file_and_byte_range(
    dataset: Written, tmp_path: Path
) -> None:
    bad = dataset.copy_to(tmp_path / "ds")
    hits = {b: flip(bad, b) for b in (1, 9)}  # in different files
    assert hits[1][0] != hits[9][0]
    report = verify(str(bad.path), workers=3)
    assert [b.block for b in report.bad] == [1, 9]
    assert report.blocks == bad.manifest.num_blocks  # the check went on past the first
    for b in report.bad:
        path, start, stop = hits[b.block]
        assert b.file.endswith(path) and b.byte_range == (start, stop)
        assert "checksum mismatch" in b.reason
    out = cli(str(bad.path))
    assert out.returncode == 1
    for block, (path, start, stop) in hits.items():
        assert f"block {block} (bytes [{start}, {stop}))" in out.stdout
        assert path in out.stdout
    assert f"2 of {bad.manifest.num_blocks} blocks bad" in out.stdout


def test_a_truncated_file_names_its_blocks(dataset: Written, tmp_path: Path) -> None:
    bad = dataset.copy_to(tmp_path / "ds")
    last = bad.manifest.num_blocks - 1
    path, start, _ = bad.record_span(last)
    f = bad.path / path
    f.write_bytes(f.read_bytes()[: start + 5])
    report = verify(str(bad.path))
    assert [b.block for b in report.bad] == [last]
    assert report.bad[0].file.endswith(path)


def test_a_record_that_does_not_match_its_index_is_caught_by_decoding(
    dataset: Written, tmp_path: Path
) -> None:
    # block 2's index entry records another first token: its checksum still holds, so
    # only decoding it shows that the index does not belong to the data
    bad = dataset.copy_to(tmp_path / "ds")
    index_path = bad.path / bad.manifest.index.path
    index = np.frombuffer(index_path.read_bytes(), INDEX_DTYPE).copy()
    lo, _ = bad.block_range(2)
    index[2]["lead"] = encode_lead((int(bad.stream[lo]) + 1) % bad.manifest.vocab_size, False)
    index_path.write_bytes(index.tobytes())
    raw = bad.manifest_dict()
    raw.pop("decode_xxh64", None)
    raw["index"]["xxh64"] = None
    bad.write_manifest(raw)
    assert verify(str(bad.path), decode=False).ok
    report = verify(str(bad.path))
    assert [b.block for b in report.bad] == [2] and "index" in report.bad[0].reason
    assert cli(str(bad.path), "--no-decode").returncode == 0
    assert cli(str(bad.path)).returncode == 1


def test_a_broken_manifest_is_a_typed_error_not_a_report(tmp_path: Path, dataset: Written) -> None:
    bad = dataset.copy_to(tmp_path / "ds")
    bad.write_manifest("{not json")
    with pytest.raises(stoker.ManifestError):
        verify(str(bad.path))
    out = cli(str(bad.path))
    assert out.returncode == 2 and "manifest" in out.stderr.lower()


def test_a_dataset_served_over_http_verifies_and_names_a_bad_block(
    serve_dir, dataset: Written, tmp_path: Path
) -> None:
    bad = dataset.copy_to(tmp_path / "ds")
    path, start, stop = flip(bad, 5)
    origin, url = serve_dir(bad.path)
    report = verify(url)
    assert [b.block for b in report.bad] == [5]
    assert report.bad[0].file == f"{url}/{path}" and report.bad[0].byte_range == (start, stop)
    # every block's record was read once, as the byte range the index gives
    reads = [r for r in origin.access_log() if "/data/" in r.path]
    want = sorted(
        (f"/data/{Path(p).name}", f"bytes={lo}-{hi - 1}")
        for p, lo, hi in (bad.record_span(b) for b in range(bad.manifest.num_blocks))
    )
    assert sorted((r.path[r.path.index("/data/") :], r.range) for r in reads) == want
