"""``stoker replay`` over a journal with a restore: what the restore replaced is left out."""

from __future__ import annotations

from pathlib import Path

from stoker.coordinator import replay
from stoker.coordinator.journal import Journal
from stoker.coordinator.leases import Config, LeaseTable

B = 4
CFG = Config(lease_size=100, min_readahead=100)


def _read(table: LeaseTable, batches: int, seq: int = 0) -> None:
    """One consumer of rank 0 confirms ``batches`` full batches from the queue's front."""
    c = table.register(0, 0, 0.0)
    g = table.request(c, 0.0)
    for k in range(batches):
        upto = g.start + (k + 1) * B
        table.confirm_batch(c, seq + k, [[g.lease, upto, B]], B, 0.0)


def test_a_restore_cuts_its_epoch_at_the_checkpoint_and_drops_epochs_begun_after_it(
    tmp_path: Path,
) -> None:
    journal = Journal(str(tmp_path), "job")
    old = LeaseTable(0, [(0, 20)], world=1, config=CFG)
    _read(old, 5)  # the whole epoch confirmed (read ahead of training) ...
    assert old.done
    snapshot = old.snapshot_at(2)  # ... but the job's checkpoint is after step 2
    journal.write_checkpoint("ck", snapshot)
    # the old run had begun the next epoch before it stopped
    ahead = LeaseTable(1, [(20, 40)], world=1, config=CFG, first_ids=old.next_ids)
    _read(ahead, 1)
    restored = LeaseTable.restore(snapshot, 1, CFG, origin="ck", first_ids=ahead.next_ids)
    _read(restored, 3)
    for t in (old, ahead, restored):
        journal.append([e.to_json() for e in t.events])
    got = [(b.epoch, b.step, b.positions.tolist()) for b in replay.batches(str(tmp_path))]
    assert got == [
        (0, 1, [0, 1, 2, 3]),
        (0, 2, [4, 5, 6, 7]),  # the old run up to its checkpoint
        (0, 3, [8, 9, 10, 11]),
        (0, 4, [12, 13, 14, 15]),
        (0, 5, [16, 17, 18, 19]),  # the restored run from it; nothing of epoch 1
    ]


def test_without_a_restore_every_confirmed_batch_is_replayed(tmp_path: Path) -> None:
    journal = Journal(str(tmp_path), "job")
    first = LeaseTable(0, [(0, 12)], world=1, config=CFG)
    _read(first, 3)
    second = LeaseTable(1, [(12, 24)], world=1, config=CFG, first_ids=first.next_ids)
    _read(second, 2)
    for t in (first, second):
        journal.append([e.to_json() for e in t.events])
    got = [(b.epoch, b.step) for b in replay.batches(str(tmp_path))]
    assert got == [(0, 1), (0, 2), (0, 3), (1, 1), (1, 2)]


def test_a_restore_that_a_later_one_went_back_before_is_left_out(tmp_path: Path) -> None:
    """Checkpoints after steps 2 and 4 of one table; the run is restored from the first,
    then from the second: training saw the table's steps 1-4, then the second restore."""
    journal = Journal(str(tmp_path), "job")
    first = LeaseTable(0, [(0, 40)], world=1, config=CFG)
    _read(first, 6)
    journal.write_checkpoint("c2", first.snapshot_at(2))
    journal.write_checkpoint("c4", first.snapshot_at(4))
    abandoned = LeaseTable.restore(first.snapshot_at(2), 1, CFG, origin="c2",
                                   first_ids=first.next_ids)  # fmt: skip
    _read(abandoned, 1)
    last = LeaseTable.restore(first.snapshot_at(4), 1, CFG, origin="c4",
                              first_ids=abandoned.next_ids)  # fmt: skip
    _read(last, 2)
    for t in (first, abandoned, last):
        journal.append([e.to_json() for e in t.events])
    got = [(b.step, b.positions.tolist()[0]) for b in replay.batches(str(tmp_path))]
    assert got == [(1, 0), (2, 4), (3, 8), (4, 12), (5, 16), (6, 20)]


def test_checkpoints_that_name_no_table_are_matched_to_one_that_could_have_counted_them(
    tmp_path: Path,
) -> None:
    """Checkpoints written before they named their table: restored from the one after
    step 4, then from the one after step 2 of the first table. Training saw the first
    table's steps 1-2, then the second restore's."""

    def unnamed(snapshot: dict) -> dict:
        return {k: v for k, v in snapshot.items() if k != "table"}

    journal = Journal(str(tmp_path), "job")
    first = LeaseTable(0, [(0, 40)], world=1, config=CFG)
    _read(first, 6)
    c2, c4 = unnamed(first.snapshot_at(2)), unnamed(first.snapshot_at(4))
    journal.write_checkpoint("c2", c2)
    journal.write_checkpoint("c4", c4)
    r4 = LeaseTable.restore(c4, 1, CFG, origin="c4", first_ids=first.next_ids)
    _read(r4, 1)
    r2 = LeaseTable.restore(c2, 1, CFG, origin="c2", first_ids=r4.next_ids)
    _read(r2, 2)
    for t in (first, r4, r2):
        journal.append([e.to_json() for e in t.events])
    got = [(b.step, b.positions.tolist()[0]) for b in replay.batches(str(tmp_path))]
    assert got == [(1, 0), (2, 4), (3, 8), (4, 12)]  # r4 began after step 2: not c2's table
