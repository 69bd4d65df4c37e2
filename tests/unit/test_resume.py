"""The resume contract of stoker.TokenDataset (in-process iteration, no DataLoader).

A state saved at any point restores into a new TokenDataset that continues the
sample stream exactly; with another world size, nothing is lost or repeated.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
import torch

import stoker
from stoker import intervals

from ._datasets import SmallDataset

SEQ = 16
S = 623  # samples: S % 4 == 3, S % 3 == 2, S % 2 == 1, S % 5 == 3 (every split leaves some over)
NUM_TOKENS = S * SEQ + 1 + 5
EPOCHS = 3
CONFIG: dict[str, Any] = {"seed": 7, "shard_size": 8, "window_shards": 4}


def docs_of_exactly(num_tokens: int, seed: int) -> list[np.ndarray]:
    """Random documents that make exactly ``num_tokens`` tokens with one EOS each."""
    rng = np.random.default_rng(seed)
    docs, total = [], 0
    while total < num_tokens:
        n = min(int(rng.integers(0, 120)), num_tokens - total - 1)
        docs.append(rng.integers(1, 1000, size=n))
        total += n + 1
    return docs


@pytest.fixture(scope="module")
def data(write_small_module: Callable[..., SmallDataset]) -> SmallDataset:
    ds = write_small_module("resume", docs=docs_of_exactly(NUM_TOKENS, 11), block_tokens=256)
    assert ds.manifest.num_tokens == NUM_TOKENS
    return ds


def make(data: SmallDataset, **kwargs: Any) -> stoker.TokenDataset:
    return stoker.TokenDataset(data.url, kwargs.pop("seq_len", SEQ), **{**CONFIG, **kwargs})


def epoch_ids(ds: stoker.TokenDataset) -> list[int]:
    """One training epoch: one pass of a for loop."""
    return [int(item["sample_id"]) for item in ds]


def run_to(ds: stoker.TokenDataset, total: int, max_epochs: int = 20) -> list[int]:
    """Iterate whole epochs until ``total`` samples came."""
    out: list[int] = []
    for _ in range(max_epochs):
        if len(out) >= total:
            break
        out.extend(epoch_ids(ds))
    return out


def take(ds: stoker.TokenDataset, n: int) -> tuple[list[int], dict[str, Any], Iterator[Any] | None]:
    """Consume ``n`` samples (whole epochs, then part of one) and save the state right then.

    The iterator of the epoch in progress is returned, still alive, so the state is
    taken as a training loop would: right after receiving the ``n``-th item.
    """
    got: list[int] = []
    if n == 0:
        return got, ds.state_dict(), None
    for _ in range(20):
        it = iter(ds)
        for item in it:
            got.append(int(item["sample_id"]))
            if len(got) == n:
                return got, ds.state_dict(), it
    raise AssertionError("dataset ran dry")


@pytest.fixture(scope="module", params=[1, 3], ids=["world1", "world3"])
def reference(request: pytest.FixtureRequest, data: SmallDataset) -> tuple[int, list[list[int]]]:
    """An uninterrupted run of EPOCHS epochs on the last rank of the world."""
    world = request.param
    ds = make(data, rank=world - 1, world_size=world)
    epochs = [epoch_ids(ds) for _ in range(EPOCHS)]
    assert ds.epoch == EPOCHS
    return world, epochs


def resume_and_compare(
    data: SmallDataset,
    world: int,
    ref: list[list[int]],
    state: dict[str, Any],
    done: int,
    via_json: bool = True,
) -> stoker.TokenDataset:
    flat = [s for e in ref for s in e]
    ds = make(data, rank=world - 1, world_size=world)
    # a state survives JSON (as checkpoints store it)
    ds.load_state_dict(json.loads(json.dumps(state)) if via_json else state)
    rest = run_to(ds, len(flat) - done)
    assert rest == flat[done:]
    assert ds.epoch == EPOCHS
    return ds


# -- the reference itself ----------------------------------------------------------------


def test_reference_epochs_are_what_the_split_promises(
    reference: tuple[int, list[list[int]]],
) -> None:
    world, ref = reference
    # with carry-over, epoch t hands out (leftover of t-1 + S) // world per rank
    left = 0
    for ids in ref:
        assert len(ids) == (left + S) // world
        left = (left + S) % world
        assert all(0 <= i < S for i in ids)
    if world == 1:
        for ids in ref:
            assert sorted(ids) == list(range(S))
        assert ref[0] != ref[1]  # each epoch is shuffled anew


def test_items_hold_the_right_tokens_and_document_starts(data: SmallDataset) -> None:
    stream = data.stream
    starts = np.zeros(len(stream), dtype=bool)
    starts[data.doc_offsets] = True
    ds = make(data)
    n = 0
    for item in ds:
        sid = item["sample_id"]
        lo = sid * SEQ
        assert item["tokens"].dtype == torch.int64
        assert item["tokens"].numpy().tolist() == stream[lo : lo + SEQ + 1].tolist()
        assert item["doc_start_mask"].numpy().tolist() == starts[lo : lo + SEQ + 1].tolist()
        n += 1
    assert n == S


# -- exact resume ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "where",
    [
        "start",
        "mid_epoch",
        "end_of_epoch",
        "after_epoch",
        "mid_second_epoch",
        "end_of_second_epoch",
    ],
)
def test_resume_continues_the_stream_exactly(
    data: SmallDataset, reference: tuple[int, list[list[int]]], where: str
) -> None:
    world, ref = reference
    n0, n1 = len(ref[0]), len(ref[1])
    done = {
        "start": 0,
        "mid_epoch": 100,
        "end_of_epoch": n0,
        "after_epoch": n0,
        "mid_second_epoch": n0 + 57,
        "end_of_second_epoch": n0 + n1,
    }[where]
    ds = make(data, rank=world - 1, world_size=world)
    if where == "after_epoch":
        got = epoch_ids(ds)  # the for loop ran out: the epoch is over
        state = ds.state_dict()
        assert state["epoch"] == 1 and state["consumed"] == 0
    else:
        got, state, _alive = take(ds, done)
    assert got == [s for e in ref for s in e][:done]
    if where == "end_of_epoch":
        # taken right after the last item, before the iterator was exhausted
        assert state["epoch"] == 0 and state["consumed"] == n0
    resume_and_compare(data, world, ref, state, done)


@pytest.mark.parametrize("set_epoch", [False, True], ids=["for_loops", "set_epoch"])
@pytest.mark.parametrize(
    "where",
    [
        "mid_epoch",
        "end_of_epoch",
        "after_epoch",
        "mid_second_epoch",
    ],
)
def test_resumed_training_loop_keeps_the_epochs(
    data: SmallDataset, reference: tuple[int, list[list[int]]], where: str, set_epoch: bool
) -> None:
    """A training loop resumes at the epoch it was in and runs the same epochs as the reference."""
    world, ref = reference
    n0 = len(ref[0])
    done = {"mid_epoch": 100, "end_of_epoch": n0, "after_epoch": n0, "mid_second_epoch": n0 + 57}[
        where
    ]
    original = make(data, rank=world - 1, world_size=world)
    if where == "after_epoch":
        epoch_ids(original)
        state, resume_at, skip = original.state_dict(), 1, 0
    else:
        _, state, _alive = take(original, done)
        resume_at = 0 if done <= n0 else 1  # the epoch whose loop was running at the save
        skip = done - sum(len(e) for e in ref[:resume_at])
    ds = make(data, rank=world - 1, world_size=world)
    ds.load_state_dict(state)
    for e in range(resume_at, EPOCHS):
        if set_epoch:
            ds.set_epoch(e)
        expected = ref[e][skip:] if e == resume_at else ref[e]
        assert len(ds) == len(expected), f"epoch {e}"
        assert epoch_ids(ds) == expected, f"epoch {e}"
    assert ds.epoch == EPOCHS


def test_resume_after_resume(data: SmallDataset, reference: tuple[int, list[list[int]]]) -> None:
    world, ref = reference
    flat = [s for e in ref for s in e]
    first = make(data, rank=world - 1, world_size=world)
    _, s1, _a1 = take(first, 150)
    second = make(data, rank=world - 1, world_size=world)
    second.load_state_dict(s1)
    assert second.state_dict() == s1  # a loaded state reads back unchanged before iterating
    more, s2, _a2 = take(second, len(ref[0]) + 40 - 150)  # into the second epoch
    assert more == flat[150 : len(ref[0]) + 40]
    third = make(data, rank=world - 1, world_size=world)
    third.load_state_dict(s2)
    again, s3, _a3 = take(third, 30)
    assert again == flat[len(ref[0]) + 40 : len(ref[0]) + 70]
    resume_and_compare(data, world, ref, s3, len(ref[0]) + 70)


def test_the_same_state_restores_twice(
    data: SmallDataset, reference: tuple[int, list[list[int]]]
) -> None:
    world, ref = reference
    _, state, _alive = take(make(data, rank=world - 1, world_size=world), 77)
    saved = json.dumps(state, sort_keys=True)
    for _ in range(2):
        resume_and_compare(data, world, ref, state, 77, via_json=False)
    assert json.dumps(state, sort_keys=True) == saved  # loading does not change the state


# -- state size and validation -----------------------------------------------------------


def test_state_is_small_for_a_million_tokens(
    write_small_module: Callable[..., SmallDataset],
) -> None:
    big = write_small_module("million", docs=docs_of_exactly(1_000_000, 3), block_tokens=4096)
    kwargs = {"seed": 1, "shard_size": 64, "window_shards": 4}
    ranks = [stoker.TokenDataset(big.url, 16, rank=r, world_size=4, **kwargs) for r in range(4)]
    sizes = [len(json.dumps(ranks[0].state_dict()))]
    alive = [take(ds, 700)[2] for ds in ranks]
    state = ranks[0].state_dict()
    sizes.append(len(json.dumps(state)))
    assert state["consumed"] == 700
    # restored on another world size the epoch set has holes: still small
    elastic = stoker.TokenDataset(big.url, 16, rank=1, world_size=3, **kwargs)
    elastic.load_state_dict(state)
    _, after, _a = take(elastic, 10)
    sizes.append(len(json.dumps(after)))
    assert len(after["epoch_set"]) > 1
    assert max(sizes) < 4096, sizes
    del alive


def test_state_from_another_write_is_rejected(
    data: SmallDataset, write_small_module: Callable[..., SmallDataset]
) -> None:
    twin = write_small_module("twin", docs=data.docs, block_tokens=256)  # same tokens, new write
    _, state, _a = take(make(data), 5)
    other = make(twin)
    with pytest.raises(stoker.StateError, match="dataset_id"):
        other.load_state_dict(state)


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"seed": 8}, "seed"),
        ({"shard_size": 16}, "shard_size"),
        ({"window_shards": 2}, "window_shards"),
        ({"shuffle": False}, "shuffle"),
    ],
)
def test_state_from_another_configuration_is_rejected(
    data: SmallDataset, change: dict[str, Any], field: str
) -> None:
    _, state, _a = take(make(data), 5)
    with pytest.raises(stoker.StateError, match=field):
        make(data, **change).load_state_dict(state)


def test_state_from_another_seq_len_names_seq_len(data: SmallDataset) -> None:
    _, state, _a = take(make(data), 5)
    with pytest.raises(stoker.StateError, match="seq_len"):
        make(data, seq_len=SEQ + 1).load_state_dict(state)


def test_state_from_another_seq_len_is_rejected(data: SmallDataset) -> None:
    _, state, _a = take(make(data), 5)
    with pytest.raises(stoker.StateError):
        make(data, seq_len=SEQ + 1).load_state_dict(state)


@pytest.mark.parametrize("version", [0, 2, None, "1"])
def test_state_of_another_version_is_rejected(data: SmallDataset, version: Any) -> None:
    _, state, _a = take(make(data), 5)
    state = {**state, "stoker_state": version}
    if version is None:
        del state["stoker_state"]
    with pytest.raises(stoker.StateError, match="version"):
        make(data).load_state_dict(state)


@pytest.mark.parametrize(
    "tamper",
    [
        lambda s: {**s, "consumed": 10**6},
        lambda s: {**s, "consumed": -1},
        lambda s: {**s, "world": 0},
        lambda s: {**s, "epoch": "1"},
        lambda s: {**s, "epoch_set": [[1, 2, 3]]},
        lambda s: {**s, "epoch_set": None},
        lambda s: [s],
    ],
    ids=[
        "consumed_too_many",
        "consumed_negative",
        "world_zero",
        "epoch_str",
        "set_triple",
        "set_none",
        "not_dict",
    ],
)
def test_malformed_states_are_rejected(data: SmallDataset, tamper: Callable[[Any], Any]) -> None:
    _, state, _a = take(make(data), 5)
    ds = make(data)
    with pytest.raises(stoker.StateError):
        ds.load_state_dict(tamper(state))
    # and a rejected state leaves the dataset as it was
    assert ds.state_dict()["consumed"] == 0


def test_state_with_another_drop_remainder_is_a_state_error(data: SmallDataset) -> None:
    _, state, _a = take(make(data), 5)
    with pytest.raises(stoker.StateError, match="drop_remainder"):
        make(data, drop_remainder=True).load_state_dict(state)


# -- elastic restore -----------------------------------------------------------------------


def delivered_positions(eset: np.ndarray, rank: int, ids: list[int]) -> list[tuple[int, int]]:
    """(stream position, sample id) of what one epoch with set ``eset`` gave ``rank``.

    Every rank gets the same count n, and rank r takes the ordered members
    [r * n, (r + 1) * n) of the epoch set (stoker.plan's split).
    """
    n = len(ids)
    pos = intervals.members_at(eset, rank * n + np.arange(n, dtype=np.int64))
    return list(zip(pos.tolist(), ids))


@pytest.mark.parametrize(
    ("k", "new_world", "new_batch"),
    [
        (37, 3, 1),
        (37, 2, 1),
        (37, 5, 1),
        (37, 4, 1),  # same world: the saved split continues as it was
        (37, 4, 2),  # same world, another batch size: re-split
        (155, 3, 1),  # end of the epoch for world 4 (623 // 4 == 155): only 3 samples remain
        (155, 2, 1),
        (155, 5, 1),  # fewer remain than ranks: they carry into the next epoch
        (0, 3, 1),
    ],
)
def test_elastic_restore_covers_the_epoch_exactly_once(
    data: SmallDataset, k: int, new_world: int, new_batch: int
) -> None:
    old = [make(data, rank=r, world_size=4) for r in range(4)]
    alive = []
    before: list[int] = []
    for ds in old:  # synchronous training: every rank consumed k
        got, _state, it = take(ds, k)
        before.extend(got)
        alive.append(it)
    state = old[0].state_dict()
    assert state["consumed"] == k and state["world"] == 4

    new = [make(data, rank=r, world_size=new_world, batch_size=new_batch) for r in range(new_world)]
    for ds in new:
        ds.load_state_dict(state)
    after: list[int] = []
    for epoch in range(2):  # the rest of epoch 0, then epoch 1 (which starts with the carry)
        sets = {json.dumps(intervals.to_list(ds.epoch_positions())) for ds in new}
        assert len(sets) == 1, "every rank must agree on the epoch set"
        eset = new[0].epoch_positions()
        lengths = [len(ds) for ds in new]
        delivered = [epoch_ids(ds) for ds in new]
        # equal work: every rank got the same number, as len() promised
        assert [len(ids) for ids in delivered] == lengths
        assert len(set(lengths)) == 1
        if epoch == 0 and S - 4 * k >= new_world:
            assert lengths[0] == (S - 4 * k) // new_world
        for r, ids in enumerate(delivered):
            # keep the samples of data epoch 0 (stream positions < S)
            after.extend(sid for p, sid in delivered_positions(eset, r, ids) if p < S)
    total = Counter(before) + Counter(after)
    assert sorted(total) == list(range(S))
    assert set(total.values()) == {1}, "a sample was delivered twice"
    del alive
