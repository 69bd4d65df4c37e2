"""stoker.Mixture fed by a coordinator's leases: every position of the mixture's epoch
exactly once (the static plan's samples, the same multiset), through a checkpoint, a
SIGKILL of the whole job, and `stoker replay`; a restore that changes the plan is refused."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

import stoker
from stoker.coordinator.client import CoordinatorClient
from stoker.mixture.stream import decode

from .helpers import Written, reap
from .test_agent import Agents
from .test_mixture import BATCH, SEQ_LEN, WEIGHTS, check_tokens, make, written
from .test_rank0_coordinator import launch, steps

__all__ = ["written"]  # the fixture, shared with test_mixture

B = BATCH


def named(decoded: tuple[np.ndarray, np.ndarray], names: object) -> list[tuple[str, int]]:
    """``(source name, its sample id)`` of decoded mixture ids, sources indexed in ``names``."""
    order = list(names)  # type: ignore[call-overload]
    return [(order[s], i) for s, i in zip(decoded[0].tolist(), decoded[1].tolist(), strict=True)]


def checkpointed(
    written: dict[str, Written], state_dir: Path, k: int = 9
) -> tuple[list[dict], dict]:
    """The first ``k`` batches of a coordinator-fed run (rank 0's coordinator, its state
    under ``state_dir``) and the state after them; the run then ends."""
    loader = stoker.TokenLoader(
        make(written), 0, coordinator="rank0", coordinator_state=str(state_dir)
    )
    it = iter(loader)
    head = [next(it) for _ in range(k)]
    state = loader.state_dict()
    it.close()
    loader.close()
    return head, state


def ids(batches: list[dict]) -> list[int]:
    return [i for b in batches for i in b["sample_id"].tolist()]


def static_epoch(written: dict[str, Written], world: int, epoch: int = 0) -> Counter[int]:
    """The mixture sample ids of the static plan's epoch ``epoch`` on ``world`` ranks."""
    out: Counter[int] = Counter()
    for rank in range(world):
        loader = stoker.TokenLoader(make(written, rank=rank, world_size=world), 0)
        for e in range(epoch + 1):
            got = ids(list(loader))
            if e == epoch:
                out.update(got)
    return out


@pytest.mark.parametrize("nw", [0, 2])
def test_a_coordinator_feeds_a_mixture_exactly_once_and_resumes(
    written: dict[str, Written], tmp_path: Path, nw: int
) -> None:
    want = static_epoch(written, 1)
    spe = make(written).steps_per_epoch
    leases = stoker.LeaseConfig(lease_size=64)  # (a mixture's: 600, its sources' over 0.2)
    loader = stoker.TokenLoader(
        make(written), nw, coordinator="rank0", coordinator_state=str(tmp_path / "a"),
        coordinator_config=leases,
    )  # fmt: skip
    it = iter(loader)
    head = [next(it) for _ in range(9)]
    state = loader.state_dict()
    assert state["mode"] == "coordinator" and state["batches"] == 9
    it.close()
    loader.close()
    again = stoker.TokenLoader(
        make(written), nw, coordinator="rank0", coordinator_state=str(tmp_path / "b"),
        coordinator_config=leases,
    )  # fmt: skip
    again.load_state_dict(json.loads(json.dumps(state)))
    rest = list(again)
    again.close()
    check_tokens(written, tuple(WEIGHTS), head + rest)
    assert all(len(b["sample_id"]) == B for b in head + rest)
    assert len(head) + len(rest) == spe  # the rank's batches, as without the break
    # the epoch's samples are the static plan's, each as often (a small source repeats)
    assert Counter(ids(head + rest)) == want
    # so every source's share of the epoch is exactly the plan's
    shares = np.bincount(np.concatenate([b["source"].numpy() for b in head + rest]), minlength=3)
    assert shares.tolist() == np.bincount(decode(np.array(list(want.elements())))[0]).tolist()


