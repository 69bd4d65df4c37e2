"""A pass in the process that uses its batches keeps its reader for the next pass
(stoker.loader.carry): the next epoch reads exactly as a fresh reader would, and the
kept reader is closed whenever the next pass is not the one it was planned for."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader

import stoker

from .helpers import Written, assert_exactly_once, one_rank, photo_records, write_dataset  # noqa: F401 (one_rank: a fixture)

SEQ_LEN = 16
BATCH = 4
WEIGHTS = {"web": 0.5, "code": 0.3, "book": 0.2}

pytestmark = pytest.mark.usefixtures("one_rank")


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Written]:
    root = tmp_path_factory.mktemp("carry")
    docs = {"web": 150, "code": 50, "book": 12}
    return {
        n: write_dataset(root / n, num_docs=d, seed=i, block_tokens=512)
        for i, (n, d) in enumerate(docs.items())
    }


def token_ds(w: Written, seed: int = 0, **kw: Any) -> stoker.TokenDataset:
    kw.setdefault("batch_size", BATCH)
    return stoker.TokenDataset(str(w.path), SEQ_LEN, shard_size=5, seed=seed, **kw)


def make(written: dict[str, Written], kind: str) -> Any:
    if kind == "spread":
        return token_ds(written["web"])
    if kind == "window":
        order = stoker.ShuffleConfig(order="window", shard_size=5, window_shards=3)
        return stoker.TokenDataset(
            str(written["web"].path), SEQ_LEN, batch_size=BATCH, shuffle=order
        )
    if kind == "remainder":  # each epoch carries its leftover into the next
        return token_ds(written["web"], batch_size=7)
    srcs = {n: token_ds(written[n], seed=i, batch_size=1) for i, n in enumerate(WEIGHTS)}
    return stoker.Mixture(srcs, WEIGHTS, batch_size=BATCH)


class Opened:
    """The readers a dataset opened, and which of them were closed (the dataset's own
    ``open_reader`` and readers, watched)."""

    def __init__(self, ds: Any) -> None:
        self.readers: list[Any] = []
        self.closed: list[Any] = []
        real = ds.open_reader

        def open_reader(*a: Any, **kw: Any) -> Any:
            reader = real(*a, **kw)
            close = reader.close

            def closing() -> None:
                self.closed.append(reader)
                close()

            reader.close = closing
            self.readers.append(reader)
            return reader

        ds.open_reader = open_reader

    @property
    def open(self) -> int:
        return len(self.readers) - len(self.closed)


def rows(batches: list[dict[str, torch.Tensor]]) -> list[tuple[int, tuple[int, ...]]]:
    """Every row's sample id and tokens, in order."""
    return [
        (int(i), tuple(t.tolist()))
        for b in batches
        for i, t in zip(b["sample_id"], b["tokens"], strict=True)
    ]


def fresh(written: dict[str, Written], kind: str, epoch: int) -> list[Any]:
    """Epoch ``epoch`` read by a dataset and loader of its own (nothing kept from before)."""
    ds = make(written, kind)
    ds.set_epoch(epoch)
    return rows(list(stoker.TokenLoader(ds, 0)))


@pytest.mark.parametrize("kind", ["spread", "window", "remainder", "mixture"])
def test_later_epochs_read_through_the_kept_reader_as_fresh_ones_would(
    written: dict[str, Written], kind: str
) -> None:
    ds = make(written, kind)
    opened = Opened(ds)
    loader = stoker.TokenLoader(ds, 0)
    epochs = [rows(list(loader)) for _ in range(3)]
    assert len(opened.readers) == 1  # opened once, kept from each pass for the next
    assert opened.open == 1
    for e, got in enumerate(epochs):
        assert got == fresh(written, kind, e)
    assert epochs[0] != epochs[1]
    loader.close()  # the kept reader goes with the loader
    assert opened.open == 0


