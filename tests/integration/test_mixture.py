"""stoker.Mixture: several token datasets at set weights, through every static reader,
with a small exact state."""

from __future__ import annotations

import json
from fractions import Fraction

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

import stoker
from stoker.mixture.stream import decode

from .helpers import Written, write_dataset

SEQ_LEN = 16
BATCH = 4
WEIGHTS = {"web": 0.5, "code": 0.3, "book": 0.2}


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Written]:
    root = tmp_path_factory.mktemp("mixture")
    docs = {"web": 200, "code": 60, "book": 30}
    return {
        n: write_dataset(root / n, num_docs=d, seed=i, block_tokens=512)
        for i, (n, d) in enumerate(docs.items())
    }


def sources(
    written: dict[str, Written], names: list[str] | None = None
) -> dict[str, stoker.TokenDataset]:
    return {
        n: stoker.TokenDataset(
            str(written[n].path),
            SEQ_LEN,
            shard_size=5,
            window_shards=3,
            seed=list(written).index(n),
        )
        for n in names or list(written)
    }


def make(written: dict[str, Written], weights: object = None, **kw: object) -> stoker.Mixture:
    w = weights if weights is not None else WEIGHTS
    names = list(w.names) if isinstance(w, stoker.WeightSchedule) else list(w)  # type: ignore[attr-defined]
    return stoker.Mixture(sources(written, names), w, batch_size=BATCH, **kw)  # type: ignore[arg-type]


def ids_of(batches: list[dict]) -> list[list[int]]:
    return [b["sample_id"].tolist() for b in batches]


def check_tokens(written: dict[str, Written], names: tuple[str, ...], batches: list[dict]) -> None:
    """Every row's tokens and mask are its source's sample, and ``source`` names it."""
    for b in batches:
        src, sid = decode(b["sample_id"].numpy())
        np.testing.assert_array_equal(b["source"].numpy(), src)
        for i in range(len(sid)):
            tokens, mask = written[names[src[i]]].sample(int(sid[i]), SEQ_LEN)
            np.testing.assert_array_equal(b["tokens"][i].numpy(), tokens)
            np.testing.assert_array_equal(b["doc_start_mask"][i].numpy(), mask)


def test_every_reader_gives_the_same_batches_of_the_right_samples(
    written: dict[str, Written],
) -> None:
    ref = list(stoker.TokenLoader(make(written), 0))
    check_tokens(written, tuple(WEIGHTS), ref)
    assert all(len(b["sample_id"]) == BATCH for b in ref)
    assert len(ref) == make(written).steps_per_epoch
    for nw in (1, 2):
        assert ids_of(list(stoker.TokenLoader(make(written), nw))) == ids_of(ref)
    for nw in (0, 2):
        got = list(DataLoader(make(written), batch_size=BATCH, num_workers=nw))
        assert ids_of(got) == ids_of(ref)


def test_realised_share_stays_within_one_sample_of_the_target(written: dict[str, Written]) -> None:
    batches = list(stoker.TokenLoader(make(written), 2))
    counts = np.zeros(3, dtype=np.int64)
    target = [Fraction(5, 10), Fraction(3, 10), Fraction(2, 10)]
    for n, b in enumerate(batches, 1):
        counts += np.bincount(b["source"].numpy(), minlength=3)
        for i in range(3):
            assert abs(counts[i] - target[i] * n * BATCH) < 1, (n, counts.tolist())


def test_each_source_runs_its_own_epochs_each_sample_once_an_epoch(
    written: dict[str, Written],
) -> None:
    mix = make(written)
    loader = stoker.TokenLoader(mix, 2)
    taken: dict[int, list[int]] = {0: [], 1: [], 2: []}
    for _ in range(2):  # two mixture epochs: the small sources run through several of theirs
        for b in loader:
            src, sid = decode(b["sample_id"].numpy())
            for s, i in zip(src.tolist(), sid.tolist(), strict=True):
                taken[s].append(i)
    for s, name in enumerate(WEIGHTS):
        size = written[name].num_samples(SEQ_LEN)
        ids = taken[s]
        assert len(ids) > size or s == 0
        full = len(ids) // size
        for e in range(full):  # every whole epoch of the source is a permutation
            assert sorted(ids[e * size : (e + 1) * size]) == list(range(size)), (name, e)
        if full >= 2:  # a fresh order each epoch
            assert ids[:size] != ids[size : 2 * size]
        rest = ids[full * size :]
        assert len(set(rest)) == len(rest)


