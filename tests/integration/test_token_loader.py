"""stoker.TokenLoader: worker processes, shared-memory hand-off, exact state."""

from __future__ import annotations

import multiprocessing as mp
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

import stoker

from .helpers import Written, assert_exactly_once, check_samples, unbatch, write_dataset

SEQ_LEN = 16
BATCH = 4


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> Written:
    root = tmp_path_factory.mktemp("loader")
    return write_dataset(root / "ds", num_docs=120, seed=7, block_tokens=512)


def make(written: Written, **kw: object) -> stoker.TokenDataset:
    kw.setdefault("batch_size", BATCH)
    return stoker.TokenDataset(str(written.path), SEQ_LEN, shard_size=5, window_shards=3, **kw)  # type: ignore[arg-type]


def reference(written: Written, **kw: object) -> list[list[int]]:
    """Batches of torch's DataLoader in-process: the order TokenLoader must match."""
    ds = make(written, **kw)
    return [b["sample_id"].tolist() for b in DataLoader(ds, batch_size=BATCH)]


@pytest.mark.parametrize("num_workers", [0, 1, 2, 3])
def test_batches_match_dataloader_order_and_content(written: Written, num_workers: int) -> None:
    ref = reference(written)
    batches = list(stoker.TokenLoader(make(written), num_workers))
    assert [b["sample_id"].tolist() for b in batches] == ref
    ids = check_samples(written, SEQ_LEN, unbatch(batches))
    assert_exactly_once(ids, written.num_samples(SEQ_LEN))
    for b in batches[:-1]:
        assert b["tokens"].shape == (BATCH, SEQ_LEN + 1)
        assert b["doc_start_mask"].shape == (BATCH, SEQ_LEN + 1)


def test_iterating_again_runs_the_next_epoch(written: Written) -> None:
    loader = stoker.TokenLoader(make(written), 2)
    first = [x for b in loader for x in b["sample_id"].tolist()]
    second = [x for b in loader for x in b["sample_id"].tolist()]
    assert first != second
    assert_exactly_once(first, written.num_samples(SEQ_LEN))
    assert_exactly_once(second, written.num_samples(SEQ_LEN))
    assert loader.dataset.epoch == 2


@pytest.mark.parametrize(("before", "after"), [(2, 2), (2, 3), (0, 2), (3, 0)])
def test_resume_with_another_number_of_workers_is_exact(
    written: Written, before: int, after: int
) -> None:
    ref = reference(written)
    loader = stoker.TokenLoader(make(written), before)
    it = iter(loader)
    taken = [next(it)["sample_id"].tolist() for _ in range(7)]
    state = loader.state_dict()
    it.close()
    assert state["consumed"] == 7 * BATCH
    resumed = stoker.TokenLoader(make(written), after)
    resumed.load_state_dict(state)
    rest = [b["sample_id"].tolist() for b in resumed]
    assert taken + rest == ref


def test_state_counts_consumed_not_prefetched(written: Written) -> None:
    loader = stoker.TokenLoader(make(written), 2, prefetch=4)
    it = iter(loader)
    next(it)
    # the workers have filled several slots ahead by now; the state must not count them
    assert loader.state_dict()["consumed"] == BATCH
    it.close()


def test_elastic_resume_from_loader_state_covers_the_epoch(written: Written) -> None:
    """4 ranks consume 3 batches each; 3 ranks finish the epoch: every sample once."""
    n = written.num_samples(SEQ_LEN)
    seen: list[int] = []
    state = None
    for rank in range(4):
        loader = stoker.TokenLoader(make(written, rank=rank, world_size=4), 1)
        it = iter(loader)
        for _ in range(3):
            seen += next(it)["sample_id"].tolist()
        if rank == 0:
            state = loader.state_dict()
        it.close()
    assert state is not None
    counts = []
    carried = []
    for rank in range(3):
        ds = make(written, rank=rank, world_size=3)
        loader = stoker.TokenLoader(ds, 2)
        loader.load_state_dict(state)
        got = [x for b in loader for x in b["sample_id"].tolist()]
        counts.append(len(got))
        seen += got
        # what did not divide evenly is carried: next epoch's positions still in data epoch 0
        carried = [int(p) for a, b in ds.epoch_positions() for p in range(a, min(b, n))]
    assert len(set(counts)) == 1  # equal work on every rank
    assert len(carried) < 3  # fewer than the new world size
    stream_order = stoker.TokenDataset(str(written.path), SEQ_LEN, shard_size=5, window_shards=3)
    from stoker import plan

    leftover_ids = plan.Stream(n, stream_order.shuffle_config).samples(
        np.asarray(carried, dtype=np.int64)
    )
    assert_exactly_once(seen + leftover_ids.tolist(), n)


