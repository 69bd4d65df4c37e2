"""The coordinator's journal on a local path: segments, order, damage, replay."""

from __future__ import annotations

from pathlib import Path

import pytest

from stoker.coordinator.journal import Journal
from stoker.coordinator.leases import Config, Event, LeaseTable
from stoker.errors import StateError


def _run(table: LeaseTable, journal: Journal) -> None:
    """A few consumers work; the journal is flushed after every call, as the service does."""
    flushed = 0

    def flush() -> None:
        nonlocal flushed
        journal.append([e.to_json() for e in table.events[flushed:]])
        flushed = len(table.events)

    flush()
    a, b = table.register(0, 0, 0.0), table.register(1, 0, 0.0)
    flush()
    for t, cid in enumerate([a, b, a, b]):
        g = table.request(cid, float(t))
        flush()
        table.heartbeat(cid, t + 0.5, g.lease, g.horizon)
        table.confirm(cid, g.lease, g.horizon, t + 0.5)
        flush()


def test_replay_of_the_journal_is_the_live_table(tmp_path: Path) -> None:
    cfg = Config(lease_size=5, min_readahead=3)
    live = LeaseTable(2, [(0, 40)], world=2, config=cfg)
    _run(live, Journal(str(tmp_path / "state"), "job"))
    again = Journal(str(tmp_path / "state"), "job")  # a restarted coordinator
    replayed = LeaseTable.replay([Event.from_json(e) for e in again.read()], cfg)
    assert replayed.state() == live.state()
    assert again.append([{"kind": "expire", "now": 9.0, "args": {}}]) == len(
        list((tmp_path / "state" / "journal" / "job").iterdir())
    )


def test_a_missing_or_damaged_segment_stops_the_replay(tmp_path: Path) -> None:
    cfg = Config(lease_size=5, min_readahead=3)
    for name in ("gap", "damaged"):
        _run(LeaseTable(0, [(0, 40)], world=2, config=cfg), Journal(str(tmp_path / name), "j"))
    segs = sorted((tmp_path / "gap" / "journal" / "j").iterdir())
    segs[2].unlink()
    with pytest.raises(StateError, match="segment 3 is missing"):
        Journal(str(tmp_path / "gap"), "j").read()
    last = sorted((tmp_path / "damaged" / "journal" / "j").iterdir())[-1]
    last.write_text(last.read_text() + "{not json\n")
    with pytest.raises(StateError, match=r"line \d+: corrupt journal entry"):
        Journal(str(tmp_path / "damaged"), "j").read()


def test_job_names_cannot_escape(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        Journal(str(tmp_path), "../other")