@pytest.mark.parametrize(("before", "after"), [(0, 2), (2, 0), (2, 2)])
def test_resume_is_exact_and_the_state_small(
    written: dict[str, Written], before: int, after: int
) -> None:
    ref = ids_of(list(stoker.TokenLoader(make(written), 0)))
    loader = stoker.TokenLoader(make(written), before)
    it = iter(loader)
    taken = [next(it)["sample_id"].tolist() for _ in range(150)]
    state = loader.state_dict()
    it.close()
    early = stoker.TokenLoader(make(written), 0)
    it = iter(early)
    next(it)
    small = early.state_dict()
    it.close()
    assert len(json.dumps(state)) <= len(json.dumps(small)) + 16  # O(1) in the position
    resumed = stoker.TokenLoader(make(written), after)
    resumed.load_state_dict(json.loads(json.dumps(state)))
    assert taken + ids_of(list(resumed)) == ref


def test_dataloader_worker_state_resumes_mid_epoch(written: dict[str, Written]) -> None:
    """Iterated sample by sample in this process (as a DataLoader worker reads), broken
    off mid-step."""
    ref = [x["sample_id"] for x in make(written)]
    ds = make(written)
    it = iter(ds)
    head = [next(it)["sample_id"] for _ in range(37)]  # not a whole step
    state = ds.state_dict()
    del it
    again = make(written)
    again.load_state_dict(state)
    assert head + [x["sample_id"] for x in again] == ref


def per_source(batches: list[dict]) -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for b in batches:
        src, sid = decode(b["sample_id"].numpy())
        for s, i in zip(src.tolist(), sid.tolist(), strict=True):
            out.setdefault(s, []).append(i)
    return out


def test_new_weights_at_a_restore_continue_every_source(written: dict[str, Written]) -> None:
    loader = stoker.TokenLoader(make(written), 0)
    it = iter(loader)
    head = [next(it) for _ in range(60)]
    state = loader.state_dict()
    it.close()
    new = {"web": 0.2, "code": 0.2, "book": 0.6}
    resumed = stoker.TokenLoader(make(written, new), 2)
    resumed.load_state_dict(state)
    tail = list(resumed)
    # the same run as one that had kept going, source by source: each continues its order
    straight = per_source(list(stoker.TokenLoader(make(written), 0)))
    both = per_source(head + tail)
    for s in range(3):
        n = min(len(both[s]), len(straight[s]))
        size = written[list(WEIGHTS)[s]].num_samples(SEQ_LEN)
        n = min(n, size)  # the source's first epoch: one order, whatever the weights
        assert both[s][:n] == straight[s][:n]
    # the new weights from the restore on, within a sample of their targets
    counts = np.zeros(3, dtype=np.int64)
    for k, b in enumerate(tail, 1):
        counts += np.bincount(b["source"].numpy(), minlength=3)
        for i, w in enumerate((0.2, 0.2, 0.6)):
            assert abs(counts[i] - Fraction(w) * k * BATCH) < 1


def test_a_source_added_or_removed_at_a_restore(written: dict[str, Written]) -> None:
    two = {"web": 0.6, "code": 0.4}
    loader = stoker.TokenLoader(make(written, two), 0)
    it = iter(loader)
    head = [next(it) for _ in range(30)]
    state = loader.state_dict()
    it.close()
    resumed = stoker.TokenLoader(make(written, WEIGHTS), 0)  # book added
    resumed.load_state_dict(state)
    tail = list(resumed)
    names = tuple(WEIGHTS)
    check_tokens(written, names, tail)
    before = per_source(head)  # indices of the two-source mixture: web 0, code 1
    after = per_source(tail)
    for s in (0, 1):  # web and code continue, nothing of their first epoch twice
        size = written[names[s]].num_samples(SEQ_LEN)
        run = (before[s] + after[s])[:size]
        assert len(set(run)) == len(run)
    book = written["book"].num_samples(SEQ_LEN)
    assert sorted(after[2][:book]) == list(range(book))  # from its beginning
    # and a source removed: the state of three restores into two
    loader = stoker.TokenLoader(make(written), 0)
    it = iter(loader)
    [next(it) for _ in range(10)]
    state = loader.state_dict()
    it.close()
    fewer = stoker.TokenLoader(make(written, {"book": 1, "code": 1}), 0)
    fewer.load_state_dict(state)
    got = list(fewer)
    assert set(np.concatenate([b["source"].numpy() for b in got]).tolist()) == {0, 1}