def test_zero_copy_batches_are_views_valid_until_next(written: Written) -> None:
    ref = reference(written)
    loader = stoker.TokenLoader(make(written), 2, zero_copy=True)
    got = []
    for batch in loader:
        got.append(batch["sample_id"].tolist())  # read before asking for the next one
    assert got == ref


def test_batches_come_in_their_slots_and_the_slots_go_back_once_dropped(written: Written) -> None:
    whole = [{k: v.clone() for k, v in b.items()} for b in stoker.TokenLoader(make(written), 0)]
    loader = stoker.TokenLoader(make(written), 2)
    it = iter(loader)
    for want in whole:  # each batch dropped before the next (the loop variable rebound)
        b = next(it)
        assert all(torch.equal(b[k], want[k]) for k in want)
    lent = loader.last_handout
    assert lent is not None and lent.lent == len(whole)  # none copied: slots came back
    lent.returned()  # (what was let go of since the last wait on a worker)
    assert sum(lent.out) == 1  # the last batch, still held (here and by the pass)
    with pytest.raises(StopIteration):
        next(it)


def test_with_two_slots_a_worker_lends_every_batch_its_caller_lets_go_of(
    written: Written,
) -> None:
    # one slot being filled, one out with the caller: the loader's own frames must not
    # hold the batch the caller let go of while it reads the next, or it is copied
    whole = [{k: v.clone() for k, v in b.items()} for b in stoker.TokenLoader(make(written), 0)]
    loader = stoker.TokenLoader(make(written), 1, prefetch=2)
    it = iter(loader)
    for want in whole:
        b = next(it)
        assert all(torch.equal(b[k], want[k]) for k in want)
        del b  # let go of it before asking for the next
    lent = loader.last_handout
    assert lent is not None and lent.lent == len(whole)  # none copied


def test_batches_kept_by_the_caller_stay_as_they_were(written: Written) -> None:
    whole = [{k: v.clone() for k, v in b.items()} for b in stoker.TokenLoader(make(written), 0)]
    loader = stoker.TokenLoader(make(written), 2, prefetch=3)
    kept = list(loader)  # every batch held: the first in their slots, the rest copied
    lent = loader.last_handout
    assert lent is not None and 0 < lent.lent <= 2 * (3 - 1) < len(kept)
    views = [b["tokens"][1:3] for b in kept]  # (views of them, after the pass ended)
    again = list(loader)  # the next epoch's workers and slots
    assert len(again) == len(kept)
    for b, v, want in zip(kept, views, whole, strict=True):
        assert all(torch.equal(b[k], want[k]) for k in want)
        assert torch.equal(v, want["tokens"][1:3])
    # a view kept of each batch holds its slot as the whole batch would
    loader = stoker.TokenLoader(make(written), 2, prefetch=3)
    firsts = [b["tokens"][0] for b in loader]
    assert loader.last_handout is not None and loader.last_handout.lent <= 4
    assert all(torch.equal(f, w["tokens"][0]) for f, w in zip(firsts, whole, strict=True))


def _compare_later(batch: dict[str, torch.Tensor], want: torch.Tensor, go: object) -> None:
    go.recv()  # type: ignore[attr-defined]  # (once the parent has read on)
    os._exit(0 if torch.equal(batch["tokens"], want) else 1)


def test_a_batch_a_forked_child_holds_is_not_overwritten(written: Written) -> None:
    import multiprocessing as mp

    loader = stoker.TokenLoader(make(written), 1, prefetch=4)
    it = iter(loader)
    b = next(it)
    want = b["tokens"].clone()
    ctx = mp.get_context("fork")
    mine, theirs = ctx.Pipe()
    child = ctx.Process(target=_compare_later, args=(b, want, theirs))
    child.start()  # the child shares the slot's pages: it is never given back
    del b
    for _ in range(12):  # (every slot of the worker's ring used again, but that one)
        next(it)
    mine.send(True)
    child.join()
    assert child.exitcode == 0
    assert loader.last_handout is not None and loader.last_handout.frozen == 1
    it.close()


