"""Resume states that do not fit are a StateError, for every front end; breaking out of a
loop and iterating again delivers nothing twice.

Front ends: ``TokenDataset`` (in-process), ``TokenLoader`` (static, in-process and with
workers), ``TokenLoader(coordinator=...)`` and ``DevicePrefetcher``.
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Callable
from typing import Any

import pytest

import stoker
from stoker import DevicePrefetcher, TokenDataset, TokenLoader

from .helpers import Written, assert_exactly_once, check_samples, unbatch

SEQ_LEN = 16
BATCH = 4


def _dataset(written: Written, **kw: Any) -> TokenDataset:
    return TokenDataset(str(written.path), SEQ_LEN, batch_size=BATCH, **kw)


def _static_state(written: Written) -> dict[str, Any]:
    loader = TokenLoader(_dataset(written))
    it = iter(loader)
    for _ in range(3):
        next(it)
    state = loader.state_dict()
    it.close()
    json.dumps(state)
    return state


def _set(name: str, value: Any) -> Callable[[dict[str, Any]], Any]:
    def edit(state: dict[str, Any]) -> dict[str, Any]:
        state[name] = value
        return state

    return edit


HUGE = 10**30
STATIC_BAD: dict[str, Callable[[dict[str, Any]], Any]] = {
    "none": lambda s: None,
    "list": lambda s: [s],
    "string": lambda s: json.dumps(s),
    "future-version": _set("stoker_state", 2),
    "version-true": _set("stoker_state", True),
    "version-string": _set("stoker_state", "1"),
    "unknown-mode": _set("mode", "mixture"),
    "huge-epoch": _set("epoch", HUGE),
    "huge-world": _set("world", HUGE),
    "huge-chunk": _set("chunk", HUGE),
    "huge-consumed": _set("consumed", HUGE),
    "float-consumed": _set("consumed", 3.0),
    "bool-world": _set("world", True),
    "string-epoch": _set("epoch", "0"),
    "none-epoch-set": _set("epoch_set", None),
    "string-epoch-set": _set("epoch_set", "0-100"),
    "flat-epoch-set": _set("epoch_set", [0, 100]),
    "huge-epoch-set": _set("epoch_set", [[0, HUGE]]),
    "next-epochs-positions": _set("epoch_set", [[0, 10**7]]),
    "negative-positions": _set("epoch_set", [[-50, 10]]),
    "reversed-range": _set("epoch_set", [[10, 5]]),
    "overlapping-ranges": _set("epoch_set", [[0, 40], [20, 60]]),
    "float-positions": _set("epoch_set", [[0.0, 40.0]]),
    "bool-shuffle": _set("shuffle", 1),
    "string-drop": _set("drop_remainder", "false"),
    "seed-true": _set("seed", True),
    "worker-list": _set("worker", [0, 2, 5]),
    "worker-out-of-range": _set("worker", {"worker": 5, "num_workers": 2, "yielded": 0}),
    "worker-yielded-huge": _set("worker", {"worker": 0, "num_workers": 2, "yielded": HUGE}),
}


@pytest.mark.parametrize("case", list(STATIC_BAD))
@pytest.mark.parametrize("front", ["dataset", "loader", "loader-workers", "device"])
def test_a_bad_static_state_is_a_state_error(small_dataset: Written, case: str, front: str) -> None:
    state = STATIC_BAD[case](copy.deepcopy(_static_state(small_dataset)))
    ds = _dataset(small_dataset, seed=1 if case == "seed-true" else 0)
    target: Any
    if front == "dataset":
        target = ds
    elif front == "loader":
        target = TokenLoader(ds)
    elif front == "loader-workers":
        target = TokenLoader(ds, num_workers=2)
    else:
        target = DevicePrefetcher(TokenLoader(ds), "cpu")
    with pytest.raises(stoker.StateError):
        target.load_state_dict(state)


def test_a_good_static_state_still_restores_exactly(small_dataset: Written) -> None:
    state = _static_state(small_dataset)
    loader = TokenLoader(_dataset(small_dataset))
    loader.load_state_dict(state)
    rest = unbatch(loader)
    assert len(rest) == small_dataset.num_samples(SEQ_LEN) - 3 * BATCH


# ------------------------------------------------------------------ coordinator-fed states


def _dynamic_state(written: Written, **snapshot: Any) -> dict[str, Any]:
    """A state as a coordinator-fed loader makes it (the checkpoint names its snapshot)."""
    S = written.num_samples(SEQ_LEN)
    snap = {
        "epoch": 0,
        "epoch_set": [[0, S]],
        "consumed": [[0, 8]],
        "stream": _dataset(written).stream_identity(),
        "batches": 2,
        **snapshot,
    }
    text = json.dumps(snap, separators=(",", ":"), sort_keys=True)
    name = f"epoch0-{hashlib.sha256(text.encode()).hexdigest()[:16]}"
    return {
        "stoker_state": 1,
        "mode": "coordinator",
        "epoch": 0,
        "batches": 2,
        "checkpoint": name,
        "snapshot": snap,
    }


def _tamper(edit: Callable[[dict[str, Any]], Any]) -> Callable[[Written], Any]:
    return lambda w: edit(_dynamic_state(w))


DYNAMIC_BAD: dict[str, Callable[[Written], Any]] = {
    "none": lambda w: None,
    "list": lambda w: [],
    "string": lambda w: "state",
    "future-version": _tamper(_set("stoker_state", 2)),
    "static-state": lambda w: _static_state(w),
    "snapshot-list": _tamper(_set("snapshot", [])),
    "snapshot-none": _tamper(_set("snapshot", None)),
    "checkpoint-path": _tamper(_set("checkpoint", "../../../etc/passwd")),
    "checkpoint-int": _tamper(_set("checkpoint", 7)),
    "huge-epoch": _tamper(_set("epoch", HUGE)),
    "huge-batches": _tamper(_set("batches", HUGE)),
    "string-batches": _tamper(_set("batches", "2")),
    "edited-snapshot": lambda w: (
        lambda s: (s["snapshot"].__setitem__("consumed", [[0, 4]]), s)[1]
    )(_dynamic_state(w)),
    "positions-outside-epoch": lambda w: _dynamic_state(w, epoch_set=[[0, 10**9]]),
    "consumed-outside-set": lambda w: _dynamic_state(w, consumed=[[10**5, 10**5 + 8]]),
    "snapshot-of-another-epoch": lambda w: _dynamic_state(w, epoch=1),
    "another-stream": lambda w: _dynamic_state(w, stream='{"dataset_id": "x"}'),
}


@pytest.mark.parametrize("case", list(DYNAMIC_BAD))
@pytest.mark.parametrize("front", ["loader", "device"])
def test_a_bad_coordinator_state_is_a_state_error(
    small_dataset: Written, case: str, front: str
) -> None:
    state = DYNAMIC_BAD[case](small_dataset)
    loader = TokenLoader(_dataset(small_dataset), coordinator="rank0")
    target: Any = loader if front == "loader" else DevicePrefetcher(loader, "cpu")
    with pytest.raises(stoker.StateError):
        target.load_state_dict(state)
    assert loader._client is None  # refused before any coordinator was started


def test_a_good_coordinator_state_is_accepted(small_dataset: Written) -> None:
    loader = TokenLoader(_dataset(small_dataset), coordinator="rank0")
    loader.load_state_dict(_dynamic_state(small_dataset))
    assert loader._restore is not None


# ------------------------------------------------------------------ break, then iterate again


def _fronts(written: Written) -> dict[str, Callable[[], Any]]:
    return {
        "dataset": lambda: _dataset(written),
        "loader": lambda: TokenLoader(_dataset(written)),
        "loader-workers": lambda: TokenLoader(_dataset(written), num_workers=2, prefetch=2),
        "device": lambda: DevicePrefetcher(TokenLoader(_dataset(written), num_workers=2), "cpu"),
        "loader-device": lambda: TokenLoader(_dataset(written), num_workers=2, device="cpu"),
    }


def _items(front: str, batches: Any) -> list[dict[str, Any]]:
    return [batches] if front == "dataset" else unbatch([batches])


@pytest.mark.parametrize(
    "front", ["dataset", "loader", "loader-workers", "device", "loader-device"]
)
def test_breaking_out_and_iterating_again_continues_the_epoch(
    small_dataset: Written, front: str
) -> None:
    """Iterating again continues from what was consumed; after the epoch's end, the next
    epoch runs. Every sample of the epoch exactly once, across three broken passes."""
    S = small_dataset.num_samples(SEQ_LEN)
    target = _fronts(small_dataset)[front]()
    got: list[int] = []
    per_pass = 3 if front == "dataset" else 2  # items (samples or batches) before the break
    for _ in range(3):
        for i, item in enumerate(target):
            got += check_samples(small_dataset, SEQ_LEN, _items(front, item))
            if i + 1 == per_pass:
                break
    state = target.state_dict()
    rest = [
        s for item in target for s in check_samples(small_dataset, SEQ_LEN, _items(front, item))
    ]
    assert_exactly_once(got + rest, S)
    assert state["consumed"] == len(got)  # the state said what had been consumed
    # the epoch ended: iterating again runs the next one, whole
    nxt = [s for item in target for s in check_samples(small_dataset, SEQ_LEN, _items(front, item))]
    assert target.state_dict()["epoch"] == 2
    assert len(nxt) >= S - 1 and len(set(nxt)) == len(nxt)


@pytest.mark.parametrize("front", ["loader", "loader-workers", "loader-device"])
def test_len_is_what_iterating_now_delivers(small_dataset: Written, front: str) -> None:
    """``len()`` is the number of batches iterating now hands out: the rest of the epoch."""
    target = _fronts(small_dataset)[front]()
    total = len(target)
    assert total == -(-small_dataset.num_samples(SEQ_LEN) // BATCH)
    for i, _ in enumerate(target):
        if i == 1:
            break
    assert len(target) == total - 2
    assert sum(1 for _ in target) == total - 2


@pytest.mark.parametrize(("num_workers", "device"), [(0, None), (2, None), (2, "cpu")])
def test_breaking_out_of_a_coordinator_fed_loader_and_iterating_again(
    small_dataset: Written, tmp_path: Any, num_workers: int, device: str | None
) -> None:
    """Fed by a coordinator too: the broken-off pass (its read-ahead already confirmed) is
    kept and continued by the next one, so the epoch still comes exactly once."""
    S = small_dataset.num_samples(SEQ_LEN)
    loader = TokenLoader(
        _dataset(small_dataset),
        num_workers=num_workers,
        device=device,
        coordinator="rank0",
        coordinator_state=str(tmp_path / "state"),
    )
    try:
        total = len(loader)
        got: list[int] = []
        for _ in range(3):
            for i, batch in enumerate(loader):
                got += check_samples(small_dataset, SEQ_LEN, unbatch([batch]))
                if i == 1:
                    break
        assert len(loader) == total - 6  # len() is what iterating now hands out
        rest = unbatch(loader)
        assert_exactly_once(got + check_samples(small_dataset, SEQ_LEN, rest), S)
        assert total == -(-S // BATCH)
        # a pass that is closed, not just broken off, is not continued silently
        for i, _ in enumerate(loader):
            if i == 1:
                break
        if device is None:
            loader._drop_suspended()
        else:
            loader._device.close()
        with pytest.raises(stoker.StateError, match="was not kept"):
            next(iter(loader))
    finally:
        loader.close()


def _epoch_ids(written: Written, epoch: int) -> list[int]:
    ds = _dataset(written)
    ds.set_epoch(epoch)
    return [int(item["sample_id"]) for item in ds]


@pytest.mark.filterwarnings("default:.*this DataLoader iteration runs epoch:RuntimeWarning")
def test_a_dataloader_iterated_again_runs_the_next_epoch(small_dataset: Written) -> None:
    """Through torch DataLoader workers the main process never learns what was consumed:
    iterating again runs the next epoch (with a warning), never the same one twice."""
    from torch.utils.data import DataLoader

    ds = _dataset(small_dataset)
    loader = DataLoader(ds, batch_size=BATCH, num_workers=2)
    first = []
    for i, batch in enumerate(loader):
        first += batch["sample_id"].tolist()
        if i == 2:
            break
    assert first == _epoch_ids(small_dataset, 0)[: 3 * BATCH]
    again = [s for b in loader for s in b["sample_id"].tolist()]
    assert again == _epoch_ids(small_dataset, 1)
    third = [s for b in loader for s in b["sample_id"].tolist()]
    assert third == _epoch_ids(small_dataset, 2)
    ds.set_epoch(0)  # asked for explicitly: run as asked
    assert [s for b in loader for s in b["sample_id"].tolist()] == _epoch_ids(small_dataset, 0)


def test_states_with_numpy_integers_restore(small_dataset: Written) -> None:
    """Strict types reject a bool or a string, not the numpy integers training scripts use."""
    import numpy as np

    ds = _dataset(small_dataset, seed=np.int64(7))
    ds.set_epoch(np.int64(1))
    it = iter(ds)
    got = [int(next(it)["sample_id"]) for _ in range(5)]
    state = json.loads(json.dumps(ds.state_dict()))  # a checkpoint round trip
    it.close()
    again = _dataset(small_dataset, seed=7)
    again.load_state_dict(state)
    rest = [int(item["sample_id"]) for item in again]
    ref = _dataset(small_dataset, seed=7)
    ref.set_epoch(1)
    assert got + rest == [int(item["sample_id"]) for item in ref]


def test_a_dataloader_iterated_again_after_a_restore_runs_the_next_epoch(
    small_dataset: Written,
) -> None:
    """A loaded state is continued by the first DataLoader iteration only."""
    from torch.utils.data import DataLoader

    ds = _dataset(small_dataset)
    ds.load_state_dict(_static_state(small_dataset))  # 3 batches of epoch 0 consumed
    loader = DataLoader(ds, batch_size=BATCH, num_workers=2)
    first = [s for b in loader for s in b["sample_id"].tolist()]
    assert first == _epoch_ids(small_dataset, 0)[3 * BATCH :]
    again = [s for b in loader for s in b["sample_id"].tolist()]
    assert again == _epoch_ids(small_dataset, 1)