def test_ranks_share_each_step_without_overlap(written: dict[str, Written]) -> None:
    world = 3
    ranks = [
        ids_of(list(stoker.TokenLoader(make(written, rank=r, world_size=world), 0)))
        for r in range(world)
    ]
    assert len({len(r) for r in ranks}) == 1
    per_step = [[i for r in range(world) for i in ranks[r][s]] for s in range(len(ranks[0]))]
    assert all(len(ids) == len(set(ids)) == BATCH * world for ids in per_step)
    for s, name in enumerate(WEIGHTS):
        first_epoch_once(per_step, s, written[name].num_samples(SEQ_LEN))


def first_epoch_once(per_step: list[list[int]], s: int, size: int) -> None:
    """Source ``s``'s first epoch comes once over the steps (every rank's ids of each):
    no sample twice before the step that ends it, every sample by then."""
    seen: list[int] = []
    for ids in per_step:
        src, sid = decode(np.array(ids))
        mine = sid[src == s].tolist()
        if len(seen) + len(mine) > size:  # this step ends the epoch (and starts the next)
            assert set(range(size)) <= set(seen + mine)
            return
        seen += mine
        assert len(set(seen)) == len(seen), s
    assert len(set(seen)) == len(seen)


@pytest.mark.parametrize(("before", "after"), [(2, 3), (3, 1)])
def test_restore_on_another_world_size(
    written: dict[str, Written], before: int, after: int
) -> None:
    k = 40  # steps before the restore
    states, head = [], []
    for r in range(before):
        loader = stoker.TokenLoader(make(written, rank=r, world_size=before), 0)
        it = iter(loader)
        head.append([next(it)["sample_id"].tolist() for _ in range(k)])
        states.append(loader.state_dict())
        it.close()
    plans = [json.dumps(x["plan"], sort_keys=True) for x in states]
    assert len(set(plans)) == 1  # every rank's state is the same plan
    tail = []
    for r in range(after):
        resumed = stoker.TokenLoader(make(written, rank=r, world_size=after), 0)
        resumed.load_state_dict(json.loads(json.dumps(states[0])))
        tail.append(ids_of(list(resumed)))
    assert len({len(t) for t in tail}) == 1
    steps = [[i for r in range(before) for i in head[r][j]] for j in range(k)]
    steps += [[i for r in range(after) for i in tail[r][j]] for j in range(len(tail[0]))]
    for s, name in enumerate(WEIGHTS):
        first_epoch_once(steps, s, written[name].num_samples(SEQ_LEN))
    # the weights still hold over the whole run, within a sample of the target per stretch
    counts = np.zeros(3, dtype=np.int64)
    for n, ids in enumerate(steps[k:], 1):
        counts += np.bincount(decode(np.array(ids))[0], minlength=3)
        for i, w in enumerate(WEIGHTS.values()):
            assert abs(counts[i] - Fraction(w) * n * BATCH * after) < 1


def test_a_schedule_of_weights(written: dict[str, Written]) -> None:
    schedule = stoker.WeightSchedule.of(
        [(0, {"web": 1, "code": 0, "book": 0}), (20, {"web": 0, "code": 1, "book": 1})]
    )
    batches = list(stoker.TokenLoader(make(written, schedule, steps_per_epoch=40), 0))
    assert len(batches) == 40
    assert all(set(b["source"].tolist()) == {0} for b in batches[:20])
    later = np.concatenate([b["source"].numpy() for b in batches[20:]])
    assert set(later.tolist()) == {1, 2} and abs(int((later == 1).sum()) - 40) <= 1


def test_bad_configurations_and_states_are_refused(written: dict[str, Written]) -> None:
    with pytest.raises(stoker.ConfigError, match="weights name"):
        stoker.Mixture(sources(written), {"web": 1}, batch_size=BATCH)
    other = {
        "a": stoker.TokenDataset(str(written["web"].path), SEQ_LEN),
        "b": stoker.TokenDataset(str(written["code"].path), SEQ_LEN * 2),
    }
    with pytest.raises(stoker.ConfigError, match="same fields"):
        stoker.Mixture(other, {"a": 1, "b": 1}, batch_size=BATCH)
    mix = make(written)
    with pytest.raises(stoker.StateError, match="not a mixture"):
        mix.load_state_dict(sources(written)["web"].state_dict())
    state = make(written).state_dict()
    bad = json.loads(json.dumps(state))
    bad["plan"]["sources"]["web"]["taken"] = 10**9
    with pytest.raises(stoker.StateError, match=r"sources\.web\.taken"):
        make(written).load_state_dict(bad)
    changed = stoker.Mixture(
        {**sources(written), "web": stoker.TokenDataset(str(written["web"].path), SEQ_LEN, seed=9)},
        WEIGHTS,
        batch_size=BATCH,
    )
    with pytest.raises(stoker.StateError, match=r"source 'web'.*seed"):
        changed.load_state_dict(state)


