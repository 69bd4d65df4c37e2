"""Batches confirmed through the lease table: what each rank hands out, checkpoints of it,
and restores of those checkpoints on another world, against a model of the loader."""

from __future__ import annotations

import json
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as hs

from stoker.coordinator import delivery, image
from stoker.coordinator.leases import WAIT, Config, LeaseError, LeaseTable

CFG = Config(lease_size=6, timeout=10.0, readahead_seconds=1.0, min_readahead=3, min_steal=2)


def members(ranges) -> list[int]:
    return [p for a, b in ranges for p in range(a, b)]


@given(
    ranges=hs.lists(hs.tuples(hs.integers(0, 50), hs.integers(1, 9)), max_size=6),
    size=hs.integers(1, 7),
)
def test_cut_keeps_rows_and_order(ranges, size) -> None:
    rs = [(a, a + n) for a, n in ranges]
    out = delivery.cut(rs, size)
    assert [p for b in out for p in members(b)] == members(rs)
    assert all(delivery.rows(b) == size for b in out[:-1])
    assert not out or 1 <= delivery.rows(out[-1]) <= size


def test_full_batches_first_then_the_held_rows_recut() -> None:
    log = [[(0, 3)], [(3, 4)], [(10, 13)], [(20, 21), (30, 31)], [(40, 43)]]
    assert delivery.handed_out(log, 3, final=False) == [[(0, 3)], [(10, 13)], [(40, 43)]]
    assert delivery.handed_out(log, 3, final=True)[3:] == [[(3, 4), (20, 21), (30, 31)]]
    assert delivery.first(log, 3, 4, final=False) is None  # the 4th is not known yet
    assert members(delivery.first(log, 3, 2, final=False)) == [0, 1, 2, 10, 11, 12]


class Sim:
    """Ranks whose consumers read leases and whose main process confirms batches in the
    order they arrive, handing them out by the loader's rule (an independent model)."""

    def __init__(self, table: LeaseTable, size: int, per_rank: int) -> None:
        self.t = table
        self.size = size
        self.now = 0.0
        self.consumers = {
            r: [table.register(r, w, self.now) for w in range(per_rank)] for r in range(table.world)
        }
        self.reading: dict[int, dict[int, int]] = {}  # consumer -> lease -> read position
        self.queue: dict[int, list[tuple[int, list]]] = {r: [] for r in range(table.world)}
        self.seq = Counter()
        self.handed: dict[int, list[list[int]]] = {r: [] for r in range(table.world)}
        self.held: dict[int, list[int]] = {r: [] for r in range(table.world)}
        self.finished: set[int] = set()

    def tick(self) -> float:
        self.now += 0.1
        return self.now

    def produce(self, cid: int) -> bool:
        """One batch from ``cid``'s leases (False when it gets nothing more)."""
        t, rank = self.t, self.t.consumers[cid].rank
        held = self.reading.setdefault(cid, {})
        segs: list = []
        have = 0
        while have < self.size:
            lease = next(
                (k for k in sorted(held) if k in t.leases and held[k] < t.leases[k].end), None
            )
            if lease is None:
                g = t.request(cid, self.tick(), sorted(held))
                if g is None or g is WAIT:
                    break
                held[g.lease] = g.start
                continue
            ls = t.leases[lease]
            if held[lease] >= ls.horizon:
                t.heartbeat(cid, self.tick(), lease, held[lease])
                if held[lease] >= t.leases[lease].horizon:
                    break
                continue
            upto = min(ls.horizon, ls.end, held[lease] + self.size - have)
            segs.append([lease, upto, upto - held[lease]])
            have += upto - held[lease]
            held[lease] = upto
        if segs:
            self.queue[rank].append((cid, segs))
        return bool(segs)

    def confirm(self, rank: int) -> None:
        cid, segs = self.queue[rank].pop(0)
        answers = self.t.confirm_batch(cid, self.seq[rank], segs, self.size, self.tick())
        self.seq[rank] += 1
        rows = [
            p
            for (_, upto, n), a in zip(segs, answers)
            if a is not None
            for p in range(upto - n, upto)
        ]
        if len(rows) == self.size:
            self.handed[rank].append(rows)
        else:
            self.held[rank].extend(rows)

    def finish(self, rank: int) -> None:
        rows = self.held[rank]
        self.handed[rank] += [rows[i : i + self.size] for i in range(0, len(rows), self.size)]
        self.held[rank] = []
        self.finished.add(rank)

    def kill(self, cid: int) -> None:
        """``cid`` goes silent until it expires; everyone else stays in touch."""
        self.now += CFG.timeout + 1
        for c in self.t.consumers.values():
            if c.alive and c.id != cid:
                self.t.heartbeat(c.id, self.now)
        self.t.expire(self.now)
        for r, cs in self.consumers.items():
            if cid in cs:
                cs.remove(cid)
                cs.append(self.t.register(r, 9, self.now))

    def drain(self, data) -> None:
        while True:
            progressed = False
            for r, cs in self.consumers.items():
                for cid in cs:
                    progressed |= self.produce(cid)
                while self.queue[r]:
                    self.confirm(r)
                    progressed = True
            if not progressed:
                break
        for r in self.consumers:
            self.finish(r)


