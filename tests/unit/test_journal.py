"""The coordinator's journal on a local path: segments, order, damage, replay."""

from __future__ import annotations

from pathlib import Path

import pytest

from stoker.coordinator.journal import Journal
from stoker.coordinator.leases import Config, Event, LeaseTable
from stoker.errors import StateError

CFG = Config(lease_size=5, min_readahead=3)


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


def _segments(root: Path) -> list[Path]:
    return sorted((root / "journal" / "job").iterdir())


def test_replay_of_the_journal_is_the_live_table(tmp_path: Path) -> None:
    live = LeaseTable(2, [(0, 40)], world=2, config=CFG)
    first = Journal(str(tmp_path), "job")
    _run(live, first)
    first.close()
    again = Journal(str(tmp_path), "job")  # a restarted coordinator
    replayed = LeaseTable.replay([Event.from_json(e) for e in again.read()], CFG)
    assert replayed.state() == live.state()
    # the restarted one appends to a segment of its own
    assert again.append([{"kind": "expire", "now": 9.0, "args": {}}]) == 2
    assert len(_segments(tmp_path)) == 2


def test_a_torn_last_line_is_skipped_and_other_damage_stops_the_replay(tmp_path: Path) -> None:
    live = LeaseTable(0, [(0, 40)], world=2, config=CFG)
    j = Journal(str(tmp_path), "job")
    _run(live, j)
    j.close()
    n = len(Journal(str(tmp_path), "job").read())
    seg = _segments(tmp_path)[-1]
    seg.write_bytes(seg.read_bytes() + b'{"kind":"expi')  # a crash in the middle of a write
    assert len(Journal(str(tmp_path), "job").read()) == n
    seg.write_bytes(seg.read_bytes() + b"\n")  # a whole line that does not parse
    with pytest.raises(StateError, match=r"line \d+: corrupt journal entry"):
        Journal(str(tmp_path), "job").read()


def test_a_torn_line_a_crash_left_is_skipped_after_a_later_life_too(tmp_path: Path) -> None:
    j = Journal(str(tmp_path), "job")
    j.append([{"kind": "expire", "now": 1.0, "args": {}}])
    seg = _segments(tmp_path)[-1]
    seg.write_bytes(seg.read_bytes() + b'{"kind":"expi')  # the crash, mid-append
    later = Journal(str(tmp_path), "job")  # the next life appends to a segment of its own
    later.append([{"kind": "expire", "now": 2.0, "args": {}}])
    later.close()
    assert [e["now"] for e in Journal(str(tmp_path), "job").read()] == [1.0, 2.0]


def test_a_missing_segment_stops_the_replay(tmp_path: Path) -> None:
    for _ in range(3):  # three coordinator lives, one segment each
        j = Journal(str(tmp_path), "job")
        j.append([{"kind": "expire", "now": 1.0, "args": {}}])
        j.close()
    _segments(tmp_path)[1].unlink()
    with pytest.raises(StateError, match="segment 2 is missing"):
        Journal(str(tmp_path), "job").read()


def test_job_names_cannot_escape(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        Journal(str(tmp_path), "../other")


def test_a_group_commit_whose_write_failed_writes_those_events_first_next_time() -> None:
    """A failed journal write loses nothing: the next sync writes the same events, in
    order, before any buffered after them, and a caller whose events are not written
    never returns as if they were."""
    from stoker.coordinator.commit import GroupCommit
    from stoker.coordinator.model import Event

    class Flaky:
        def __init__(self) -> None:
            self.fail, self.segments = 1, []

        def append(self, events):
            if self.fail:
                self.fail -= 1
                raise OSError("disk full")
            self.segments.append([e["args"]["n"] for e in events])

        def close(self) -> None:
            pass

    journal = Flaky()
    commit = GroupCommit(journal)  # type: ignore[arg-type]
    first = commit.add([Event("revive", 0.0, {"n": i}) for i in range(3)])
    with pytest.raises(OSError):
        commit.sync(first)
    later = commit.add([Event("revive", 0.0, {"n": 3})])
    commit.sync(first)  # its events were not written: this call writes them now
    assert journal.segments == [[0, 1, 2, 3]]
    commit.sync(later)
    assert journal.segments == [[0, 1, 2, 3]]
