"""stoker.loader.carry: what a pass keeps for the next is handed only to the pass it was
kept for, and closed otherwise (readers that record their closing)."""

from __future__ import annotations

import os

from stoker import intervals
from stoker.loader import state as st
from stoker.loader.carry import Kept, PassCarry, pass_key


class Reader:
    def __init__(self) -> None:
        self.closed = 0

    def close(self) -> None:
        self.closed += 1


def key(epoch: int, consumed: int = 0, world: int = 1) -> tuple:
    p = st.Progress(epoch, intervals.make([(0, 100)]), world, 4, consumed)
    return pass_key(p, 0, 1, 4)


def test_the_pass_it_was_kept_for_adopts_it() -> None:
    kept, r, planner = Kept(), Reader(), object()
    PassCarry(kept, key(0), key(1)).keep(0, planner, r)  # type: ignore[arg-type]
    assert kept
    assert PassCarry(kept, key(1), key(2)).adopt(0) == (planner, r)
    assert not kept and r.closed == 0


def test_another_pass_closes_what_was_kept() -> None:
    for other in (key(2), key(1, consumed=4), key(1, world=2)):
        kept, r = Kept(), Reader()
        PassCarry(kept, key(0), key(1)).keep(0, object(), r)  # type: ignore[arg-type]
        assert PassCarry(kept, other, key(9)).adopt(0) is None
        assert r.closed == 1 and not kept


def test_keeping_again_closes_the_older_and_release_closes_all() -> None:
    kept, a, b = Kept(), Reader(), Reader()
    kept.put(key(1), 0, object(), a)  # type: ignore[arg-type]
    kept.put(key(2), 0, object(), b)  # type: ignore[arg-type]
    assert a.closed == 1 and b.closed == 0
    kept.release()
    assert b.closed == 1 and not kept


def test_a_pass_that_plans_no_next_keeps_nothing() -> None:
    kept = Kept()
    assert not PassCarry(kept, key(0), None).keep(0, object(), Reader())  # type: ignore[arg-type]
    assert not kept


def test_the_epoch_set_is_part_of_the_key() -> None:
    a = st.Progress(1, intervals.make([(100, 200)]), 1, 4)
    b = st.Progress(1, intervals.make([(98, 200)]), 1, 4)  # a leftover carried in
    assert pass_key(a, 0, 1, 4) != pass_key(b, 0, 1, 4)


def test_what_is_kept_is_closed_before_the_process_forks() -> None:
    """A kept reader's threads may be decoding at the fork: the child must inherit none
    of their locks, so the reader is closed first (here, in the parent)."""
    kept, r = Kept(), Reader()
    kept.put(key(1), 0, object(), r)  # type: ignore[arg-type]
    pid = os.fork()
    if pid == 0:  # the child: nothing to adopt
        os._exit(0 if kept.take(key(1), 0) is None and r.closed == 1 else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert r.closed == 1 and not kept


def test_a_reader_that_failed_is_not_kept() -> None:
    kept, r = Kept(), Reader()
    r.failed = True  # type: ignore[attr-defined]
    assert not PassCarry(kept, key(0), key(1)).keep(0, object(), r)  # type: ignore[arg-type]
    assert not kept


def test_a_stream_mapped_otherwise_is_another_pass() -> None:
    p = st.Progress(1, intervals.make([(0, 100)]), 1, 4)
    kept, r = Kept(), Reader()
    kept.put(pass_key(p, 0, 1, 4, '{"world": 2}'), 0, object(), r)  # type: ignore[arg-type]
    assert kept.take(pass_key(p, 0, 1, 4, '{"world": 3}'), 0) is None
    assert r.closed == 1


def test_a_pickled_copy_keeps_nothing() -> None:
    import pickle

    kept, r = Kept(), Reader()
    kept.put(key(1), 0, object(), r)  # type: ignore[arg-type]
    copy = pickle.loads(pickle.dumps(kept))
    assert not copy and kept and r.closed == 0