def test_iterating_the_dataset_itself_keeps_its_reader_too(written: dict[str, Written]) -> None:
    ds = make(written, "mixture")
    opened = Opened(ds)
    epochs = [[int(s["sample_id"]) for s in ds] for _ in range(3)]
    assert len(opened.readers) == 1
    for e, got in enumerate(epochs):
        assert got == [i for i, _ in fresh(written, "mixture", e)]
    ds.release_readers()
    assert opened.open == 0


@pytest.mark.parametrize("change", ["other epoch", "state", "workers", "DataLoader workers"])
def test_a_kept_reader_is_closed_when_the_next_pass_is_another(
    written: dict[str, Written], change: str
) -> None:
    ds = make(written, "spread")
    opened = Opened(ds)
    loader = stoker.TokenLoader(ds, 0)
    list(loader)
    it = iter(loader)
    head = rows([next(it) for _ in range(3)])
    state = loader.state_dict()
    it.close()  # broken off: its reader is closed, nothing kept
    assert opened.open == 0 and not ds._kept
    list(stoker.TokenLoader(ds, 0))  # the rest of epoch 1, which keeps its reader for 2
    assert opened.open == 1
    if change == "other epoch":
        ds.set_epoch(5)
        assert opened.open == 0  # closed at once
        assert rows(list(loader)) == fresh(written, "spread", 5)
    elif change == "state":
        ds.load_state_dict(state)
        assert opened.open == 0
        assert head + rows(list(loader)) == fresh(written, "spread", 1)
    elif change == "workers":
        got = list(stoker.TokenLoader(ds, 2))  # forked workers: the kept reader closed first
        assert opened.closed == opened.readers[:2]
        assert rows(got) == fresh(written, "spread", 2)
    else:  # torch's workers, forked from here: the kept reader is closed before the fork
        it = iter(DataLoader(ds, batch_size=None, num_workers=2))
        assert opened.open == 0
        ids = [int(s["sample_id"]) for s in it]
        assert sorted(ids) == sorted(i for i, _ in fresh(written, "spread", 2))


def test_setting_the_epoch_that_comes_next_keeps_the_reader(written: dict[str, Written]) -> None:
    """The loop most training scripts run (``set_epoch(e)`` before each epoch)."""
    ds = make(written, "mixture")
    opened = Opened(ds)
    loader = stoker.TokenLoader(ds, 0)
    got = []
    for e in range(3):
        loader.set_epoch(e)
        got.append(rows(list(loader)))
    assert len(opened.readers) == 1
    assert got == [fresh(written, "mixture", e) for e in range(3)]


def test_a_records_reader_is_opened_for_each_epoch(tmp_path: Path) -> None:
    """Augmented records are drawn from the epoch: their reader is never kept."""
    root = photo_records(tmp_path / "images", 40, 1, (40, 80), (7, 10), 30_000)
    ds = stoker.RecordDataset(str(root), batch_size=8, image_size=24, seed=1)
    opened = Opened(ds)
    loader = stoker.TokenLoader(ds, 0)
    for _ in range(2):
        ids = [i for b in loader for i in b["sample_id"].tolist()]
        assert_exactly_once(ids, 40)
    assert len(opened.readers) == 2 and opened.open == 0


def test_the_kept_reader_is_planned_into_the_next_epoch(written: dict[str, Written]) -> None:
    """What the next pass gains: its first samples are already in the kept reader's plan
    (their blocks decoded by its threads while the last pass ended)."""
    ds = make(written, "spread")
    loader = stoker.TokenLoader(ds, 0)
    list(loader)
    ((planner, reader),) = ds._kept._held.values()
    nxt = [i for i, _ in fresh(written, "spread", 1)][: 2 * BATCH]  # its first two batches
    assert reader._seq[reader._pos : reader._pos + len(nxt)].tolist() == nxt
    assert planner.ids[planner.i : planner.i + len(nxt)].tolist() == nxt
    loader.close()
