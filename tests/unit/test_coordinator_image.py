"""A coordinator that images its tables every few events restarts from the last image
and the journal after it, to the table a replay of the whole journal gives."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from stoker._proto import coordinator_pb2 as pb
from stoker.coordinator.journal import Journal
from stoker.coordinator.leases import Config, Event, LeaseTable
from stoker.coordinator.service import Coordinator, _split_epochs

CFG = Config(lease_size=10, min_readahead=4)
NOW = 100.0


def everything(t: LeaseTable) -> dict[str, Any]:
    return {k: v for k, v in vars(t).items() if k != "events"}


def register(c: Coordinator) -> list[int]:
    """Two consumers of each of the two ranks, in the coordinator's epoch."""
    return [
        c.Register(pb.RegisterRequest(rank=r, worker=w), None).consumer  # type: ignore[arg-type]
        for r in (0, 1)
        for w in (0, 1)
    ]


def work(c: Coordinator, consumers: list[int], rounds: int) -> int:
    """Each consumer in turn: a lease, read to its horizon, confirmed (in Batch messages,
    as a node's relay sends them); in a new epoch new consumers register. The positions
    confirmed."""
    done = 0
    epoch = c.table.epoch
    for _ in range(rounds):
        if c.table.epoch != epoch:
            epoch, consumers[:] = c.table.epoch, register(c)
        for cid in consumers:
            r = c.Batch(pb.BatchRequest(calls=[pb.Call(lease=pb.LeaseRequest(
                consumer=cid, epoch=epoch))]), None).results[0]  # type: ignore[arg-type]  # fmt: skip
            if r.WhichOneof("kind") != "lease" or r.lease.status != pb.LeaseReply.GRANTED:
                continue
            g = r.lease
            calls = [
                pb.Call(heartbeat=pb.HeartbeatRequest(
                    consumer=cid, epoch=epoch, lease=g.lease, read=g.horizon)),
                pb.Call(confirm=pb.ConfirmRequest(
                    consumer=cid, epoch=epoch, lease=g.lease, upto=g.horizon)),
            ]  # fmt: skip
            out = c.Batch(pb.BatchRequest(calls=calls), None).results  # type: ignore[arg-type]
            assert [x.WhichOneof("kind") for x in out] == ["heartbeat", "confirm"]
            done += g.horizon - g.start
    return done


def start(state: Path) -> Coordinator:
    c = Coordinator(120, 2, str(state), config=CFG, clock=lambda: NOW)
    c.image_every = 25
    return c


def test_a_restart_loads_the_last_image_and_replays_only_the_events_after_it(
    tmp_path: Path,
) -> None:
    c = start(tmp_path)
    consumers = register(c)
    assert work(c, consumers, 12) > 120  # more than an epoch: images taken across one
    epoch = c.table.epoch
    c.close()
    journal = Journal(str(tmp_path), "job")
    found = next(journal.images(), None)
    assert found is not None and epoch >= 1
    assert len(journal.read(found[0])) < len(journal.read()) / 2  # a restart reads less
    # the whole journal's last two epochs, replayed, revived as a restart does
    tables = _split_epochs([Event.from_json(e) for e in journal.read()])
    expect = LeaseTable.replay(tables[-1], CFG)
    expect.revive(NOW)
    before = LeaseTable.replay(tables[-2], CFG) if len(tables) > 1 else None

    again = start(tmp_path)
    assert everything(again.table) == everything(expect)
    if before is not None:
        assert again.previous is not None
        assert everything(again.previous) == everything(before)
    # it serves on: consumers of the run before carry on, nothing is granted twice
    assert work(again, consumers, 4) > 0
    again.close()
    third = start(tmp_path)  # and restarts again from its own images
    assert third.table.consumed == again.table.consumed
    third.close()


def test_an_image_that_does_not_read_or_belong_is_passed_over(tmp_path: Path) -> None:
    """A damaged image, one of another stoker version and one left from another journal
    under the same name are passed over: the restart takes an older image or replays the
    whole journal, to the same table."""
    c = start(tmp_path)
    work(c, register(c), 8)
    c.close()
    journal = Journal(str(tmp_path), "job")
    tables = _split_epochs([Event.from_json(e) for e in journal.read()])
    expect = LeaseTable.replay(tables[-1], CFG)
    expect.revive(NOW)
    images = sorted((tmp_path / "images" / "job").glob("*.json"))
    assert len(images) == 2  # the last two are kept
    newest, older = images[-1], images[0]
    newest.write_text(newest.read_text()[:-40])  # cut short
    assert everything(start(tmp_path).table) == everything(expect)
    doc = json.loads(older.read_text())
    doc["table"]["version"] = 99
    older.write_text(json.dumps(doc))
    # the older one is offered, and refused at its load: the whole journal
    assert [seq for seq, _ in Journal(str(tmp_path), "job").images()] == [int(older.stem)]
    assert everything(start(tmp_path).table) == everything(expect)
    doc["table"]["version"] = 2
    doc["before"] = [doc["before"][0], doc["before"][1] + 1]  # not this journal's segment
    older.write_text(json.dumps(doc))
    assert list(Journal(str(tmp_path), "job").images()) == []  # not offered at all
    assert everything(start(tmp_path).table) == everything(expect)
