"""The sample-resident reader (stoker.loader.samples) and the head-only block decode it
uses, against the raw token stream."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import stoker
from stoker.errors import ChecksumError
from stoker.loader.samples import SampleReader
from stoker.plan import ShuffleConfig, SpreadOrder, spread_profile

from ._datasets import SmallDataset


def expected(ds: SmallDataset, ids: np.ndarray, seq_len: int) -> tuple[np.ndarray, np.ndarray]:
    stream = ds.stream
    flags = np.zeros(len(stream), dtype=bool)
    flags[ds.doc_offsets] = True
    rows = (ids * seq_len)[:, None] + np.arange(seq_len + 1)[None, :]
    return stream[rows], flags[rows]


def spread_ids(num_samples: int, unit: int, mean: int, epoch: int = 0) -> np.ndarray:
    config = ShuffleConfig(3, True, unit, 4, "spread", mean).resolve(1)
    return SpreadOrder(num_samples, config, epoch).samples(np.arange(num_samples))


def take_all(reader: SampleReader, ids: np.ndarray, batch: int) -> tuple[np.ndarray, np.ndarray]:
    toks, masks = [], []
    for i in range(0, len(ids), batch):
        t, m = reader.read(ids[i : i + batch])
        toks.append(t)
        masks.append(m)
    return np.concatenate(toks), np.concatenate(masks)


def read_epoch(
    source: stoker.TokenSource, ds: SmallDataset, seq_len: int, unit: int, mean: int, batch: int
) -> SampleReader:
    """A spread epoch read through a (closed) reader made for it, checked against the
    stream; the reader, for its counts."""
    n = (source.manifest.num_tokens - 1) // seq_len
    ids = spread_ids(n, unit, mean)
    D = len(spread_profile(unit, mean))
    reader = SampleReader(source, seq_len, True, (D + 1) * unit, ahead=unit, gap=2 * unit + 1)
    try:
        reader.plan(ids)
        toks, masks = take_all(reader, ids, batch)
    finally:
        reader.close()
    want_toks, want_masks = expected(ds, ids, seq_len)
    np.testing.assert_array_equal(toks, want_toks)
    np.testing.assert_array_equal(masks, want_masks)
    return reader


@pytest.fixture(scope="module")
def small(write_small_module: Callable[..., SmallDataset]) -> SmallDataset:
    return write_small_module("samples", num_docs=300, max_len=200)  # blocks of 256 tokens


@pytest.mark.parametrize(
    ("seq_len", "unit", "mean"),
    [
        (16, 16, 4),  # samples inside blocks, one block per unit
        (31, 5, 2),  # most units cross a block's end
        (100, 3, 3),  # a sample in two blocks every few
        (255, 1, 4),  # nearly every sample in two blocks
    ],
)
def test_every_sample_reads_as_the_stream_holds_it(
    small: SmallDataset, seq_len: int, unit: int, mean: int
) -> None:
    source = stoker.TokenSource(small.url)
    n = (source.manifest.num_tokens - 1) // seq_len
    reader = read_epoch(source, small, seq_len, unit, mean, 7)
    # each unit decodes each block it touches once, and the last of them only as far as
    # it needs: a unit of one block decodes that block, and a head of the next
    bt = source.manifest.block_tokens
    units = -(-n // unit)
    touched = (unit * seq_len + seq_len) // bt + 2
    full = reader.decoded - reader.heads
    assert reader.decoded <= units * touched
    assert full <= units * (touched - 1)
    if unit * seq_len == bt:
        assert full <= units + 1


@pytest.mark.parametrize(
    ("seq_len", "unit"),
    [
        (16, 16),  # a unit is a block's samples: its last ends one token into the next block
        (100, 3),  # samples end up to 97 tokens into the next block
    ],
)
def test_a_second_epoch_finds_every_blocks_first_tokens_kept(
    small: SmallDataset, seq_len: int, unit: int
) -> None:
    """A block's first tokens are kept from any decode of it: a sample that ends in a
    block read before is filled without reading or decoding that block again."""
    source = stoker.TokenSource(small.url)
    n = (source.manifest.num_tokens - 1) // seq_len
    mean = 3
    D = len(spread_profile(unit, mean))
    reader = SampleReader(source, seq_len, True, (D + 1) * unit, ahead=unit, gap=2 * unit + 1)
    try:
        first, second = spread_ids(n, unit, mean, 0), spread_ids(n, unit, mean, 1)
        reader.plan(first)
        got = [take_all(reader, first, 8)]
        heads, leads = reader.heads, reader.leads
        reader.plan(second)
        got.append(take_all(reader, second, 8))
    finally:
        reader.close()
    for ids, (toks, masks) in zip((first, second), got):
        want_toks, want_masks = expected(small, ids, seq_len)
        np.testing.assert_array_equal(toks, want_toks)
        np.testing.assert_array_equal(masks, want_masks)
    assert reader.leads > leads  # the second epoch's heads came from what was kept
    if unit * seq_len == source.manifest.block_tokens:
        # every job but a head's decodes a whole block (but the last block's, where the
        # dataset's last tokens make no sample): no head is decoded in the second epoch
        assert heads > 0
        tail = n * seq_len + 1 < source.manifest.num_tokens
        assert reader.heads - heads <= int(tail)


def without_leads(ds: SmallDataset, dest: Path) -> str:
    """A copy of ``ds`` as a writer before the index recorded first tokens left it."""
    import shutil

    import xxhash

    from stoker.manifest import INDEX_DTYPE, Manifest

    shutil.copytree(ds.url, dest)
    m = ds.manifest
    index = np.frombuffer((dest / m.index.path).read_bytes(), dtype=INDEX_DTYPE).copy()
    index["lead"] = 0
    data = index.tobytes()
    (dest / m.index.path).write_bytes(data)
    index_ref = replace(m.index, xxh64=f"{xxhash.xxh64(data).intdigest():016x}")
    old = Manifest.from_json((dest / "manifest.json").read_bytes())
    (dest / "manifest.json").write_text(replace(old, index=index_ref).sealed().to_json())
    return str(dest)


def test_first_tokens_in_the_index_spare_the_first_epochs_heads(
    small: SmallDataset, tmp_path: Path
) -> None:
    """Units of a block's samples: each unit's last sample ends one token into the next
    block. With that token in the block index no head is decoded; a dataset without it
    (an older writer's) decodes those heads and reads the same."""
    seq_len = 16
    counts = {}
    for name, url in (("new", small.url), ("old", without_leads(small, tmp_path / "old"))):
        reader = read_epoch(stoker.TokenSource(url), small, seq_len, 16, 3, 8)
        counts[name] = (reader.heads, reader.leads)
    m = small.manifest
    tail = (
        m.num_tokens - 1
    ) // seq_len * seq_len + 1 < m.num_tokens  # the last block: no sample ends it
    assert counts["new"][0] <= int(tail) < counts["old"][0]
    assert counts["new"][1] > 0


def test_a_plan_in_pieces_and_a_changed_plan_read_what_is_asked(small: SmallDataset) -> None:
    """Planned ahead piece by piece, then told another future (a lease cut short): every
    batch is the samples asked for, whatever was filled for the old plan."""
    source = stoker.TokenSource(small.url)
    seq_len = 20
    n = (source.manifest.num_tokens - 1) // seq_len
    ids = spread_ids(n, 12, 3)
    reader = SampleReader(source, seq_len, True, 12 * 20, ahead=24, gap=25)
    got: list[np.ndarray] = []
    try:
        reader.plan(ids[:300])
        for i in range(0, 200, 8):  # a consistent extension each 40 samples
            if i % 40 == 0:
                reader.plan(ids[i : i + 300])
            got.append(reader.read(ids[i : i + 8])[0])
        other = np.random.default_rng(0).permutation(n)[:150]
        reader.plan(np.concatenate([ids[200:208], other]))  # the rest changes
        got.append(reader.read(ids[200:208])[0])
        for i in range(0, 150, 10):
            got.append(reader.read(other[i : i + 10])[0])
        surprise = np.array([5, 3, 1])  # never planned: read anyway
        got.append(reader.read(surprise)[0])
    finally:
        reader.close()
    asked = np.concatenate([ids[:208], other, [5, 3, 1]])
    np.testing.assert_array_equal(np.concatenate(got), expected(small, asked, seq_len)[0])


def test_without_doc_starts_reads_tokens_only(small: SmallDataset) -> None:
    source = stoker.TokenSource(small.url)
    n = (source.manifest.num_tokens - 1) // 40
    ids = spread_ids(n, 6, 2)
    reader = SampleReader(source, 40, False, 60)
    try:
        reader.plan(ids)
        toks, mask = reader.read(ids[:9])
    finally:
        reader.close()
    assert mask is None
    np.testing.assert_array_equal(toks, expected(small, ids[:9], 40)[0])


def test_rows_held_stay_near_the_orders_bound(
    write_small: Callable[..., SmallDataset],
) -> None:
    """What the reader holds is the samples dealt out and not yet taken (plus the few
    filled ``ahead``): near the spread order's bound, far below the plan's length."""
    ds = write_small("big", num_docs=3000, max_len=400, block_tokens=1024)
    source = stoker.TokenSource(ds.url)
    seq_len, unit, mean = 32, 32, 4
    n = (source.manifest.num_tokens - 1) // seq_len
    ids = spread_ids(n, unit, mean)
    D = len(spread_profile(unit, mean))
    reader = SampleReader(source, seq_len, True, (D + 1) * unit, ahead=unit, gap=2 * unit + 1)
    held = 0
    try:
        reader.plan(ids)
        for i in range(0, n, 8):
            reader.read(ids[i : i + 8])
            held = max(held, len(reader._tok) - len(reader._free))
    finally:
        reader.close()
    bound = sum(d * c for d, c in enumerate(spread_profile(unit, mean))) + unit
    assert held <= bound + 3 * unit  # + ``ahead`` filled early, and samples in two blocks
    assert held < n // 4


def test_a_job_of_many_samples_hands_out_its_first_ones_before_the_rest_are_copied(
    small: SmallDataset,
) -> None:
    """A small source's block fills the samples of many epochs in one job: the first
    samples are read while the job still copies the others (its second piece held
    here until they were), and every row is the stream's."""
    source = stoker.TokenSource(small.url)
    seq_len = 16  # 16 samples a block of 256 tokens
    ids = np.tile(np.arange(15), 80)  # block 0's samples, 80 times: one job of 1,200
    reader = SampleReader(source, seq_len, True, 4096)
    first_read = threading.Event()
    seen: list[bool] = []
    calls: list[int] = []
    copy = reader._copy_rows

    def held(*args: Any) -> None:
        calls.append(len(args[0]))
        if len(calls) == 2:  # the job's second piece
            seen.append(first_read.wait(30))
        copy(*args)

    reader._copy_rows = held  # type: ignore[method-assign]
    try:
        reader.plan(ids)
        head = reader.read(ids[:8])
        first_read.set()
        rest = reader.read(ids[8:])
    finally:
        reader.close()
    assert calls[:2] == [128, 256]  # pieces of the one job
    assert seen == [True]  # the first read returned while the job was held
    toks = np.concatenate([head[0], rest[0]])
    np.testing.assert_array_equal(toks, expected(small, ids, seq_len)[0])


def test_a_corrupt_block_raises_its_checksum_error(
    write_small: Callable[..., SmallDataset], tmp_path: Path
) -> None:
    ds = write_small("bad", num_docs=200, max_len=200)
    source = stoker.TokenSource(ds.url)
    ref = source.manifest.block_file(3)
    entry = source.index[3]
    path = Path(ds.url) / ref.path
    data = bytearray(path.read_bytes())
    data[int(entry["offset"]) + 5] ^= 0xFF
    path.write_bytes(bytes(data))
    n = (source.manifest.num_tokens - 1) // 16
    ids = np.arange(n)  # in source order: block 3 is needed early
    reader = SampleReader(stoker.TokenSource(ds.url), 16, True, 64)
    try:
        reader.plan(ids)
        with pytest.raises(ChecksumError) as caught, pytest.warns(UserWarning, match="refetch"):
            take_all(reader, ids, 8)
        assert caught.value.block == 3
    finally:
        reader.close()


def test_close_with_jobs_in_flight_returns(small: SmallDataset) -> None:
    source = stoker.TokenSource(small.url)
    n = (source.manifest.num_tokens - 1) // 16
    reader = SampleReader(source, 16, True, 2000, ahead=2000)
    reader.plan(spread_ids(n, 16, 4))
    reader.close()  # nothing read: its jobs are cancelled or finish
    assert reader._inflight == 0 or all(f.done() for f in reader._futures)


def test_a_sample_longer_than_a_block_is_refused(small: SmallDataset) -> None:
    with pytest.raises(ValueError, match="longer than a block"):
        SampleReader(stoker.TokenSource(small.url), 256, True, 100)


# -- the head of a block ---------------------------------------------------------------------


@pytest.mark.parametrize("shuffle", [False, True])
def test_a_blocks_head_decodes_as_its_first_tokens(
    write_small: Callable[..., SmallDataset], shuffle: bool
) -> None:
    ds = write_small("heads", num_docs=200, max_len=300, block_tokens=4096, shuffle=shuffle)
    source = stoker.TokenSource(ds.url)
    for block in range(source.manifest.num_blocks):
        record = source.record(block)
        toks, starts = source.decode(block, record)
        for prefix in (1, 17, len(toks) // 2, len(toks)):
            head, head_starts = source.decode(block, record, prefix)
            np.testing.assert_array_equal(head, toks[:prefix])
            np.testing.assert_array_equal(head_starts, starts)


class SlowRecords(stoker.TokenSource):
    """A source whose reads take a while, so that jobs are in flight when plans change."""

    def record(self, block: int) -> bytes:
        import time

        time.sleep(0.005)
        return super().record(block)


def test_a_read_past_its_plan_while_jobs_run_reads_what_is_asked(small: SmallDataset) -> None:
    """An unplanned read that extends the plan past the slab, jobs of the old plan still
    in flight: every row is the stream's (the old cut must not start against the new)."""
    source = SlowRecords(small.url)
    seq_len = 32
    ids = np.arange((source.manifest.num_tokens - 1) // seq_len)[:400]
    reader = SampleReader(source, seq_len, True, 8, ahead=1000, gap=9)
    try:
        reader.plan(ids[:100])
        first = reader.read(ids[:32])
        rest = reader.read(ids[32:300])  # the plan's remainder and more
    finally:
        reader.close()
    toks = np.concatenate([first[0], rest[0]])
    masks = np.concatenate([first[1], rest[1]])
    want = expected(small, ids[:300], seq_len)
    np.testing.assert_array_equal(toks, want[0])
    np.testing.assert_array_equal(masks, want[1])


def test_ids_outside_the_dataset_are_refused_and_the_reader_goes_on(small: SmallDataset) -> None:
    source = stoker.TokenSource(small.url)
    n = (source.manifest.num_tokens - 1) // 16
    reader = SampleReader(source, 16, True, 64)
    try:
        for bad in ([n], [-1], [3, n + 5]):
            with pytest.raises(IndexError, match="outside"):
                reader.read(np.array(bad))
        np.testing.assert_array_equal(
            reader.read(np.array([4, 2]))[0], expected(small, np.array([4, 2]), 16)[0]
        )
    finally:
        reader.close()


def test_a_closed_reader_refuses_to_read(small: SmallDataset) -> None:
    source = SlowRecords(small.url)
    n = (source.manifest.num_tokens - 1) // 16
    ids = spread_ids(n, 16, 4)
    reader = SampleReader(source, 16, True, 2000, ahead=2000)
    reader.plan(ids)
    reader.close()
    with pytest.raises(RuntimeError, match="closed"):
        reader.read(ids[:8])


def test_a_head_of_a_block_of_the_wrong_length_is_refused() -> None:
    """Decoding only a block's head checks the block's length as decoding all of it does."""
    from stoker.formats.codec import BlockCodec

    codec = BlockCodec(np.dtype("<u2"), 3)
    frames = codec.encode(np.arange(100, dtype=np.uint16), np.array([0, 40]))
    record = frames[0] + frames[1]
    with pytest.raises(ValueError, match="expected 120 tokens"):
        codec.decode(record, len(frames[0]), 120, 2)
    with pytest.raises(ValueError, match="expected 120 tokens"):
        codec.decode_prefix(record, len(frames[0]), 120, 50, 2)
    head, starts = codec.decode_prefix(record, len(frames[0]), 100, 50, 2)
    assert head.tolist() == list(range(50)) and starts.tolist() == [0, 40]


class _PlanRecorder:
    """An agent that answers nothing (the reader reads its blocks itself) and records
    the plans it is told."""

    def __init__(self) -> None:
        self.plans: list[list[int]] = []

    def open(self, url: str, options: object, dataset_id: str) -> None:
        pass

    def plan(self, dataset_id: str, blocks: list[int]) -> None:
        self.plans.append(list(blocks))

    def get(self, dataset_id: str, block: int) -> object:
        from types import SimpleNamespace

        return SimpleNamespace(pinned=False, record=b"")

    def release(self, dataset_id: str, blocks: list[int]) -> None:
        pass

    def flush_releases(self) -> None:
        pass


def test_the_agent_is_not_asked_for_a_block_whose_first_tokens_are_kept(
    small: SmallDataset,
) -> None:
    """Sample 15 (seq_len 16, blocks of 256 tokens) ends one token into block 1, which
    the block index records: the agent is told block 0 only, and the sample is right."""
    source = stoker.TokenSource(small.url)
    assert source.manifest.block_tokens == 256
    agent = _PlanRecorder()
    reader = SampleReader(source, 16, True, 64, agent=agent)  # type: ignore[arg-type]
    try:
        ids = np.array([15, 40], dtype=np.int64)  # 40: tokens 640..656 of block 2
        reader.plan(ids)
        toks, masks = take_all(reader, ids, 2)
    finally:
        reader.close()
    assert agent.plans == [[0, 2]]
    assert reader.leads == 1
    want_toks, want_masks = expected(small, ids, 16)
    np.testing.assert_array_equal(toks, want_toks)
    np.testing.assert_array_equal(masks, want_masks)


def test_readers_decode_one_block_at_a_time_when_their_processes_fill_the_cores(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from stoker.loader import arena

    monkeypatch.setattr(arena.os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})
    monkeypatch.setattr(arena, "_readers", 1)
    assert arena.decoding_threads() == 2  # one reader: two decoding threads
    arena.reader_processes(2)  # what a pool of two workers tells each of them
    assert arena.decoding_threads() == 2  # 4 threads on 4 cores
    arena.reader_processes(3)
    assert arena.decoding_threads() == 1  # 6 would be more than the cores