def test_per_source_figures_in_stats_and_prometheus(written: dict[str, Written]) -> None:
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    from stoker.observe.exposition import Collector

    rank, world = 5, 6  # a rank no other test of this process counts under
    loader = stoker.TokenLoader(make(written, rank=rank, world_size=world), 2)
    got = np.concatenate([b["source"].numpy() for b in loader])
    per = loader.stats()["sources"]
    assert set(per) == set(WEIGHTS)
    for i, name in enumerate(WEIGHTS):
        n = int((got == i).sum())
        assert per[name]["samples"] == n
        assert per[name]["tokens"] == n * (SEQ_LEN + 1)
        assert per[name]["share"] == pytest.approx(n / len(got))
        assert per[name]["target"] == pytest.approx(WEIGHTS[name])
    reg = CollectorRegistry()
    reg.register(Collector())
    seen = {}
    for fam in text_string_to_metric_families(generate_latest(reg).decode()):
        for s in fam.samples:
            if s.name == "stoker_loader_source_samples_total" and s.labels["rank"] == str(rank):
                seen[s.labels["source"]] = s.value
    assert seen == {name: per[name]["samples"] for name in WEIGHTS}
    # what `stoker top` reads of them: every source's tokens and target (the names match)
    from stoker.observe import doctor

    ev = doctor.evidence({}, {"here": doctor.parse(generate_latest(reg).decode())}, 1.0)
    assert set(ev.source_tokens_per_s) >= set(WEIGHTS) and set(ev.source_target) >= set(WEIGHTS)
    assert all(ev.source_tokens_per_s[name] >= per[name]["tokens"] for name in WEIGHTS)


@pytest.mark.parametrize("nw", [0, 2])
def test_each_sources_reads_are_timed_and_counted(written: dict[str, Written], nw: int) -> None:
    """What the consumers (this process, or the workers, whose counts travel with their
    batches) read of each source over a whole pass: as many rows as it handed out, and the
    seconds its reader took, in the process's figures and its /metrics."""
    from prometheus_client import CollectorRegistry, generate_latest

    from stoker.observe import doctor
    from stoker.observe.export import with_exported
    from stoker.observe.exposition import Collector
    from stoker.observe.registry import registry

    before = registry().snapshot()["sources"]
    loader = stoker.TokenLoader(make(written), nw)
    got = np.concatenate([b["source"].numpy() for b in loader])
    after = registry().snapshot()["sources"]
    ahead = [0] * len(WEIGHTS)
    if nw == 0:  # the pass's reader is kept for the next, with the rows it read ahead
        ((_, reader),) = loader.dataset._kept._held.values()
        ahead = [a.hi - a.lo for a in reader._ahead]
    for i, name in enumerate(WEIGHTS):
        secs, rows = (a - b for a, b in zip(after[name], before.get(name, (0.0, 0.0)), strict=True))
        assert rows == int((got == i).sum()) + ahead[i]  # every row read handed out, once
        assert secs > 0
    reg = CollectorRegistry()
    reg.register(Collector())
    ev = doctor.evidence({}, {"here": doctor.parse(generate_latest(reg).decode())}, 1.0)
    # /metrics: this process's figures (and those DataLoader workers of earlier tests left)
    total = with_exported(registry().snapshot())[0]["sources"]
    assert ev.source_read_samples == pytest.approx({k: v[1] for k, v in total.items()})
    assert ev.source_read_seconds == pytest.approx({k: v[0] for k, v in total.items()})


def mid_step_state(written: dict[str, Written], samples: int) -> dict:
    ds = make(written)
    it = iter(ds)
    for _ in range(samples):
        next(it)
    return json.loads(json.dumps(ds.state_dict()))