@pytest.mark.filterwarnings("default:.*failed its checksum; refetching:UserWarning")
def test_corrupt_block_raises_the_typed_error_from_a_worker(tmp_path: Path) -> None:
    written = write_dataset(tmp_path / "ds", num_docs=60, seed=3, block_tokens=256)
    path, start, _ = written.record_span(1)
    data = bytearray((written.path / path).read_bytes())
    data[start + 4] ^= 0xFF
    (written.path / path).write_bytes(bytes(data))
    loader = stoker.TokenLoader(make(written, shuffle=False), 2)
    with pytest.raises(stoker.ChecksumError) as info:
        list(loader)
    assert "block 1" in str(info.value) and "loader worker" in str(info.value)


def test_breaking_out_leaves_no_worker_behind(written: Written) -> None:
    before = {p.pid for p in mp.active_children()}
    loader = stoker.TokenLoader(make(written), 3)
    it = iter(loader)
    next(it)
    workers = {p.pid for p in mp.active_children()} - before
    assert len(workers) == 3
    it.close()
    assert {p.pid for p in mp.active_children()} - before == set()
    for pid in workers:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_bad_arguments_are_config_errors(written: Written) -> None:
    with pytest.raises(stoker.ConfigError, match="num_workers"):
        stoker.TokenLoader(make(written), -1)
    with pytest.raises(stoker.ConfigError, match="prefetch"):
        stoker.TokenLoader(make(written), 1, prefetch=0)


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("kind", ["dataset", "mixture", "coordinator"])
def test_a_pass_left_open_at_exit_closes_quietly(
    tmp_path: Path, num_workers: int, kind: str
) -> None:
    """A script that stops iterating and ends without closing its loader exits cleanly:
    its pass is closed while the modules its clean-up needs still exist (it used to be
    closed by the garbage collector after them, printing a traceback)."""
    for name in ("a", "b"):
        write_dataset(tmp_path / name, num_docs=40, seed=ord(name))
    script = tmp_path / "job.py"
    script.write_text(
        "import sys, stoker\n"
        "a, b, kind, nw = sys.argv[1:]\n"
        "ds = stoker.TokenDataset(a, 16, batch_size=4)\n"
        "if kind == 'mixture':\n"
        "    ds = stoker.Mixture({'a': ds, 'b': stoker.TokenDataset(b, 16)}, {'a': 1, 'b': 1},"
        " batch_size=4)\n"
        "kw = {'coordinator': 'rank0', 'coordinator_state': a + '-state'} if kind == "
        "'coordinator' else {}\n"
        "it = iter(stoker.TokenLoader(ds, int(nw), **kw))\n"
        "print(len(next(it)['tokens']))\n"
    )
    got = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "a"), str(tmp_path / "b"), kind,
         str(num_workers)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert got.returncode == 0, got.stderr
    assert got.stdout.strip() == "4"
    assert "Traceback" not in got.stderr and "Exception ignored" not in got.stderr, got.stderr


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_forked_child_that_exits_leaves_its_parents_pass_alone(
    tmp_path: Path, num_workers: int
) -> None:
    """A process forked (``os.fork()``) mid-pass that exits normally closes nothing of its
    parent's: multiprocessing's exit handler used to terminate the parent's workers,
    and the child's clean-up ran the parent's (its reader threads are not the child's)."""
    write_dataset(tmp_path / "a", num_docs=40, seed=3)
    script = tmp_path / "job.py"
    script.write_text(
        "import os, sys, stoker\n"
        "a, nw = sys.argv[1:]\n"
        "want = [b['sample_id'].tolist() for b in stoker.TokenLoader("
        "stoker.TokenDataset(a, 16, batch_size=4), 0)]\n"
        "it = iter(stoker.TokenLoader(stoker.TokenDataset(a, 16, batch_size=4), int(nw)))\n"
        "head = [next(it)['sample_id'].tolist() for _ in range(3)]\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    sys.exit(0)  # a child with work of its own, ending as Python programs do\n"
        "_, status = os.waitpid(pid, 0)\n"
        "print(os.waitstatus_to_exitcode(status), head + [b['sample_id'].tolist() for b in it]"
        " == want)\n"
    )
    got = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "a"), str(num_workers)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert got.returncode == 0, got.stderr
    assert got.stdout.split() == ["0", "True"], got.stderr
    assert "Traceback" not in got.stderr and "Exception ignored" not in got.stderr, got.stderr
