"""The kind of data is a seam: a second kind (fixed-size float32 vectors stored as blocks,
tests/arrays.py) goes through the same worker pool, slots, coordinator feed, device tier
and resume as tokens, with no change to any of them."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
from arrays import ArrayDataset, write_arrays

import stoker

N, DIM, RPB, B = 203, 6, 16, 8


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    rng = np.random.default_rng(3)
    # multiples of 1/8 below 256: exact in float16, the dtype the device tier copies them in
    rows = rng.integers(0, 2048, size=(N, DIM)) / 8
    return write_arrays(tmp_path_factory.mktemp("arrays") / "ds", rows, RPB)


@pytest.fixture(autouse=True)
def one_rank(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "STOKER_COORDINATOR"):
        monkeypatch.delenv(name, raising=False)


def ids(batches: list[dict[str, torch.Tensor]]) -> list[int]:
    return [i for b in batches for i in b["sample_id"].tolist()]


def check_rows(ds: ArrayDataset, batches: list[dict[str, torch.Tensor]]) -> None:
    stored = ds.rows()
    for b in batches:
        assert set(b) == {"x", "sample_id"}
        np.testing.assert_array_equal(b["x"].float().numpy(), stored[b["sample_id"].numpy()])


def test_the_static_plan_through_the_pool_in_one_order_for_any_number_of_workers(
    root: Path,
) -> None:
    orders = []
    for nw in (0, 2):
        ds = ArrayDataset(root, batch_size=B)
        loader = stoker.TokenLoader(ds, nw)
        first, second = list(loader), list(loader)  # two epochs
        check_rows(ds, first + second)
        assert sorted(ids(first)) == sorted(ids(second)) == list(range(N))  # each once
        assert ids(first) != ids(second)  # a fresh shuffle per epoch
        assert all(b["x"].dtype == torch.float32 for b in first)  # the layout's dtype
        assert len(first) == -(-N // B)
        orders.append(ids(first))
    assert orders[0] == orders[1]


@pytest.mark.parametrize("nw", [0, 2])
@pytest.mark.parametrize("at", [0, 5, 14, -(-N // B)])
def test_resume_from_a_state_continues_exactly(root: Path, nw: int, at: int) -> None:
    whole = ids(list(stoker.TokenLoader(ArrayDataset(root, batch_size=B), nw)))
    loader = stoker.TokenLoader(ArrayDataset(root, batch_size=B), nw)
    it = iter(loader)
    head = [next(it) for _ in range(at)]
    state = loader.state_dict()
    it.close()
    again = stoker.TokenLoader(ArrayDataset(root, batch_size=B), 2 - nw)  # other topology
    again.load_state_dict(state)
    rest = list(again)
    assert ids(head) + ids(rest) == whole
    assert sorted(ids(list(again))) == list(range(N))  # then the next epoch


def test_a_state_of_another_kind_is_refused(root: Path, tmp_path: Path) -> None:
    other = write_arrays(tmp_path / "other", np.zeros((N, DIM + 1)), RPB)
    state = stoker.TokenLoader(ArrayDataset(root, batch_size=B)).state_dict()
    with pytest.raises(stoker.StateError, match=r"dim|dataset"):
        stoker.TokenLoader(ArrayDataset(other, batch_size=B)).load_state_dict(state)


def test_the_device_tier_copies_in_the_kinds_transfer_dtype(root: Path) -> None:
    ds = ArrayDataset(root, batch_size=B)
    loader = stoker.TokenLoader(ds, 2, device="cpu")
    it = iter(loader)
    head = [next(it) for _ in range(7)]
    state = loader.state_dict()  # what training took, not what was read ahead
    it.close()
    assert all(b["x"].dtype == torch.float16 for b in head)  # lent slots hold float16
    check_rows(ds, head)
    rest = stoker.TokenLoader(ArrayDataset(root, batch_size=B), 0)
    rest.load_state_dict(state)
    whole = ids(list(stoker.TokenLoader(ArrayDataset(root, batch_size=B))))
    assert ids(head) + ids(list(rest)) == whole


@pytest.mark.parametrize("nw", [0, 2])
def test_the_coordinator_feeds_it_exactly_once_and_resumes(
    root: Path, tmp_path: Path, nw: int
) -> None:
    ds = ArrayDataset(root, batch_size=B)
    state_dir = str(tmp_path / "state")
    loader = stoker.TokenLoader(ds, nw, coordinator="rank0", coordinator_state=state_dir)
    it = iter(loader)
    head = [next(it) for _ in range(9)]
    state = loader.state_dict()
    assert state["mode"] == "coordinator" and state["batches"] == 9
    it.close()
    loader.close()
    check_rows(ds, head)
    again = stoker.TokenLoader(
        ArrayDataset(root, batch_size=B), nw, coordinator="rank0",
        coordinator_state=str(tmp_path / "state2"),
    )  # fmt: skip
    again.load_state_dict(state)
    rest = list(again)
    again.close()
    check_rows(ds, rest)
    got = Counter(ids(head) + ids(rest))
    assert sorted(got) == list(range(N)) and max(got.values()) == 1  # exactly once
    assert len(head) + len(rest) == -(-N // B)  # the rank's batch count, as without a break


def test_torch_dataloader_workers_read_it_sample_by_sample(root: Path) -> None:
    ds = ArrayDataset(root, batch_size=B)
    dl = torch.utils.data.DataLoader(ds, batch_size=B, num_workers=2)
    batches = list(dl)
    check_rows(ds, batches)
    assert sorted(ids(batches)) == list(range(N))
    assert ids(batches) == ids(list(stoker.TokenLoader(ArrayDataset(root, batch_size=B))))