def test_a_state_inside_a_step_restores_exactly_or_is_refused(
    written: dict[str, Written],
) -> None:
    state = mid_step_state(written, 38)  # two samples into step 9
    assert state["consumed"] % BATCH == 2
    with pytest.raises(stoker.StateError, match="inside a step"):
        make(written, {"web": 0.2, "code": 0.2, "book": 0.6}).load_state_dict(state)
    with pytest.raises(stoker.StateError, match="inside a step"):
        make(written, rank=0, world_size=2).load_state_dict(state)
    # other epochs of the same plan: the step's rest, then on
    ref = [x["sample_id"] for x in make(written)][38:]
    other = make(written, steps_per_epoch=50)
    other.load_state_dict(state)
    got = [x["sample_id"] for x in other]
    assert got == ref[: len(got)] and len(got) == 50 * BATCH - 38


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("mixture.web", 5),
        ("mixture.web", ["x"]),
        ("epoch_sets", {"web": [0, [[1e300, 2e300]]]}),
        ("epoch_sets", {"web": [0, [[5, 1]]]}),
        ("epoch_sets", {"web": [0, [[0, 10**9]]]}),
        ("plan.sources.web.epoch", 10**30),
        ("worker", {"worker": True, "num_workers": 2, "yielded": 0}),
        ("worker", {"worker": 5, "num_workers": 2, "yielded": 0}),
        ("worker", {"worker": 0, "num_workers": 2, "yielded": 10**12}),
        ("consumed", 10**12),
        ("epoch", -1),
        ("plan", []),
    ],
)
def test_a_malformed_state_is_a_state_error(
    written: dict[str, Written], field: str, value: object
) -> None:
    state = json.loads(json.dumps(make(written).state_dict()))
    *path, last = field.split(".")
    at = state
    for k in path:
        at = at[k]
    at[last] = value
    for world in (1, 2):  # restored as it was saved, and split again
        with pytest.raises(stoker.StateError):
            make(written, rank=0, world_size=world).load_state_dict(state)


def test_a_mixture_pickles_after_it_planned(written: dict[str, Written]) -> None:
    import pickle

    mix = make(written)
    mix.state_dict()
    next(iter(mix))
    again = pickle.loads(pickle.dumps(mix))
    assert again.state_dict()["plan"] == mix.state_dict()["plan"]


@pytest.mark.parametrize("nw", [0, 2])
def test_the_device_tier_reads_a_mixture_and_its_state_is_what_training_took(
    written: dict[str, Written], nw: int
) -> None:
    """Through the device tier (its copy path, which also runs without CUDA): the same
    batches, rows and ``source`` as the loader alone, and a state taken mid-epoch that
    resumes exactly (what was read ahead into the tier is not counted)."""
    ref = list(stoker.TokenLoader(make(written), 0))
    loader = stoker.TokenLoader(make(written), nw, device="cpu")
    it = iter(loader)
    head = [next(it) for _ in range(11)]
    state = loader.state_dict()
    it.close()
    check_tokens(written, tuple(WEIGHTS), head)
    assert ids_of(head) == ids_of(ref[:11])
    rest = stoker.TokenLoader(make(written), 0)
    rest.load_state_dict(state)
    assert ids_of(head) + ids_of(list(rest)) == ids_of(ref)


def test_a_source_of_small_weight_reads_the_right_samples(written: dict[str, Written]) -> None:
    """Weights of 0.9 / 0.09 / 0.01 make the reader plan far ahead (a source's horizon over
    its weight): a planner's one call then covers more rows than the stream keeps. Every
    batch is still the plan's, and every row its sample."""
    import itertools

    weights = {"web": 0.9, "code": 0.09, "book": 0.01}
    ref = make(written, weights, steps_per_epoch=40_000).stream()
    loader = stoker.TokenLoader(make(written, weights, steps_per_epoch=40_000), 0)
    batches = list(itertools.islice(loader, 40))
    for step, b in enumerate(batches):
        assert b["sample_id"].tolist() == ref.rank_ids(step, 0).tolist(), step
    check_tokens(written, tuple(weights), batches)


@pytest.mark.parametrize(("budget", "each"), [(1, 1), (2, 1), (6, 2), (9, 3)])
def test_the_sources_readers_share_the_decode_budget(
    written: dict[str, Written], budget: int, each: int
) -> None:
    """A mixture's readers decode as many blocks at once as one reader would, shared out
    among its sources (at least one each), and still read every row right."""
    mix = make(written)
    reader = mix.open_reader(decoding=budget)
    try:
        assert [a.reader._threads for a in reader._ahead] == [each] * 3
        ids = mix.stream().samples(np.arange(8 * BATCH))
        reader.plan(ids)
        out = mix.layout.allocate(len(ids))
        out["sample_id"][...] = ids
        reader.fill(ids, out)
    finally:
        reader.close()
    check_tokens(written, tuple(WEIGHTS), [{k: torch.from_numpy(v) for k, v in out.items()}])
