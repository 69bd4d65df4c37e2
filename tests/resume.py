"""The one resume check for every stateful front end (TokenDataset, TokenLoader with and
without workers, a device, a coordinator; DevicePrefetcher): :func:`assert_resumes`.

Modelled on torchdata's ``run_test_save_load_state``: an object saves its state after
``at`` units (items or batches) of an uninterrupted run's stream, a new object loads
it (through JSON, as a checkpoint stores it) and goes on; optionally that one saves
again after ``then`` more and a third goes on (resume after resume: HF datasets' second
resume once restarted from zero). What was delivered before and after the restores
must be what one uninterrupted run delivers over :attr:`FrontEnd.epochs` epochs: the
same units in the same order, or, where a restore may reorder (fed by a
coordinator), every sample exactly once in each epoch (as the object itself says
which epoch it hands out: the same samples in another epoch would pass unseen) and
the same number of units.

The state is always taken with the pass still open (right after the ``at``-th unit,
as a training loop saves), and the pass is closed after it.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

Unit = list[int]  # the sample ids of one thing a pass hands out


@dataclass
class FrontEnd:
    """How to build one kind of stateful object and read sample ids off what it yields.

    ``make()`` returns a fresh object with ``state_dict``/``load_state_dict`` whose
    ``iter()`` is one pass (an epoch, or the rest of the epoch in progress);
    ``ids(unit)`` gives a unit's sample ids; ``ordered`` says whether a restore
    continues the uninterrupted order exactly; where it does not, ``epoch_of(obj)``
    says which epoch the unit ``obj`` just handed out belongs to.
    """

    name: str
    make: Callable[[], Any]
    ids: Callable[[Any], Unit]
    ordered: bool = True
    epoch_of: Callable[[Any], int] | None = None
    epochs: int = 2
    _reference: list[list[Unit]] | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        assert self.ordered or self.epoch_of is not None, f"{self.name}: epoch_of is needed"

    def tag(self, obj: Any) -> int | None:
        return None if self.epoch_of is None else self.epoch_of(obj)

    def reference(self) -> list[list[Unit]]:
        """The units of each epoch of an uninterrupted run (made once): pass ``e`` is
        epoch ``e``."""
        if self._reference is None:
            obj = self.make()
            try:
                epochs = []
                for e in range(self.epochs):
                    units = []
                    for u in obj:
                        units.append(self.ids(u))
                        assert self.tag(obj) in (None, e), f"{self.name}: pass {e} is not epoch {e}"
                    epochs.append(units)
                self._reference = epochs
            finally:
                close(obj)
        return self._reference

    def points(self) -> dict[str, int]:
        """Units taken before the save, by name: the start, mid-epoch, an epoch's end
        (all of epoch 0, its pass not yet exhausted) and mid second epoch."""
        n0, n1 = (len(e) for e in self.reference()[:2])
        return {"start": 0, "mid_epoch": n0 // 2, "epoch_end": n0, "mid_second_epoch": n0 + n1 // 3}


def close(obj: Any) -> None:
    closer = getattr(obj, "close", None)
    if closer is not None:
        closer()


def through_json(state: dict[str, Any]) -> dict[str, Any]:
    return json.loads(json.dumps(state))


Tagged = tuple[int | None, Unit]  # (the epoch the object says it is in, the unit's ids)


def take(fe: FrontEnd, obj: Any, n: int) -> tuple[list[Tagged], dict[str, Any]]:
    """``n`` units over as many passes as it takes, and the state right after the last."""
    got: list[Tagged] = []
    if n == 0:
        return got, through_json(obj.state_dict())
    for _ in range(fe.epochs + 1):
        it = iter(obj)
        try:
            for unit in it:
                got.append((fe.tag(obj), fe.ids(unit)))
                if len(got) == n:
                    return got, through_json(obj.state_dict())
        finally:
            getattr(it, "close", lambda: None)()
    raise AssertionError(f"{fe.name}: ran dry after {len(got)} of {n} units")


def finish(fe: FrontEnd, obj: Any, n: int) -> list[Tagged]:
    """Whole passes until at least ``n`` units came (an empty pass may come first: the
    rest of an epoch that was taken to its end)."""
    got: list[Tagged] = []
    for _ in range(fe.epochs + 1):
        if len(got) >= n:
            break
        for unit in obj:
            got.append((fe.tag(obj), fe.ids(unit)))
    return got


def restored(fe: FrontEnd, state: dict[str, Any]) -> Any:
    obj = fe.make()
    obj.load_state_dict(state)
    assert through_json(obj.state_dict()) == state, f"{fe.name}: a loaded state reads back changed"
    return obj


def assert_resumes(
    fe: FrontEnd, at: int, *, then: int | None = None, into: FrontEnd | None = None
) -> None:
    """Save after ``at`` units, restore into a new object (and, with ``then``, save again
    after ``then`` more and restore into a third), finish: the whole equals the
    uninterrupted run. ``into`` builds the restored objects instead of ``fe`` (another
    topology: workers, a device); its uninterrupted run must equal ``fe``'s."""
    reference = fe.reference()
    again = into or fe
    whole = [u for epoch in reference for u in epoch]
    obj = fe.make()
    try:
        before, state = take(fe, obj, at)
    finally:
        close(obj)
    if then is not None:
        obj = restored(again, state)
        try:
            more, state = take(fe, obj, then)
        finally:
            close(obj)
        before += more
    obj = restored(again, state)
    try:
        after = finish(again, obj, len(whole) - len(before))
    finally:
        close(obj)
    if fe.ordered:
        assert [u for _, u in before] == whole[: len(before)], f"{fe.name}: before the save"
        assert [u for _, u in after] == whole[len(before) :], f"{fe.name}: after the restore"
        return
    got = before + after
    assert len(got) == len(whole), f"{fe.name}: {len(got)} units, not {len(whole)}"
    tags = [t for t, _ in got if t is not None]
    assert len(tags) == len(got) and tags == sorted(tags), f"{fe.name}: epochs out of order: {tags}"
    for e, epoch in enumerate(reference):
        have = [i for t, u in got if t == e for i in u]
        assert_same_samples(have, [i for u in epoch for i in u], f"{fe.name}, epoch {e}")
    assert set(tags) <= set(range(len(reference))), f"{fe.name}: epochs {sorted(set(tags))}"


def assert_same_samples(got: Iterable[int], want: Iterable[int], what: str) -> None:
    """Each sample of ``want`` exactly as often as there (exactly once, for an epoch)."""
    have, need = Counter(got), Counter(want)
    assert have == need, (
        f"{what}: repeated {sorted((have - need).items())[:10]}, "
        f"lost {sorted((need - have).items())[:10]}"
    )
