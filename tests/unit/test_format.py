"""Writing token datasets and reading them back (stoker.write_tokens, TokenSource, Manifest)."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
import xxhash
from hypothesis import given, settings
from hypothesis import strategies as st

import stoker
from stoker.manifest import INDEX_DTYPE, Compression, FileRef, Manifest, TokenizerInfo

from ._datasets import SmallDataset, make_docs


def files_under(root: str | Path) -> list[str]:
    """Every plain file below ``root`` (relative paths)."""
    out = []
    for dirpath, _dirs, names in os.walk(root):
        for name in names:
            out.append(os.path.relpath(os.path.join(dirpath, name), root))
    return sorted(out)


def read_all(url: str) -> np.ndarray:
    src = stoker.TokenSource(url)
    return src.tokens(0, src.manifest.num_tokens)


def decoded_doc_starts(url: str) -> np.ndarray:
    src = stoker.TokenSource(url)
    m = src.manifest
    parts = []
    for b in range(m.num_blocks):
        toks, starts = src.block(b)
        assert len(toks) == m.block_len(b)
        parts.append(b * m.block_tokens + starts.astype(np.int64))
    return np.concatenate(parts)


# -- round trips ------------------------------------------------------------------------


@pytest.mark.parametrize(("block_tokens", "max_len"), [(1, 20), (7, 100), (256, 200), (4096, 200)])
def test_round_trip_with_eos(
    write_small: Callable[..., SmallDataset], block_tokens: int, max_len: int
) -> None:
    ds = write_small(block_tokens=block_tokens, num_docs=40, max_len=max_len)
    m = ds.manifest
    expected = ds.stream
    assert m.num_tokens == len(expected)
    assert m.num_documents == len(ds.docs)  # with EOS even an empty document is one token
    assert m.num_blocks == -(-len(expected) // block_tokens)
    got = read_all(ds.url)
    assert got.dtype == np.uint16
    assert np.array_equal(got.astype(np.int64), expected)
    assert np.array_equal(decoded_doc_starts(ds.url), ds.doc_offsets)
    assert m.eos_id == 0


def test_round_trip_without_eos(write_small: Callable[..., SmallDataset]) -> None:
    ds = write_small(eos_id=None, num_docs=60, max_len=100)
    assert np.array_equal(read_all(ds.url).astype(np.int64), ds.stream)
    # no EOS: empty documents add nothing and start nothing
    assert np.array_equal(decoded_doc_starts(ds.url), ds.doc_offsets)
    assert ds.manifest.num_documents == sum(1 for d in ds.docs if len(d))


def test_append_eos_false_keeps_the_eos_id_in_the_manifest(
    write_small: Callable[..., SmallDataset],
) -> None:
    docs = make_docs(3, 20, 50, 100)
    ds = write_small(docs=docs, vocab_size=100, eos_id=0, append_eos=False)
    assert ds.manifest.eos_id == 0
    assert np.array_equal(read_all(ds.url).astype(np.int64), np.concatenate(docs))


@settings(deadline=None, max_examples=25)
@given(
    docs=st.lists(
        st.lists(st.integers(min_value=0, max_value=49), max_size=40), min_size=1, max_size=15
    ),
    block_tokens=st.integers(min_value=1, max_value=64),
    eos=st.sampled_from([None, 49]),
)
def test_round_trip_any_documents(
    tmp_path_factory: pytest.TempPathFactory,
    docs: list[list[int]],
    block_tokens: int,
    eos: int | None,
) -> None:
    stream = [t for d in docs for t in ([*d, eos] if eos is not None else d)]
    if not stream:
        return  # nothing to write (covered by test_all_empty_input_is_rejected)
    url = str(tmp_path_factory.mktemp("hyp") / "ds")
    m = stoker.write_tokens(
        [np.asarray(d, dtype=np.int64) for d in docs],
        url,
        vocab_size=50,
        eos_id=eos,
        block_tokens=block_tokens,
    )
    assert m.num_tokens == len(stream)
    assert read_all(url).tolist() == stream
    # any sub-range reads the same as slicing the stream
    src = stoker.TokenSource(url)
    lo, hi = len(stream) // 3, len(stream) - len(stream) // 4
    assert src.tokens(lo, hi).tolist() == stream[lo:hi]
    offsets, pos = [], 0
    for d in docs:
        n = len(d) + (eos is not None)
        if n:
            offsets.append(pos)
        pos += n
    assert decoded_doc_starts(url).tolist() == offsets


def test_all_empty_input_is_rejected(tmp_path: Path) -> None:
    url = str(tmp_path / "ds")
    with pytest.raises(stoker.InputError, match="no tokens"):
        stoker.write_tokens([[], []], url, vocab_size=10)
    assert not os.path.exists(os.path.join(url, "manifest.json"))


@pytest.mark.parametrize(
    ("vocab_size", "dtype"),
    [(2, "uint16"), (65535, "uint16"), (65536, "uint16"), (65537, "uint32"), (200_000, "uint32")],
)
def test_dtype_follows_vocab_size(tmp_path: Path, vocab_size: int, dtype: str) -> None:
    top = vocab_size - 1
    docs = [
        np.array([0, top, 1 % vocab_size, top], dtype=np.int64),
        np.array([top] * 5, dtype=np.int64),
    ]
    url = str(tmp_path / "ds")
    m = stoker.write_tokens(docs, url, vocab_size=vocab_size, block_tokens=3)
    assert m.dtype == dtype
    got = read_all(url)
    assert got.dtype == np.dtype(dtype)
    assert got.astype(np.int64).tolist() == np.concatenate(docs).tolist()


def test_dictionary_round_trip(write_small: Callable[..., SmallDataset]) -> None:
    # enough blocks of repetitive data that zstd can train a dictionary
    ds = write_small(seed=5, num_docs=150, max_len=3000, block_tokens=4096, dictionary=True)
    comp = ds.manifest.compression
    assert comp.dictionary is not None
    path = Path(ds.url) / comp.dictionary.path
    data = path.read_bytes()
    assert comp.dictionary.bytes == len(data)
    assert comp.dictionary.xxh64 == f"{xxhash.xxh64(data).intdigest():016x}"
    assert np.array_equal(read_all(ds.url).astype(np.int64), ds.stream)
    assert np.array_equal(decoded_doc_starts(ds.url), ds.doc_offsets)
    reread = json.loads((Path(ds.url) / "manifest.json").read_text())
    assert reread["compression"]["dictionary"]["path"] == comp.dictionary.path


def test_dictionary_with_too_little_data_still_round_trips(
    write_small: Callable[..., SmallDataset],
) -> None:
    ds = write_small(num_docs=3, max_len=20, dictionary=True)
    assert np.array_equal(read_all(ds.url).astype(np.int64), ds.stream)


def test_byte_shuffle_round_trip(write_small: Callable[..., SmallDataset]) -> None:
    ds = write_small(vocab_size=100_000, num_docs=50, max_len=500, shuffle=True, level=5)
    comp = ds.manifest.compression
    assert comp.shuffle is True
    assert comp.level == 5
    assert ds.manifest.dtype == "uint32"
    assert (
        json.loads((Path(ds.url) / "manifest.json").read_text())["compression"]["shuffle"] is True
    )
    assert np.array_equal(read_all(ds.url).astype(np.int64), ds.stream)
    assert np.array_equal(decoded_doc_starts(ds.url), ds.doc_offsets)
    plain = write_small("plain", vocab_size=100_000, num_docs=50, max_len=500)
    assert plain.manifest.compression.shuffle is False


# -- manifest and index -----------------------------------------------------------------


def test_manifest_json_round_trip_of_a_written_dataset(
    write_small: Callable[..., SmallDataset],
) -> None:
    ds = write_small(
        tokenizer=TokenizerInfo(name="tok.json", sha256="ab" * 32, eos_token="</s>"),
        tokenizer_json=b'{"model": {}}',
    )
    m = ds.manifest
    assert Manifest.from_json(m.to_json()) == m
    on_disk = Manifest.from_json((Path(ds.url) / "manifest.json").read_bytes())
    assert on_disk == m
    assert stoker.TokenSource(ds.url).manifest == m
    assert m.tokenizer is not None and m.tokenizer.path is not None
    assert (Path(ds.url) / m.tokenizer.path).read_bytes() == b'{"model": {}}'


@st.composite
def manifests(draw: st.DrawFn) -> Manifest:
    dtype = draw(st.sampled_from(["uint16", "uint32"]))
    vocab = draw(st.integers(min_value=1, max_value=65536 if dtype == "uint16" else 2**32))
    num_tokens = draw(st.integers(min_value=1, max_value=10**12))
    block_tokens = draw(st.integers(min_value=1, max_value=1 << 20))
    blocks_per_file = draw(st.integers(min_value=1, max_value=5000))
    # at most 4 files of at most 2^32 blocks each (the manifest's own limit)
    num_tokens = min(num_tokens, block_tokens * 4 * (1 << 32))
    num_blocks = -(-num_tokens // block_tokens)
    nfiles = -(-num_blocks // blocks_per_file)
    if nfiles > 4:
        blocks_per_file = -(-num_blocks // 4)
        nfiles = -(-num_blocks // blocks_per_file)
    name = st.text(alphabet="abcdef0123456789", min_size=1, max_size=16)
    hexes = st.none() | st.text(alphabet="0123456789abcdef", min_size=16, max_size=16)
    sizes = draw(st.lists(st.integers(0, 2**40), min_size=nfiles, max_size=nfiles))
    files = tuple(FileRef(f"data/{i:05d}.bin", n, draw(hexes)) for i, n in enumerate(sizes))
    dictionary = draw(
        st.none() | st.builds(FileRef, st.just("dict.zstd"), st.integers(0, 10**6), hexes)
    )
    tok = draw(
        st.none()
        | st.builds(
            TokenizerInfo,
            name=name,
            sha256=name,
            eos_token=st.none() | st.text(max_size=8),
            path=st.none() | st.just("tokenizer.json"),
        )
    )
    return Manifest(
        dataset_id=draw(name),
        dtype=dtype,
        vocab_size=vocab,
        eos_id=draw(st.none() | st.integers(0, vocab - 1)),
        num_tokens=num_tokens,
        num_documents=draw(st.integers(0, num_tokens)),
        block_tokens=block_tokens,
        blocks_per_file=blocks_per_file,
        files=files,
        index=FileRef("index.bin", num_blocks * INDEX_DTYPE.itemsize, draw(hexes)),
        compression=Compression("zstd", draw(st.integers(-5, 22)), draw(st.booleans()), dictionary),
        tokenizer=tok,
        compressed_bytes=draw(st.integers(0, 2**50)),
        created=draw(st.text(max_size=30)),
        writer=draw(st.text(max_size=30)),
    )


@settings(deadline=None, max_examples=40)
@given(m=manifests())
def test_manifest_json_round_trip(m: Manifest) -> None:
    m.validate()
    text = m.to_json()
    assert Manifest.from_json(text) == m
    assert Manifest.from_json(text.encode()) == m


def test_block_checksums_are_in_the_index(write_small: Callable[..., SmallDataset]) -> None:
    ds = write_small(num_docs=80, max_len=400, block_tokens=512)
    m = ds.manifest
    root = Path(ds.url)
    index_bytes = (root / m.index.path).read_bytes()
    assert len(index_bytes) == m.num_blocks * INDEX_DTYPE.itemsize
    assert m.index.xxh64 == f"{xxhash.xxh64(index_bytes).intdigest():016x}"
    index = np.frombuffer(index_bytes, dtype=INDEX_DTYPE)
    offsets = ds.doc_offsets
    for b, entry in enumerate(index):
        ref = m.files[b // m.blocks_per_file]
        data = (root / ref.path).read_bytes()
        start = int(entry["offset"])
        stop = start + int(entry["token_bytes"]) + int(entry["bounds_bytes"])
        assert stop <= len(data)
        assert int(entry["xxh64"]) == xxhash.xxh64(data[start:stop]).intdigest()
        lo, hi = b * m.block_tokens, min((b + 1) * m.block_tokens, m.num_tokens)
        assert int(entry["doc_starts"]) == int(((offsets >= lo) & (offsets < hi)).sum())
    # the records of a file lie back to back and fill it
    for f, ref in enumerate(m.files):
        entries = index[f * m.blocks_per_file : (f + 1) * m.blocks_per_file]
        ends = entries["offset"] + entries["token_bytes"] + entries["bounds_bytes"]
        assert int(entries["offset"][0]) == 0
        assert np.array_equal(entries["offset"][1:], ends[:-1])
        assert int(ends[-1]) == ref.bytes == (root / ref.path).stat().st_size


def test_each_blocks_first_token_is_in_the_index(write_small: Callable[..., SmallDataset]) -> None:
    """The index records each block's first token and whether a document starts there
    (what a reader needs of a block for a sample that ends one token into it)."""
    from stoker.manifest import LEAD_DOC_START, decode_leads, encode_lead

    ds = write_small(num_docs=80, max_len=400, block_tokens=512)
    m = ds.manifest
    index = np.frombuffer((Path(ds.url) / m.index.path).read_bytes(), dtype=INDEX_DTYPE)
    stream, offsets = ds.stream, set(ds.doc_offsets.tolist())
    starts = np.arange(m.num_blocks) * m.block_tokens
    first, doc, recorded = decode_leads(index)
    assert recorded.all()
    np.testing.assert_array_equal(first, stream[starts])
    assert doc.tolist() == [int(s) in offsets for s in starts]
    assert 0 < doc.sum() < m.num_blocks  # both kinds of block are in this dataset
    # a token id too large for the field is not recorded (0), never wrapped
    assert encode_lead(LEAD_DOC_START - 2, True) == (LEAD_DOC_START - 1) | LEAD_DOC_START
    assert encode_lead(LEAD_DOC_START - 1, False) == 0


def test_a_corrupt_block_fails_its_checksum(write_small: Callable[..., SmallDataset]) -> None:
    ds = write_small(num_docs=30, max_len=300, block_tokens=512)
    m = ds.manifest
    src = stoker.TokenSource(ds.url)
    entry = src.index[1]
    path = Path(ds.url) / m.block_file(1).path
    data = bytearray(path.read_bytes())
    data[int(entry["offset"]) + 3] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.warns(UserWarning, match="checksum"), pytest.raises(stoker.ChecksumError) as err:
        stoker.TokenSource(ds.url).block(1)
    assert err.value.block == 1
    # other blocks still read
    assert np.array_equal(
        stoker.TokenSource(ds.url).block(0)[0].astype(np.int64), ds.stream[: m.block_tokens]
    )


# -- atomic writes ----------------------------------------------------------------------


class Boom(Exception):
    pass


def failing(
    docs: list[np.ndarray], after: int, root: str | Path, baseline: list[str] | None = None
) -> Iterator[np.ndarray]:
    """Yields ``after`` documents, then fails; by then new data files exist under ``root``."""
    yield from docs[:after]
    new = set(files_under(root)) - set(baseline or [])
    assert any(p.startswith("data") for p in new), "the test needs a partial write"
    raise Boom("documents failed mid-way")


def test_a_failed_write_leaves_nothing_behind(tmp_path: Path) -> None:
    url = tmp_path / "ds"
    docs = make_docs(1, 400, 400, 1000)
    with pytest.raises(Boom):
        # tiny blocks: many are compressed and written before the failure
        stoker.write_tokens(
            failing(docs, 300, url), str(url), vocab_size=1000, eos_id=0, block_tokens=64
        )
    assert files_under(tmp_path) == []
    with pytest.raises(stoker.ManifestError):
        stoker.TokenSource(str(url))


def test_a_failed_overwrite_keeps_the_old_dataset(write_small: Callable[..., SmallDataset]) -> None:
    old = write_small(seed=1, num_docs=50, max_len=300)
    before = files_under(old.url)
    new_docs = make_docs(2, 400, 400, 1000)
    with pytest.raises(Boom):
        stoker.write_tokens(
            failing(new_docs, 300, old.url, before),
            old.url,
            vocab_size=1000,
            eos_id=0,
            block_tokens=64,
            overwrite=True,
        )
    assert files_under(old.url) == before
    src = stoker.TokenSource(old.url)
    assert src.manifest == old.manifest
    assert np.array_equal(read_all(old.url).astype(np.int64), old.stream)


def test_a_bad_token_mid_way_also_leaves_nothing(write_small: Callable[..., SmallDataset]) -> None:
    old = write_small(seed=1, num_docs=50, max_len=300)
    before = files_under(old.url)
    docs = make_docs(2, 300, 400, 1000)
    docs.append(np.array([5, 1000]))
    with pytest.raises(stoker.InputError):
        stoker.write_tokens(
            docs, old.url, vocab_size=1000, eos_id=0, block_tokens=64, overwrite=True
        )
    assert files_under(old.url) == before
    assert np.array_equal(read_all(old.url).astype(np.int64), old.stream)


def test_overwrite_replaces_the_dataset_and_removes_its_files(
    write_small: Callable[..., SmallDataset],
) -> None:
    old = write_small(seed=1)
    old_files = set(files_under(old.url))
    new = write_small(seed=2, overwrite=True)  # same name: same URL
    assert new.url == old.url
    assert new.manifest.dataset_id != old.manifest.dataset_id
    assert np.array_equal(read_all(new.url).astype(np.int64), new.stream)
    left = set(files_under(new.url))
    named = {"manifest.json", new.manifest.index.path, *(f.path for f in new.manifest.files)}
    assert left == named
    assert not (old_files - {"manifest.json"}) & left


def test_writing_over_a_dataset_needs_overwrite(write_small: Callable[..., SmallDataset]) -> None:
    old = write_small(seed=1)
    before = files_under(old.url)
    with pytest.raises(stoker.InputError, match="overwrite"):
        stoker.write_tokens([[1, 2, 3]], old.url, vocab_size=1000)
    assert files_under(old.url) == before
    assert np.array_equal(read_all(old.url).astype(np.int64), old.stream)


# -- input errors -----------------------------------------------------------------------


@pytest.mark.parametrize("bad", [1000, 5000, -1])
def test_a_token_outside_the_vocabulary_names_its_document(tmp_path: Path, bad: int) -> None:
    docs = [np.array([1, 2, 3]), np.array([4, 5]), np.array([6, bad, 7]), np.array([8])]
    url = str(tmp_path / "ds")
    with pytest.raises(stoker.InputError, match=r"document 2\b") as err:
        stoker.write_tokens(docs, url, vocab_size=1000, eos_id=0)
    assert str(bad) in str(err.value)
    assert files_under(tmp_path) == []


def test_a_bad_token_after_empty_documents_names_the_right_document(tmp_path: Path) -> None:
    # without EOS, empty documents are dropped; the error must still name the
    # input's document index (3 here), not the count of documents kept so far
    docs = [
        np.array([1, 2]),
        np.array([], dtype=np.int64),
        np.array([], dtype=np.int64),
        np.array([9, 1000]),
    ]
    with pytest.raises(stoker.InputError, match=r"document 3\b"):
        stoker.write_tokens(docs, str(tmp_path / "ds"), vocab_size=1000, eos_id=None)


def test_bad_documents_are_rejected(tmp_path: Path) -> None:
    url = str(tmp_path / "ds")
    with pytest.raises(stoker.InputError, match="1-D"):
        stoker.write_tokens([np.zeros((2, 2), dtype=np.int64)], url, vocab_size=10)
    with pytest.raises(stoker.InputError, match="integers"):
        stoker.write_tokens([np.array([1.5, 2.0])], url, vocab_size=10)
    with pytest.raises(stoker.InputError, match="eos_id"):
        stoker.write_tokens([[1]], url, vocab_size=10, eos_id=10)
    assert files_under(tmp_path) == []
