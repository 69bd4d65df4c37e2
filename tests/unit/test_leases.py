"""The coordinator's lease table: a Hypothesis state machine against a model, and examples."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import pytest
from hypothesis import settings
from hypothesis import strategies as hs
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from stoker.coordinator import image
from stoker.coordinator.leases import WAIT, Config, Event, LeaseError, LeaseTable

CFG = Config(lease_size=7, timeout=10.0, readahead_seconds=2.0, min_readahead=5, min_steal=2)


def members(ranges) -> list[int]:
    return [p for a, b in ranges for p in range(a, b)]


class LeaseMachine(RuleBasedStateMachine):
    """Consumers come, read, confirm, go silent; the coordinator restarts or restores."""

    @initialize(
        world=hs.integers(1, 3),
        pieces=hs.lists(hs.tuples(hs.integers(0, 20), hs.integers(1, 30)), min_size=1, max_size=3),
    )
    def start(self, world: int, pieces: list[tuple[int, int]]) -> None:
        epoch_set, cur = [], 0
        for gap, length in pieces:
            epoch_set.append((cur + gap, cur + gap + length))
            cur += gap + length
        # consumers map positions with shuffle windows of 4 positions (locality claims them)
        stream = '{"num_samples": 40, "shard_size": 2, "window_shards": 2}'
        self.table = LeaseTable(3, epoch_set, world, CFG, stream=stream)
        self.initial = set(members(epoch_set))
        self.delivered: Counter[int] = Counter()  # positions that reached training
        self.now = 0.0
        self.image: tuple[str, int] | None = None  # an image of the table, its events then

    def _tick(self, dt: float) -> float:
        self.now += dt
        return self.now

    # -- rules ------------------------------------------------------------------------
    @rule(rank=hs.integers(0, 2), dt=hs.floats(0, 3), node=hs.sampled_from(["", "a", "b"]))
    def register(self, rank: int, dt: float, node: str) -> None:
        if rank >= self.table.world:
            with pytest.raises(LeaseError):
                self.table.register(rank, 0, self._tick(dt), node=node)
            return
        self.table.register(rank, 0, self._tick(dt), node=node)

    @rule(
        data=hs.data(),
        ranges=hs.lists(hs.tuples(hs.integers(0, 60), hs.integers(0, 12)), max_size=3),
    )
    def report_local(self, data, ranges: list[tuple[int, int]]) -> None:
        """A node says which positions its cache holds: later grants prefer them."""
        cid = self._pick(data)
        if cid is None:
            return
        self.table.report_local(cid, [[a, a + n] for a, n in ranges], self.now)
        c = self.table.consumers[cid]
        if not c.node or not self.table.config.locality:
            return
        local = sorted(self.table.local[c.node] + self.table.claimed.get(c.node, []))
        queued_local = [(max(a, la), min(b, lb)) for a, b in self.table.queue
                        for la, lb in local if la < b and a < lb]  # fmt: skip
        if queued_local and self.table.assigned[c.rank] < self.table.quota:
            g = self.table.request(cid, self.now)
            assert g is not None and g is not WAIT
            assert (g.start, g.stolen_from) == (queued_local[0][0], None)  # local ones first

    def _pick(self, data, alive: bool = True) -> int | None:
        ids = sorted(c.id for c in self.table.consumers.values() if c.alive or not alive)
        return data.draw(hs.sampled_from(ids)) if ids else None

    @rule(data=hs.data(), dt=hs.floats(0, 3))
    def request(self, data, dt: float) -> None:
        cid = self._pick(data)
        if cid is None:
            return
        c = self.table.consumers[cid]
        before = {lid: (ls.end, max(ls.horizon, ls.read)) for lid, ls in self.table.leases.items()}
        ahead = data.draw(hs.booleans())  # asked early: from the queue or WAIT, never a steal
        grant = self.table.request(cid, self._tick(dt), ahead=ahead)
        if ahead:
            assert grant is WAIT or (grant is not None and grant.stolen_from is None)
        if grant is None:
            assert self.table.assigned[c.rank] == self.table.quota
        elif grant is not WAIT:
            assert grant.start < grant.end and grant.start <= grant.horizon <= grant.end
            if grant.stolen_from is not None:
                # stolen positions lie beyond the victim's horizon and read position
                victim = [lid for lid, (end, lim) in before.items() if end == grant.end]
                assert victim and before[victim[0]][1] <= grant.start

    @rule(data=hs.data())
    def request_after_a_lost_answer(self, data) -> None:
        """The answer to a grant was lost: the retry (not listing it) gets it again."""
        cid = self._pick(data)
        if cid is None or not self.table.consumers[cid].leases:
            return
        leases = self.table.consumers[cid].leases
        lost = data.draw(hs.sampled_from(leases))
        grant = self.table.request(cid, self.now, held=[x for x in leases if x != lost])
        ls = self.table.leases[lost]
        assert grant is not None and (grant.lease, grant.start, grant.end) == (
            lost,
            ls.confirmed,
            ls.end,
        )
        assert ls.read == ls.confirmed  # it reads the lease again from there
        self.table.heartbeat(cid, self.now, lost, ls.confirmed)

    @rule(data=hs.data(), dt=hs.floats(0, 3), step=hs.integers(0, 8))
    def read(self, data, dt: float, step: int) -> None:
        cid = self._pick(data)
        if cid is None or not self.table.consumers[cid].leases:
            return
        lid = data.draw(hs.sampled_from(self.table.consumers[cid].leases))
        ls = self.table.leases[lid]
        upto = min(ls.read + step, ls.horizon)
        self.table.heartbeat(cid, self._tick(dt), lid, upto)
        with pytest.raises(LeaseError):  # positions never go back
            self.table.heartbeat(cid, self.now, lid, upto - 1)
        with pytest.raises(LeaseError):  # nor past the horizon
            self.table.heartbeat(cid, self.now, lid, self.table.leases[lid].horizon + 1)

    @rule(data=hs.data(), dt=hs.floats(0, 3), step=hs.integers(0, 8))
    def confirm(self, data, dt: float, step: int) -> None:
        cid = self._pick(data)
        if cid is None or not self.table.consumers[cid].leases:
            return
        lid = data.draw(hs.sampled_from(self.table.consumers[cid].leases))
        ls = self.table.leases[lid]
        upto = min(ls.confirmed + step, ls.read)
        first = ls.confirmed
        self.table.confirm(cid, lid, upto, self._tick(dt))
        self.delivered.update(range(first, upto))

    @rule(data=hs.data())
    def confirm_after_expiry_is_refused(self, data) -> None:
        dead = [c for c in self.table.consumers.values() if not c.alive]
        if not dead:
            return
        c = data.draw(hs.sampled_from(dead))
        with pytest.raises(LeaseError) as err:
            self.table.confirm(c.id, 1, 0, self.now)
        assert err.value.code == "expired_consumer"
        with pytest.raises(LeaseError):
            self.table.request(c.id, self.now)

    @rule(dt=hs.floats(0, 3))
    def revive(self, dt: float) -> None:
        self.table.revive(self._tick(dt))
        assert all(c.last_seen == self.now for c in self.table.consumers.values() if c.alive)

    @rule(dt=hs.floats(0, 25))
    def expire(self, dt: float) -> None:
        gone = self.table.expire(self._tick(dt))
        for cid in gone:
            assert not self.table.consumers[cid].alive

    @rule()
    def coordinator_restarts_from_its_journal(self) -> None:
        journal = [Event.from_json(ev.to_json()) for ev in self.table.events]
        replayed = LeaseTable.replay(journal, CFG)
        assert replayed.state() == self.table.state()
        assert len(replayed.events) == len(self.table.events)  # (an image's place holds)
        self.table = replayed

    @rule()
    def coordinator_restarts_from_an_image_and_the_events_after_it(self) -> None:
        """The image taken earlier, loaded, with the events since applied, is the table,
        every attribute of it; an image of it now, through JSON, too."""
        if self.image is not None:
            text, k = self.image
            back = image.load(json.loads(text))
            for ev in self.table.events[k:]:
                back.apply(Event.from_json(ev.to_json()))
            assert everything(back) == everything(self.table)
        self.image = (json.dumps(image.dump(self.table)), len(self.table.events))
        now = image.load(json.loads(self.image[0]))
        assert everything(now) == everything(self.table)

    @precondition(lambda self: self.table.consumed_count > 0)
    @rule(world=hs.integers(1, 3))
    def restore_from_checkpoint_on_another_world(self, world: int) -> None:
        """Training restarts from a checkpoint: what was consumed stays consumed."""
        snap = self.table.snapshot()
        self.image = None  # (of the table before)
        self.table = LeaseTable.restore(snap, world, CFG)
        remaining = self.initial - set(members(snap["consumed"]))
        assert set(members(self.table.queue)) == remaining

    @rule()
    def drain(self) -> None:
        """The consumers so far go silent; one fresh consumer per rank reads to the end."""
        t = self.table
        t.expire(self._tick(CFG.timeout + 1))
        workers = {r: t.register(r, 9, self._tick(0.1)) for r in range(t.world)}
        for _ in range(10_000):
            if t.done:
                break
            for cid in workers.values():
                t.request(cid, self._tick(0.01))
                for lid in list(t.consumers[cid].leases):
                    ls = t.leases[lid]
                    t.heartbeat(cid, self._tick(0.01), lid, ls.horizon)
                    first = ls.confirmed
                    t.confirm(cid, lid, ls.read, self._tick(0.01))
                    self.delivered.update(range(first, ls.read))
        assert t.done
        # exactly once: every position of the epoch reached training once, or is left over
        leftover = set(members(t.leftover()))
        assert len(leftover) < t.world
        assert set(self.delivered) | leftover == self.initial
        assert not set(self.delivered) & leftover

    # -- invariants -----------------------------------------------------------------------
    @invariant()
    def at_most_once(self) -> None:
        assert all(v == 1 for v in self.delivered.values()), self.delivered.most_common(3)

    @invariant()
    def positions_are_partitioned(self) -> None:
        t = self.table
        parts = [members(t.queue), members(t.consumed)]
        parts += [list(range(ls.confirmed, ls.end)) for ls in t.leases.values()]
        flat = [p for part in parts for p in part]
        assert len(flat) == len(set(flat)), "a position is in two places"
        assert set(flat) == self.initial

    @invariant()
    def quotas_hold(self) -> None:
        t = self.table
        assert all(0 <= a <= t.quota for a in t.assigned)
        for rank in range(t.world):
            held = sum(ls.end - ls.start for ls in t.leases.values() if ls.rank == rank)
            assert held <= t.assigned[rank]

    @invariant()
    def horizons_are_ordered(self) -> None:
        for ls in self.table.leases.values():
            assert ls.start <= ls.confirmed <= ls.read <= ls.end
            assert ls.horizon <= ls.end


def everything(t: LeaseTable) -> dict[str, Any]:
    """Every attribute of a table but its event list."""
    return {k: v for k, v in vars(t).items() if k != "events"}


def test_an_image_refuses_a_table_with_an_attribute_it_does_not_know() -> None:
    t = LeaseTable(0, [(0, 10)], 1)
    t.novel = 1  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match="novel"):
        image.dump(t)


LeaseMachine.TestCase.settings = settings(max_examples=250, stateful_step_count=40, deadline=None)
test_lease_table = LeaseMachine.TestCase


def test_equal_counts_per_rank_and_leftover_carries() -> None:
    t = LeaseTable(0, [(0, 103)], world=4, config=CFG)
    consumers = [t.register(r, 0, 0.0) for r in range(4)]
    got = Counter()
    while not t.done:
        for cid in consumers:
            grant = t.request(cid, 1.0)
            if grant is None or grant is WAIT:
                continue
            t.heartbeat(cid, 1.0, grant.lease, grant.horizon)
            ls = t.leases[grant.lease]
            while ls.read < ls.end:
                t.heartbeat(cid, 1.0, ls.id, max(ls.horizon, ls.read))
            got[t.consumers[cid].rank] += ls.end - ls.start
            t.confirm(cid, ls.id, ls.end, 1.0)
    assert set(got.values()) == {25}
    assert sum(b - a for a, b in t.leftover()) == 3


def test_an_idle_consumer_steals_from_the_slowest() -> None:
    cfg = Config(lease_size=100, timeout=60, readahead_seconds=1.0, min_readahead=4)
    t = LeaseTable(0, [(0, 200)], world=1, config=cfg)
    slow, fast = t.register(0, 0, 0.0), t.register(0, 1, 0.0)
    a = t.request(slow, 0.0)
    b = t.request(fast, 0.0)
    assert (a.start, a.end, b.start, b.end) == (0, 100, 100, 200)
    t.heartbeat(slow, 1.0, a.lease, 4)
    t.confirm(slow, a.lease, 4, 1.0)  # consumes 4 positions per second
    for pos in range(4, 100, 4):  # fast reads its whole lease at 100/s
        t.heartbeat(fast, 1.0 + pos / 100, b.lease, min(100 + pos, t.leases[b.lease].horizon))
    t.heartbeat(fast, 2.0, b.lease, t.leases[b.lease].horizon)
    t.confirm(fast, b.lease, t.leases[b.lease].read, 2.0)
    while b.lease in t.leases:
        ls = t.leases[b.lease]
        t.heartbeat(fast, 2.0, b.lease, ls.horizon)
        t.confirm(fast, b.lease, ls.read, 2.0)
    c = t.request(fast, 2.0)
    assert c.stolen_from == slow
    horizon = max(t.leases[a.lease].horizon, t.leases[a.lease].read)
    assert horizon <= c.start and c.end == 100  # the far part of the unread part
    assert t.leases[a.lease].end == c.start
    # sized by the rates: the fast thief takes most of what the slow victim has left
    rs, rf = t.consumers[slow].rate, t.consumers[fast].rate
    assert rf > 5 * rs
    assert 100 - c.start == round((100 - horizon) * rf / (rf + rs))


def test_a_lease_asked_for_ahead_comes_from_the_queue_and_never_by_stealing() -> None:
    cfg = Config(lease_size=100, timeout=60, readahead_seconds=1.0, min_readahead=4)
    t = LeaseTable(0, [(0, 450)], world=1, config=cfg)
    slow, fast = t.register(0, 0, 0.0), t.register(0, 1, 0.0)
    a = t.request(slow, 0.0)
    b = t.request(fast, 0.0)
    c = t.request(fast, 0.0, held=[b.lease], ahead=True)  # 250 queued: a lease each left
    assert (c.start, c.end, c.stolen_from) == (200, 300, None)
    assert t.consumers[fast].leases == [b.lease, c.lease]
    # 150 queued, less than a lease per live consumer: the tail is left to plain requests
    assert t.request(fast, 0.1, held=[b.lease, c.lease], ahead=True) is WAIT
    d = t.request(slow, 0.1, held=[a.lease])
    assert (d.start, d.end) == (300, 400)
    # the queue is empty: asked ahead, it waits (a plain request would steal from slow)
    t2 = LeaseTable(0, [(0, 200)], world=1, config=cfg)
    s2, f2 = t2.register(0, 0, 0.0), t2.register(0, 1, 0.0)
    a2, b2 = t2.request(s2, 0.0), t2.request(f2, 0.0)
    assert t2.request(f2, 0.1, held=[b2.lease], ahead=True) is WAIT
    assert t2.steals == 0 and t2.leases[a2.lease].end == 100
    # a lost ahead grant is granted again first, ahead or not
    again = t.request(fast, 0.2, held=[b.lease], ahead=True)
    assert again is not None and again is not WAIT and again.lease == c.lease
    # the journal replays to the same table
    back = LeaseTable.replay(t.events, cfg)
    assert {k: (v.start, v.end) for k, v in back.leases.items()} == {
        k: (v.start, v.end) for k, v in t.leases.items()
    }
    assert any(e.kind == "request" and e.args.get("ahead") for e in t.events)


def test_the_tail_is_granted_ahead_to_the_only_consumer_that_could_take_it() -> None:
    cfg = Config(lease_size=100, timeout=60, readahead_seconds=1.0, min_readahead=4)
    # one consumer: the 50 left after its lease are its anyway
    t = LeaseTable(0, [(0, 150)], world=1, config=cfg)
    a = t.register(0, 0, 0.0)
    g = t.request(a, 0.0)
    tail = t.request(a, 0.1, held=[g.lease], ahead=True)
    assert tail is not WAIT and (tail.start, tail.end) == (100, 150)
    # two ranks: rank 1 has its quota, so rank 0's consumer is the only taker left
    t = LeaseTable(0, [(0, 300)], world=2, config=cfg)
    r0, r1 = t.register(0, 0, 0.0), t.register(1, 0, 0.0)
    g0 = t.request(r0, 0.0)
    g1 = t.request(r1, 0.0)
    assert t.request(r1, 0.0, held=[g1.lease]) is not WAIT  # rank 1's last 50 (plainly)
    assert t.assigned[1] == t.quota
    got = t.request(r0, 0.1, held=[g0.lease], ahead=True)
    assert got is not WAIT and (got.start, got.end) == (250, 300)
    # ... but while rank 1 could still take from the queue, the tail waits for a plain ask
    t = LeaseTable(0, [(0, 300)], world=2, config=cfg)
    r0, r1 = t.register(0, 0, 0.0), t.register(1, 0, 0.0)
    g0, g1 = t.request(r0, 0.0), t.request(r1, 0.0)
    assert t.request(r0, 0.1, held=[g0.lease], ahead=True) is WAIT
    # a journal written before this rule replays without it (the same WAIT as then)
    t = LeaseTable(0, [(0, 150)], world=1, config=cfg)
    a = t.register(0, 0, 0.0)
    g = t.request(a, 0.0)
    t.request(a, 0.1, held=[g.lease], ahead=True)
    events = list(t.events)
    begin = {k: v for k, v in events[0].args.items() if k != "tail_ahead"}
    events[0] = type(events[0])("begin", 0.0, begin)
    old = LeaseTable.replay(events, cfg)
    assert sorted((v.start, v.end) for v in old.leases.values()) == [(0, 100)]
    new = LeaseTable.replay(t.events, cfg)
    assert sorted((v.start, v.end) for v in new.leases.values()) == [(0, 100), (100, 150)]


def test_silent_consumer_is_requeued_and_its_late_confirm_refused() -> None:
    t = LeaseTable(0, [(0, 50)], world=1, config=CFG)
    a = t.register(0, 0, 0.0)
    g = t.request(a, 0.0)
    t.heartbeat(a, 1.0, g.lease, g.horizon)
    t.confirm(a, g.lease, 2, 1.0)
    assert t.expire(1.0 + CFG.timeout + 0.1) == [a]
    with pytest.raises(LeaseError) as err:
        t.confirm(a, g.lease, 3, 20.0)
    assert err.value.code == "expired_consumer"
    assert t.queue == [(2, 50)]  # the unconfirmed rest of the lease, merged back, first in line
    b = t.register(0, 0, 20.0)
    assert t.request(b, 20.0).start == 2


def test_a_node_keeps_the_shuffle_windows_it_started() -> None:
    """Leases smaller than a window: each node goes on in the windows it began (its reader
    has their blocks) instead of every node touching every window."""
    stream = '{"num_samples": 16, "shard_size": 2, "window_shards": 2}'  # windows of 4
    cfg = Config(lease_size=2, timeout=60, min_readahead=2)
    t = LeaseTable(0, [(0, 16)], 2, cfg, stream=stream)
    a = t.register(0, 0, 0.0, node="a")
    b = t.register(1, 0, 0.0, node="b")
    starts = {"a": [], "b": []}
    for _ in range(4):
        for node, cid in (("a", a), ("b", b)):
            g = t.request(cid, 0.0)
            starts[node].append(g.start)
            t.heartbeat(cid, 0.0, g.lease, g.horizon)
            t.confirm(cid, g.lease, g.end, 0.0)
    windows = {node: {s // 4 for s in ss} for node, ss in starts.items()}
    assert windows["a"].isdisjoint(windows["b"])  # no window read by both nodes
    assert windows == {"a": {0, 2}, "b": {1, 3}}
    off = LeaseTable(0, [(0, 16)], 2, Config(lease_size=2, locality=False), stream=stream)
    x, y = off.register(0, 0, 0.0, node="a"), off.register(1, 0, 0.0, node="b")
    assert [off.request(x, 0.0).start, off.request(y, 0.0).start] == [0, 2]  # queue order


def test_only_a_ranks_recent_confirm_answers_are_kept_for_retries(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from stoker.coordinator import leases

    monkeypatch.setattr(leases, "RETAIN", 8)
    cfg = Config(lease_size=1000, min_readahead=1000)
    t = LeaseTable(0, [(0, 400)], world=1, config=cfg)
    c = t.register(0, 0, 0.0)
    g = t.request(c, 0.0)
    first = t.confirm_batch(c, 0, [[g.lease, 4, 4]], 4, 0.0)
    for seq in range(1, 30):
        t.confirm_batch(c, seq, [[g.lease, 4 * (seq + 1), 4]], 4, 0.0)
    assert sum(map(len, t._answers)) <= 9  # not one per call of the epoch
    # the last call, retried (its reply was lost), gets its answer again and logs nothing
    rows = t.log_rows[0]
    assert t.confirm_batch(c, 29, [[g.lease, 120, 4]], 4, 0.0) == [False]
    assert t.log_rows[0] == rows
    # an old one is no longer known: refused as out of sequence, not confirmed again
    assert first == [False]
    with pytest.raises(LeaseError, match="confirms batch 0"):
        t.confirm_batch(c, 0, [[g.lease, 4, 4]], 4, 0.0)
    # the journal replays to the same answers
    back = LeaseTable.replay(t.events, cfg)
    assert back._answers == t._answers and back.log == t.log


def test_a_stream_that_continues_the_tables_is_taken_and_journaled() -> None:
    """A restored mixture whose weights changed describes its stream with the old one as
    its origin: the table takes it (and a replay does too); any other stream is refused."""
    import json

    from stoker.coordinator.leases import LeaseTable
    from stoker.coordinator.model import Config, LeaseError

    old = json.dumps({"mixture": {"a": {}}, "weights": "w1", "world": 2})
    new = json.dumps({"mixture": {"a": {}}, "weights": "w2", "world": 2,
                      "origin": {"stream": json.loads(old), "epoch": 3}})  # fmt: skip
    table = LeaseTable(0, [(0, 100)], 2, Config(lease_size=10))
    table.register(0, 0, 0.0, stream=old)
    table.register(1, 0, 0.0, stream=new)
    assert table.stream == new
    table.register(0, 1, 0.0, stream=new)  # the job's other consumers, as it now is
    assert LeaseTable.replay(table.events).stream == new

    def describe(origin: object, epoch: int = 3, **kw: object) -> str:
        return json.dumps({"mixture": {"a": {}}, "weights": "w3", "world": 2, **kw,
                           "origin": {"stream": origin, "epoch": epoch}})  # fmt: skip

    refused = [
        describe({"weights": "w0"}),  # not the table's stream
        describe(json.loads(new)),  # a second change: once a table
    ]
    for stream in refused:
        with pytest.raises(LeaseError, match="maps positions to samples"):
            table.register(1, 1, 0.0, stream=stream)
    fresh = LeaseTable(2, [(0, 100)], 2, Config(lease_size=10))
    fresh.register(0, 0, 0.0, stream=old)
    for stream in (
        describe(json.loads(old), epoch=2),  # from the table's own epoch: its positions went out
        describe(json.loads(old), world=3),  # another layout of the positions
        describe(json.loads(old), mixture={"b": {}}),
    ):
        with pytest.raises(LeaseError, match="maps positions to samples"):
            fresh.register(1, 0, 0.0, stream=stream)
    fresh.register(1, 0, 0.0, stream=describe(json.loads(old)))  # from epoch 3: taken
    assert json.loads(fresh.stream)["origin"]["epoch"] == 3