@settings(max_examples=150, deadline=None)
@given(
    world=hs.integers(1, 3),
    per_rank=hs.integers(1, 2),
    size=hs.integers(1, 5),
    n=hs.integers(0, 60),
    new_world=hs.integers(1, 4),
    data=hs.data(),
)
def test_checkpoint_then_restore_on_another_world_is_exactly_once(
    world, per_rank, size, n, new_world, data
) -> None:
    t = LeaseTable(0, [(5, 5 + n)], world, CFG)
    sim = Sim(t, size, per_rank)
    for _ in range(data.draw(hs.integers(0, 40))):
        what = data.draw(hs.sampled_from(["produce", "confirm", "kill"]))
        if what == "produce":
            cid = data.draw(hs.sampled_from([c for cs in sim.consumers.values() for c in cs]))
            sim.produce(cid)
        elif what == "confirm":
            ranks = [r for r, q in sim.queue.items() if q]
            if ranks:
                sim.confirm(data.draw(hs.sampled_from(ranks)))
        else:
            sim.kill(data.draw(hs.sampled_from([c for cs in sim.consumers.values() for c in cs])))
    # every rank trained on at least k batches (a rank may be further along)
    k = data.draw(hs.integers(0, min(len(h) for h in sim.handed.values())))
    snap = t.snapshot_at(k)
    expect = sorted(p for r in sim.handed for b in sim.handed[r][:k] for p in b)
    assert members(snap["consumed"]) == expect
    # the rank's log says the same as the model, batch for batch
    for r in range(world):
        assert [members(b) for b in t.handed_out(r)][: len(sim.handed[r])] == sim.handed[r]
    # a replayed journal checkpoints the same
    assert LeaseTable.replay(t.events, CFG).snapshot_at(k) == snap
    # and so does the table's image (its batch logs and kept answers included)
    back = image.load(json.loads(json.dumps(image.dump(t))))
    assert {k: v for k, v in vars(back).items() if k != "events"} == {
        k: v for k, v in vars(t).items() if k != "events"
    }

    # the job goes down and comes back on another world from the checkpoint
    t2 = LeaseTable.restore(snap, new_world, CFG, origin="x", first_ids=t.next_ids)
    sim2 = Sim(t2, size, 1)
    sim2.drain(data)
    got = Counter(expect)
    for r in sim2.handed:
        got.update(p for b in sim2.handed[r] for p in b)
    assert max(got.values(), default=1) == 1  # nothing twice
    left = members(t2.leftover())
    assert sorted(list(got) + left) == list(range(5, 5 + n))  # the rest carries over
    # equal batches per rank after the restore, and a final checkpoint covers everything
    assert len({len(h) for h in sim2.handed.values()}) == 1
    full = t2.snapshot_at(k + max(len(h) for h in sim2.handed.values()))  # steps go on
    assert sorted(members(full["consumed"])) == sorted(got)