def test_two_ranks_read_the_epoch_of_the_static_plan_and_replay_names_the_samples(
    written: dict[str, Written], tmp_path: Path
) -> None:
    n = make(written, rank=0, world_size=2).num_samples
    proc = subprocess.Popen(
        [sys.executable, "-m", "stoker.cli", "coordinator", "--state", str(tmp_path / "state"),
         "--world", "2", "--num-samples", str(n), "--drop-remainder", "--lease-size", "24"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        client = None
        for line in proc.stdout:
            if "serving" in line:
                client = CoordinatorClient(line.split("serving ")[1].split()[0])
                break
        assert client is not None, "the coordinator did not start"
        order: dict[int, list[list[int]]] = {}
        for rank in (0, 1):
            loader = stoker.TokenLoader(
                make(written, rank=rank, world_size=2), 2, coordinator=client
            )
            batches = list(loader)
            check_tokens(written, tuple(WEIGHTS), batches)
            order[rank] = [b["sample_id"].tolist() for b in batches]
            assert len(batches) == make(written, rank=rank, world_size=2).steps_per_epoch
        assert Counter(i for r in order.values() for b in r for i in b) == static_epoch(written, 2)
    finally:
        reap(proc)
    out = subprocess.run(
        [sys.executable, "-m", "stoker.cli", "replay", "--state", str(tmp_path / "state")],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    replayed: dict[int, list[list[int]]] = {0: [], 1: []}
    for line in out.splitlines():
        row = json.loads(line)
        if row["epoch"] == 0:
            replayed[row["rank"]].append(row["sample_ids"])
    assert replayed == order  # the journal alone names every batch's mixture samples


@pytest.mark.parametrize("world", [2, 3])
def test_a_job_killed_mid_epoch_resumes_and_delivers_its_epoch_once(
    written: dict[str, Written], tmp_path: Path, world: int
) -> None:
    """Two ranks (torch.distributed, rank 0 starting the coordinator) killed with SIGKILL
    after step 5; resumed from the state rank 0 saved at step 3, on two ranks or on three
    (elastic: the positions stay those of the plan on two; each rank takes a third of
    what is left, the remainder, at most two samples an epoch, dropped)."""
    mixture = json.dumps({n: [str(written[n].path), w] for n, w in WEIGHTS.items()})
    common = ["--mixture", mixture, "--seq-len", str(SEQ_LEN), "--batch", str(B),
              "--lease-size", "24"]  # fmt: skip
    state = tmp_path / "state.json"
    run1, run2 = tmp_path / "run1", tmp_path / "run2"
    run1.mkdir(), run2.mkdir()
    SAVE, STOP = 3, 5
    procs = launch(2, run1, [*common, "--save-at", str(SAVE), "--state", str(state),
                             "--stop-at", str(STOP), "--workers", "2"])  # fmt: skip
    for p in procs:
        assert p.stdout is not None
        assert p.stdout.readline().startswith("stopped"), "a rank did not reach the crash point"
    for p in procs:
        p.send_signal(signal.SIGKILL)
        reap(p)
    procs = launch(world, run2, [*common, "--resume", str(state), "--epochs", "2"])
    for p in procs:
        out, _ = p.communicate(timeout=300)
        assert p.returncode == 0, out
    first, second = steps(run1, 2), steps(run2, world)
    trained = [i for r in first for s in first[r] if s["step"] <= SAVE for i in s["ids"]]
    epoch0 = trained + [i for r in second for s in second[r] if s["epoch"] == 0 for i in s["ids"]]
    epoch1 = [i for r in second for s in second[r] if s["epoch"] == 1 for i in s["ids"]]
    for e, got in ((0, Counter(epoch0)), (1, Counter(epoch1))):
        want = static_epoch(written, 2, e)  # the plan on two ranks, either way
        assert not got - want  # nothing twice, nothing from elsewhere
        assert sum((want - got).values()) == (
            0 if world == 2 else sum(want.values()) - sum(got.values())
        )
        assert sum((want - got).values()) < world  # lost: at most the remainder
    for e in (0, 1):  # every rank took the same number of steps in each epoch
        assert len({sum(s["epoch"] == e for s in second[r]) for r in range(world)}) == 1


def test_a_restore_that_changes_the_plan_is_refused_naming_the_change(
    written: dict[str, Written], tmp_path: Path
) -> None:
    _, state = checkpointed(written, tmp_path / "s", 1)
    fewer = {"web": 0.5, "code": 0.5}  # a source removed: not the plan's positions
    with pytest.raises(stoker.StateError, match="other sources"):
        stoker.TokenLoader(make(written, fewer), 0, coordinator="rank0").load_state_dict(state)
    # another world: the positions stay those of the plan on one rank (its epoch too)
    wider = make(written, rank=0, world_size=2)
    stoker.TokenLoader(wider, 0, coordinator="rank0").load_state_dict(state)
    assert (wider.num_samples, wider.steps_per_epoch) == (
        make(written).num_samples,
        make(written).steps_per_epoch,
    )
    # ... unless steps_per_epoch is given and differs: that is another plan
    other_steps = make(written, rank=0, world_size=2, steps_per_epoch=5)
    with pytest.raises(stoker.StateError, match="another number of steps an epoch, 1 ranks"):
        stoker.TokenLoader(other_steps, 0, coordinator="rank0").load_state_dict(state)


def test_per_source_figures_follow_the_schedule_under_a_coordinator(
    written: dict[str, Written], tmp_path: Path
) -> None:
    schedule = stoker.WeightSchedule.of([(0, {"web": 1, "code": 1}), (6, {"web": 3, "code": 1})])
    loader = stoker.TokenLoader(
        make(written, schedule), 0, coordinator="rank0", coordinator_state=str(tmp_path / "s")
    )
    it = iter(loader)
    for _ in range(6):
        next(it)
    assert loader.stats()["sources"]["web"]["target"] == pytest.approx(0.5)
    next(it)  # step 6: the second point's weights
    assert loader.stats()["sources"]["web"]["target"] == pytest.approx(0.75)
    it.close()
    loader.close()


def test_through_the_device_tier_the_state_is_what_training_took(
    written: dict[str, Written], tmp_path: Path
) -> None:
    """The device tier's copy path (it runs without CUDA too) over a coordinator-fed
    mixture: what it read ahead is not in the state, so the epoch still comes once."""
    loader = stoker.TokenLoader(
        make(written), 2, device="cpu", coordinator="rank0", coordinator_state=str(tmp_path / "a")
    )
    it = iter(loader)
    head = [next(it) for _ in range(7)]
    state = loader.state_dict()
    assert state["batches"] == 7
    it.close()
    loader.close()
    # closed: no thread of the tier is left reading (a coordinator-fed pass is kept)
    assert not [t for t in threading.enumerate() if t.name == "stoker-prefetch" and t.is_alive()]
    again = stoker.TokenLoader(
        make(written), 0, coordinator="rank0", coordinator_state=str(tmp_path / "b")
    )
    again.load_state_dict(state)
    rest = list(again)
    again.close()
    check_tokens(written, tuple(WEIGHTS), head + rest)
    assert Counter(ids(head + rest)) == static_epoch(written, 1)


def test_a_mixture_read_before_maps_a_coordinators_positions_from_the_start(
    written: dict[str, Written], tmp_path: Path
) -> None:
    """A mixture iterated statically first (its own progress moved on), then fed by a
    coordinator: the coordinator's epoch is the plan's from step 0, as every rank maps it."""
    mix = make(written)
    it = iter(stoker.TokenLoader(mix, 0))
    for _ in range(3):
        next(it)
    it.close()
    loader = stoker.TokenLoader(mix, 0, coordinator="rank0", coordinator_state=str(tmp_path))
    got = list(loader)
    loader.close()
    assert Counter(ids(got)) == static_epoch(written, 1)


def test_new_weights_at_a_restore_hold_from_the_next_epoch(
    written: dict[str, Written], tmp_path: Path
) -> None:
    """Restored with other weights: the rest of the epoch is the old plan's (its positions
    were being handed out), the next epoch the new weights', each source going on from
    where it stood: the samples a static run restored with the new weights at that
    epoch's start reads; `stoker replay` names them too."""
    new = {"web": 0.2, "code": 0.2, "book": 0.6}
    head, state = checkpointed(written, tmp_path / "a")
    again = stoker.TokenLoader(
        make(written, new), 0, coordinator="rank0", coordinator_state=str(tmp_path / "b")
    )
    again.load_state_dict(state)
    # every rank's steps in one walk map as the positions do, on both sides of the change
    # (what a node's locality report maps through)
    joined, spe = again.dataset.lease_stream(), again.dataset.steps_per_epoch
    for e in (0, 1):
        pos = e * spe * B + np.arange(spe * B)
        np.testing.assert_array_equal(
            joined.step_ids(e * spe, spe).reshape(-1), joined.samples(pos)
        )
    with pytest.raises(IndexError, match="cross"):
        joined.step_ids(spe - 1, 2)
    rest = list(again)
    # the figures' targets follow the plan: the old weights to the epoch's end, then the new
    assert again.stats()["sources"]["book"]["target"] == pytest.approx(0.2)
    second = list(again)
    assert again.stats()["sources"]["book"]["target"] == pytest.approx(0.6)
    again.close()
    check_tokens(written, tuple(WEIGHTS), head + rest + second)
    assert Counter(ids(head + rest)) == static_epoch(written, 1)  # the old weights' epoch
    old = stoker.TokenLoader(make(written), 0)
    list(old)  # a static run of the old weights to the epoch's end...
    switched = stoker.TokenLoader(make(written, new), 0)
    switched.load_state_dict(old.state_dict())  # ... restored with the new weights
    assert Counter(ids(second)) == Counter(ids(list(switched)))
    out = subprocess.run(
        [sys.executable, "-m", "stoker.cli", "replay", "--state", str(tmp_path / "b")],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    replayed = [json.loads(line) for line in out.splitlines()]
    assert [r["sample_ids"] for r in replayed if r["epoch"] == 1] == [
        b["sample_id"].tolist() for b in second
    ]


def test_a_restore_names_sources_in_any_order_and_a_refused_one_changes_nothing(
    written: dict[str, Written], tmp_path: Path
) -> None:
    """The same weights written in another order are the same plan; new weights in
    another order still read each source's own rows. A state refused (its batch count
    edited) leaves the mixture as it was."""
    head, state = checkpointed(written, tmp_path / "a")
    reordered = {n: WEIGHTS[n] for n in reversed(WEIGHTS)}
    again = stoker.TokenLoader(make(written, reordered), 0, coordinator="rank0",
                               coordinator_state=str(tmp_path / "b"))  # fmt: skip
    again.load_state_dict(state)
    rest = list(again)
    again.close()
    names = tuple(reordered)  # the rows' `source` is an index into the new order
    check_tokens(written, names, rest)
    want = Counter(named(decode(np.array(list(static_epoch(written, 1).elements()))), WEIGHTS))
    got = Counter(named(decode(np.array(ids(head))), WEIGHTS))
    got.update(named(decode(np.array(ids(rest))), names))
    assert got == want  # the run's epoch, source by source
    new = {"book": 0.6, "code": 0.2, "web": 0.2}
    switched = stoker.TokenLoader(make(written, new), 0, coordinator="rank0",
                                  coordinator_state=str(tmp_path / "c"))  # fmt: skip
    switched.load_state_dict(state)
    tail = [*switched, *switched]  # the rest of the epoch, and the next (new weights)
    switched.close()
    check_tokens(written, tuple(new), tail)
    edited = json.loads(json.dumps(state))
    edited["batches"] += 1  # (outside the snapshot's hash: refused by the checks after it)
    wider = make(written, rank=0, world_size=2)
    before = (wider.num_samples, wider.steps_per_epoch, wider.stream_identity())
    with pytest.raises(stoker.StateError):
        stoker.TokenLoader(wider, 0, coordinator="rank0").load_state_dict(edited)
    assert (wider.num_samples, wider.steps_per_epoch, wider.stream_identity()) == before


def test_through_a_node_agent_a_mixture_reports_the_positions_its_node_holds(
    written: dict[str, Written], tmp_path: Path, agents: Agents
) -> None:
    cache = tmp_path / "cache"
    agents.start(cache)
    client = agents.client(cache)

    def dataset(n: str) -> stoker.TokenDataset:
        seed = list(written).index(n)  # (as test_mixture's sources: the same plan)
        return stoker.TokenDataset(
            str(written[n].path), SEQ_LEN, shard_size=5, window_shards=3, seed=seed, agent=client
        )

    def mixture(weights: dict[str, float]) -> stoker.Mixture:
        return stoker.Mixture({n: dataset(n) for n in weights}, weights, batch_size=B)

    mix = mixture(WEIGHTS)
    local = mix.locality()["local"]
    assert mix.locality()["node"] == client.node
    assert local(0) == []  # a fresh agent holds nothing
    # one source read whole through the agent: a mixture mostly of it is local to this
    # node, one mostly of the others is not
    assert sum(len(b["sample_id"]) for b in stoker.TokenLoader(dataset("web"), 0)) > 0
    most = mixture({"web": 0.8, "code": 0.1, "book": 0.1})
    assert most.locality()["local"](0) == [(0, most.num_samples)]
    assert mixture({"web": 0.2, "code": 0.4, "book": 0.4}).locality()["local"](0) == []
    # fed by a coordinator (locality on), the consumers report and the epoch comes once
    state = tmp_path / "state"
    loader = stoker.TokenLoader(mix, 2, coordinator="rank0", coordinator_state=str(state))
    try:
        got = ids(list(loader))
    finally:
        loader.close()
    assert Counter(got) == static_epoch(written, 1)
    events = [
        json.loads(line)
        for f in sorted(state.rglob("*.jsonl"))
        for line in f.read_text().splitlines()
        if line.startswith("{")
    ]
    reports = [e["args"]["ranges"] for e in events if e.get("kind") == "local"]
    assert reports and all(0 <= a < b <= mix.num_samples for r in reports for a, b in r)
    # every source's blocks read now: every window of the next epoch is local
    N = mix.num_samples
    assert local(1) == [(N, 2 * N)]


def test_a_state_taken_before_any_batch_restores_as_a_fresh_start_on_another_plan(
    written: dict[str, Written], tmp_path: Path
) -> None:
    # the coordinator's snapshot then holds no stream and an epoch set sized for its own
    # plan; nothing was handed out, so it restores anywhere as a fresh start
    first = stoker.TokenLoader(
        make(written), 0, coordinator="rank0", coordinator_state=str(tmp_path / "a")
    )
    state = first.state_at(0, 0)
    first.close()
    assert state["snapshot"]["stream"] == "" and state["snapshot"]["consumed"] == []
    spe = make(written).steps_per_epoch // 2  # half the positions an epoch
    other = make(written, steps_per_epoch=spe)
    loader = stoker.TokenLoader(
        other, 0, coordinator="rank0", coordinator_state=str(tmp_path / "b")
    )
    loader.load_state_dict(state)
    try:
        got = ids(list(loader))
    finally:
        loader.close()
    fresh = stoker.TokenLoader(make(written, steps_per_epoch=spe), 0)
    assert Counter(got) == Counter(ids(list(fresh)))
    # a state whose snapshot was changed is still refused
    bad = json.loads(json.dumps(state))
    bad["snapshot"]["consumed"] = [[0, 1]]
    with pytest.raises(stoker.StateError, match="changed"):
        stoker.TokenLoader(make(written), 0, coordinator="rank0").load_state_dict(bad)