def test_a_retried_batch_gets_its_first_answer_and_gaps_are_refused() -> None:
    t = LeaseTable(0, [(0, 20)], 1, CFG)
    c = t.register(0, 0, 0.0)
    g = t.request(c, 0.0)
    assert g.start == 0 and g.horizon == 3
    first = t.confirm_batch(c, 0, [[g.lease, 1, 1]], 2, 0.1)
    assert first == [False]
    assert t.confirm_batch(c, 0, [[g.lease, 1, 1]], 2, 0.2) == first  # lost answer, retried
    assert t.log[0] == [[(0, 1)]]
    with pytest.raises(LeaseError) as err:
        t.confirm_batch(c, 5, [[g.lease, 2, 1]], 2, 0.3)
    assert err.value.code == "bad_sequence"
    # rows that skip a position (2 without 1) would lose it: refused, logged as empty
    assert t.confirm_batch(c, 1, [[g.lease, 3, 1]], 2, 0.3) == [None]
    assert t.log[0][1] == [] and t.leases[g.lease].confirmed == 1
    with pytest.raises(LeaseError) as err:
        t.snapshot_at(3)
    assert err.value.code == "not_ready"


@settings(max_examples=150, deadline=None)
@given(
    world=hs.integers(1, 3),
    per_rank=hs.integers(1, 2),
    size=hs.integers(1, 5),
    n=hs.integers(0, 60),
    data=hs.data(),
)
def test_runs_of_batches_confirmed_in_one_call_log_what_one_call_each_does(
    world, per_rank, size, n, data
) -> None:
    """The Confirmer sends a run of a consumer's full batches as one call
    (``merge_runs``): the table's answers (``split_answers``), its log and its journal
    come out as if each batch had been confirmed alone."""
    from stoker.coordinator.client import ConfirmCall
    from stoker.coordinator.consumer import merge_runs, split_answers

    t = LeaseTable(0, [(5, 5 + n)], world, CFG)
    sim = Sim(t, size, per_rank)
    for _ in range(data.draw(hs.integers(0, 60))):
        what = data.draw(hs.sampled_from(["produce", "produce", "confirm", "kill"]))
        cids = [c for cs in sim.consumers.values() for c in cs]
        if what == "produce":
            sim.produce(data.draw(hs.sampled_from(cids)))
        elif what == "confirm":
            for r, q in sim.queue.items():
                while q:
                    sim.confirm(r)
        else:
            sim.kill(data.draw(hs.sampled_from(cids)))
    # the same calls again, each run of batch events between other events as one message
    twin = LeaseTable(0, [(5, 5 + n)], world, CFG)
    calls: list[ConfirmCall] = []
    times: list[float] = []

    def send() -> None:
        merged, parts = merge_runs(calls)
        assert len(merged) <= len(calls)
        # each call at its run's last batch's time: the consumer's rate comes out the same
        at = {batch[0][0]: when for batch, when in zip(parts, times, strict=True)}
        got = [
            twin.confirm_batch(
                m.consumer, m.seq, [list(s) for s in m.segments], m.batch_size, at[i], m.count
            )
            for i, m in enumerate(merged)
        ]
        rank = {c.consumer: t.consumers[c.consumer].rank for c in calls}
        for c, a in zip(calls, split_answers(got, parts), strict=True):
            assert a == t._answers[rank[c.consumer]][c.seq]
        calls.clear()
        times.clear()

    for ev in t.events[1:]:
        if ev.kind == "batch":
            a = ev.args
            segs = [tuple(s) for s in a["segments"]]
            calls.append(ConfirmCall(a["consumer"], 0, a["seq"], segs, a["size"]))
            times.append(ev.now)
            continue
        send()
        twin.apply(ev)
    send()

    # batch for batch the same positions (a merged call may join a lease's two pieces)
    def positions(table: LeaseTable, r: int) -> list[list[int]]:
        return [members(b) for b in table.log[r]]

    for r in range(world):
        assert positions(twin, r) == positions(t, r)
        assert [members(b) for b in twin.handed_out(r)] == [members(b) for b in t.handed_out(r)]
    assert twin.snapshot() == t.snapshot()
    replayed = LeaseTable.replay(twin.events, CFG)  # its journal replays the same
    assert all(positions(replayed, r) == positions(t, r) for r in range(world))
