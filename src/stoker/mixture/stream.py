"""A mixture's positions -> its sources' sample ids (pure).

A mixture's epoch is ``steps_per_epoch`` global steps of ``batch_size`` samples a
rank; its stream positions are cut across ranks as a single dataset's are
(:class:`~stoker.plan.EpochSplit`: rank ``r``'s share is the contiguous run
``[e N + r P, e N + (r + 1) P)`` of epoch ``e``, ``P = steps_per_epoch x
batch_size`` and ``N = P x world``), so rank-local sample ``m`` of epoch ``e`` is
item ``m % batch_size`` of the rank's part of global step ``e x steps_per_epoch + m
// batch_size``. What that item is comes from the :class:`~stoker.mixture.plan.MixPlan`:
``(source, source epoch, owner rank, local index)``. A source's epoch ``f`` holds
its stream positions ``[f S, (f + 1) S)`` (``S`` its samples), cut into one
contiguous share per rank; the item is the owner's share's ``local index``-th
position, mapped to a sample id by the source's own plan (its shuffle).

A mixture's sample id encodes the source, the source's epoch (modulo
``2 ** EPOCH_BITS``) and the source's own sample id: ``source << SOURCE_SHIFT |
epoch << EPOCH_SHIFT | id`` (:func:`encode`, :func:`decode`, :func:`source_epochs`), so
a small source's repeats within one mixture epoch are distinct samples, and a kind
whose samples are random (augmented records) draws each from the source's own epoch.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from stoker import intervals
from stoker.mixture.plan import MixPlan

#: Bits of a mixture's sample id that hold the source's own sample id (below them, the
#: source's epoch; above, the source).
EPOCH_SHIFT = 40
EPOCH_BITS = 16
SOURCE_SHIFT = EPOCH_SHIFT + EPOCH_BITS
#: Sources a mixture has at most, and samples a source.
MAX_SOURCES = 1 << (63 - SOURCE_SHIFT)
MAX_SOURCE_SAMPLES = 1 << EPOCH_SHIFT
_MASK = (1 << EPOCH_SHIFT) - 1
_EPOCHS = (1 << EPOCH_BITS) - 1


def encode(source: np.ndarray | int, ids: np.ndarray, epochs: np.ndarray | int = 0) -> np.ndarray:
    """Mixture sample ids of source ``source``'s sample ``ids`` of its epoch ``epochs``."""
    e = np.asarray(epochs, dtype=np.int64) & _EPOCHS
    return (
        (np.asarray(source, dtype=np.int64) << SOURCE_SHIFT)
        | (e << EPOCH_SHIFT)
        | np.asarray(ids, dtype=np.int64)
    )


def decode(ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(source, the source's sample id)`` of mixture sample ids."""
    a = np.asarray(ids, dtype=np.int64)
    return a >> SOURCE_SHIFT, a & _MASK


def source_epochs(ids: np.ndarray) -> np.ndarray:
    """The source's epoch (modulo ``2 ** EPOCH_BITS``) of each mixture sample id."""
    out: np.ndarray = (np.asarray(ids, dtype=np.int64) >> EPOCH_SHIFT) & _EPOCHS
    return out


#: A source's current epoch, when it is not its whole stream range: ``(epoch, the
#: interval set of its positions left)`` (after a restore on another world size).
EpochSets = Mapping[int, tuple[int, np.ndarray]]


@dataclass(frozen=True)
class EpochSizes:
    """How many samples a source's epoch deals (a plain object: a dataset holding a plan
    pickles, for DataLoader workers that are spawned)."""

    sizes: tuple[int, ...]
    sets: dict[int, tuple[int, np.ndarray]]

    def __call__(self, source: int, epoch: int) -> int:
        got = self.sets.get(source)
        if got is None or got[0] != epoch:
            return self.sizes[source]  # a whole epoch (asked for every step: no set made)
        return intervals.size(got[1])


def epoch_set(size: int, epoch: int, sets: EpochSets, source: int) -> np.ndarray:
    """The interval set of source ``source``'s epoch ``epoch`` (``size`` samples an epoch)."""
    got = sets.get(source)
    if got is not None and got[0] == epoch:
        return got[1]
    return intervals.make([(epoch * size, (epoch + 1) * size)])


def share_positions(iv: np.ndarray, world: int, owner: np.ndarray, local: np.ndarray) -> np.ndarray:
    """Stream positions of ``local`` samples of ``owner`` ranks' contiguous shares of the
    epoch set ``iv`` (:func:`share_start`)."""
    return intervals.members_at(iv, share_start(intervals.size(iv), world, owner) + local)


def source_positions(
    size: int, epoch: Any, sets: EpochSets, source: int, world: int, owner: Any, local: Any
) -> np.ndarray:
    """Stream positions of ``local`` samples of ``owner`` ranks' shares of source
    ``source``'s epochs ``epoch`` (an int or one a sample: a whole epoch, ``[epoch size,
    (epoch + 1) size)``, by arithmetic, all at once; the one in ``sets``, by its set)."""
    e = np.asarray(epoch, dtype=np.int64)
    pos = np.asarray(e * size + share_start(size, world, owner) + local, dtype=np.int64)
    got = sets.get(source)
    if got is not None:
        there = np.broadcast_to(e == got[0], pos.shape)
        if there.any():
            o, k = (np.broadcast_to(np.asarray(x), pos.shape) for x in (owner, local))
            pos = pos.copy()
            pos[there] = share_positions(got[1], world, o[there], k[there])
    return pos


def share_start(size: int, world: int, rank: Any) -> Any:
    """Where rank ``rank``'s contiguous share of an epoch of ``size`` samples begins
    (shares of ``ceil((size - r) / world)``: rank ``r`` takes sample ``k`` of the epoch
    when ``k % world == r``, as :func:`~stoker.mixture.deal.rank_counts` counts); ranks
    as an int or an array."""
    return rank * (size // world) + np.minimum(rank, size % world)


class MixStream:
    """Positions of a mixture's epochs (``per_rank`` samples a rank each) -> mixture
    sample ids, from a plan that starts at ``base`` (a :meth:`MixPlan.state_dict`, or
    None for step 0); ``make_plan()`` makes a fresh plan, ``source_samples[i](positions)``
    maps source ``i``'s stream positions to its sample ids, ``sizes[i]`` its samples an
    epoch, ``sets`` the sources whose current epoch is not whole.

    Each rank asked for has a plan of its own that walks its steps in order, a stretch of
    :data:`AHEAD` steps at least at a time (:meth:`MixPlan.take`; the steps not asked for
    are skipped, counts only), so a consumer of a coordinator's leases, which reads
    stretches of many ranks' positions, does not plan one rank's steps again for another's;
    :data:`PLANS` of them at most, the least recently used let go. A rank's new walk starts
    from the plan's state at the furthest step another walk planned from (:data:`MARKS`
    of them kept), not from ``base``: a linear ramp is skipped a step at a time. The items of the steps
    planned are kept, :data:`KEEP` rows of them a rank at most, and a step before those
    is planned again from ``base``."""

    #: Rows of items kept at most (per rank asked for): two horizons' worth at most.
    KEEP = 1 << 17
    #: Steps planned at least at a time (what one array pass of the plan costs little).
    AHEAD = 512
    #: Ranks' plans kept at most (each holds its quota tables).
    PLANS = 8
    #: Plan states kept, at the steps walks began planning from (a few integers each):
    #: where another rank's walk starts instead of the first step.
    MARKS = 1024

    def __init__(
        self,
        make_plan: Callable[[], MixPlan],
        base: dict[str, Any] | None,
        steps_per_epoch: int,
        source_samples: Sequence[Callable[[np.ndarray], np.ndarray]],
        sizes: Sequence[int],
        sets: EpochSets | None = None,
    ) -> None:
        self.make_plan, self.base = make_plan, base
        self.spe = steps_per_epoch
        self.source_samples, self.sizes = source_samples, sizes
        self.sets = dict(sets or {})
        first = self._fresh()
        self.first_step = first.step
        self.B = first.batch_size
        self.world = first.world
        self.per_rank = self.spe * self.B
        # (rank, first step) -> items of consecutive steps, shape (steps, B, 4)
        self._kept: OrderedDict[tuple[int, int], np.ndarray] = OrderedDict()
        self._plans: OrderedDict[int, MixPlan] = OrderedDict()  # rank -> its walk
        self._marks: OrderedDict[int, dict[str, Any]] = OrderedDict()  # step -> plan state

    def _fresh(self) -> MixPlan:
        p = self.make_plan()
        if self.base is not None:
            p.load_state_dict(self.base)
        return p

    def state_at(self, step: int) -> dict[str, Any]:
        """The plan's state at global step ``step`` (at or after this stream's first)."""
        plan = self._walk(-1, step)  # (a walk of its own: no rank's)
        self._plans.pop(-1, None)
        return plan.state_dict()

    def samples(self, positions: np.ndarray) -> np.ndarray:
        p = np.asarray(positions, dtype=np.int64)
        N = self.per_rank * self.world
        epoch, q = np.divmod(p, N)
        rank, m = np.divmod(q, self.per_rank)
        step = epoch * self.spe + m // self.B
        j = m % self.B
        items = np.empty((len(p), 4), dtype=np.int64)
        for r in np.unique(rank).tolist():
            mine = rank == r
            st, jj = step[mine], j[mine]
            got = np.empty((len(st), 4), dtype=np.int64)
            for first, arr in self._cover(r, int(st.min()), int(st.max())):
                sel = (st >= first) & (st < first + len(arr))
                if sel.any():
                    got[sel] = arr[st[sel] - first, jj[sel]]
            items[mine] = got
        self._trim()  # (after the gather: one call may need more than is kept)
        return self._ids(items)

    def step_ids(self, step: int, steps: int) -> np.ndarray:
        """Every rank's mixture sample ids of global steps ``[step, step + steps)``, shape
        ``(world, steps, batch_size)``, from one walk of the plan (what a plan step costs
        is every rank's: one walk a rank would cost ``world`` times as much)."""
        if step < self.first_step:
            raise IndexError(f"step {step} is before this stream's first step {self.first_step}")
        plan = self._walk(-1, step)  # (a walk of its own: no rank's)
        self._plans.pop(-1, None)
        got = plan.take(steps, range(self.world))
        items = np.stack([got[r] for r in range(self.world)]).reshape(-1, 4)
        return self._ids(items).reshape(self.world, steps, self.B)

    def rank_ids(self, step: int, rank: int) -> np.ndarray:
        """Rank ``rank``'s mixture sample ids of global step ``step``, in batch order."""
        return self._ids(self.rank_items(step, rank))

    def rank_items(self, step: int, rank: int) -> np.ndarray:
        """Rank ``rank``'s items of global step ``step``: rows of ``(source, source
        epoch, owner rank, local index)``, in batch order."""
        ((first, arr),) = self._cover(rank, step, step)
        self._trim()
        out: np.ndarray = arr[step - first]
        return out

    def _find(self, rank: int, step: int) -> tuple[int, np.ndarray] | None:
        for (r, first), arr in self._kept.items():
            if r == rank and first <= step < first + len(arr):
                return first, arr
        return None

    def _cover(self, rank: int, lo: int, hi: int) -> list[tuple[int, np.ndarray]]:
        """Rank ``rank``'s items of steps ``lo`` to ``hi`` (both included), as the pieces
        ``(first step, items)`` kept or planned now that hold them, in order."""
        if lo < self.first_step:
            raise IndexError(f"step {lo} is before this stream's first step {self.first_step}")
        pieces = []
        step = lo
        while step <= hi:
            got = self._find(rank, step)
            if got is None:
                plan = self._walk(rank, step)
                most = max(1, self.KEEP // self.B // 2)
                n = max(1, min(max(hi + 1 - step, self.AHEAD), most))
                got = (step, plan.take(n, [rank])[rank])
                self._kept[(rank, step)] = got[1]
            pieces.append(got)
            step = got[0] + len(got[1])
        return pieces

    def _walk(self, rank: int, step: int) -> MixPlan:
        """Rank ``rank``'s plan, at step ``step``: its own, or, when it has none at or
        before ``step``, one made from the furthest state marked on the way (of any rank's
        walk: the plan's state is every rank's) that is not past it, else from ``base``."""
        plan = self._plans.pop(rank, None)
        if plan is None or step < plan.step:
            plan = self._fresh()
            behind = [k for k in self._marks if plan.step < k <= step]
            if behind:
                plan.load_state_dict(self._marks[max(behind)])
        plan.skip_to(step)  # (steps not asked for: another worker's)
        self._plans[rank] = plan
        while len(self._plans) > self.PLANS:
            self._plans.popitem(last=False)
        if step not in self._marks:
            self._marks[step] = plan.state_dict()
            while len(self._marks) > self.MARKS:
                self._marks.popitem(last=False)
        return plan

    def _trim(self) -> None:
        """Let the oldest pieces go, past :data:`KEEP` rows a rank's plan kept."""
        most = max(16, self.KEEP // self.B) * max(1, len(self._plans))
        while sum(len(a) for a in self._kept.values()) > most and len(self._kept) > 1:
            self._kept.popitem(last=False)

    def _ids(self, items: np.ndarray) -> np.ndarray:
        """Mixture sample ids of rows of ``(source, source epoch, owner, local index)``."""
        src, epoch, owner, local = items.T
        out = np.empty(len(items), dtype=np.int64)
        for i in np.unique(src).tolist():
            mine = src == i  # (every epoch of the source at once: a small one repeats
            e = epoch[mine]  # many epochs in one call)
            pos = source_positions(
                self.sizes[i], e, self.sets, i, self.world, owner[mine], local[mine]
            )
            out[mine] = encode(i, self.source_samples[i](pos), e)
        return out


class JoinedStream:
    """A coordinator-fed mixture whose weights changed at a restore: epochs before
    ``epoch`` map as ``before`` (the plan the run began with: those positions were being
    handed out under it), the later ones as ``after`` (the new weights, from the state
    ``before``'s plan reached at the first step of ``epoch``)."""

    def __init__(self, before: Any, after: MixStream, epoch: int) -> None:
        self.before, self.after, self.epoch = before, after, epoch
        self.N = after.per_rank * after.world

    def samples(self, positions: np.ndarray) -> np.ndarray:
        p = np.asarray(positions, dtype=np.int64)
        late = p >= self.epoch * self.N
        if late.all():
            return self.after.samples(p)
        if not late.any():
            return np.asarray(self.before.samples(p))
        out = np.empty(len(p), dtype=np.int64)
        out[late] = self.after.samples(p[late])
        out[~late] = self.before.samples(p[~late])
        return out

    def state_at(self, step: int) -> dict[str, Any]:
        if step < self.after.first_step:
            return dict(self.before.state_at(step))
        return self.after.state_at(step)

    def step_ids(self, step: int, steps: int) -> np.ndarray:
        """:meth:`MixStream.step_ids` of the plan each step is in (the two plans' worlds
        may differ: a range across their boundary is refused)."""
        cut = self.after.first_step
        if step < cut < step + steps:
            raise IndexError(f"steps {step}..{step + steps - 1} cross the new weights' step {cut}")
        return (self.before if step < cut else self.after).step_ids(step, steps)


def from_description(
    desc: Mapping[str, Any],
    source_samples: Sequence[Callable[[np.ndarray], np.ndarray]],
    sizes: Sequence[int],
) -> MixStream | JoinedStream:
    """The position map a coordinator-fed mixture's consumers described (its
    ``stream_identity``): its weights on its world from step 0, or, after weights changed
    at a restore (``origin``), the plan before the change up to its epoch and the new
    weights from there. ``source_samples[i]`` maps source ``i``'s positions (of
    ``sizes[i]`` samples an epoch) in the order of the description's weights."""
    from stoker.mixture.plan import MixPlan, schedule_of

    schedule = schedule_of(desc["weights"])
    epoch_sizes = EpochSizes(tuple(int(x) for x in sizes), {})
    B, world, spe = int(desc["batch_size"]), int(desc["world"]), int(desc["steps_per_epoch"])

    def make() -> MixPlan:
        return MixPlan(schedule, B, world, epoch_sizes)

    origin = desc.get("origin")
    if not origin:
        return MixStream(make, None, spe, source_samples, sizes)
    before_desc = origin["stream"]
    before_names = before_desc["weights"]["names"]
    order = [schedule.names.index(n) for n in before_names]
    before = reindexed(
        from_description(
            before_desc, [source_samples[i] for i in order], [sizes[i] for i in order]
        ),
        before_names,
        schedule.names,
    )
    # the old plan's state where the new weights begin: carried (worked out once, at the
    # restore), so no one walks the old plan to it again
    after = MixStream(make, origin["state"], spe, source_samples, sizes)
    return JoinedStream(before, after, int(origin["epoch"]))


class _Reindexed:
    """A position map whose sample ids encode the source by its index in other names."""

    def __init__(self, inner: Any, perm: np.ndarray) -> None:
        self.inner, self.perm = inner, perm

    def samples(self, positions: np.ndarray) -> np.ndarray:
        got = self.inner.samples(positions)
        src, ids = decode(got)
        return encode(self.perm[src], ids, source_epochs(got))

    def state_at(self, step: int) -> dict[str, Any]:
        return dict(self.inner.state_at(step))

    def step_ids(self, step: int, steps: int) -> np.ndarray:
        got = self.inner.step_ids(step, steps)
        src, ids = decode(got)
        return encode(self.perm[src], ids, source_epochs(got))


def reindexed(stream: Any, names: Sequence[str], to: Sequence[str]) -> Any:
    """``stream`` (whose ids encode sources by their index in ``names``) with its ids
    encoding them by their index in ``to`` (the same names)."""
    if list(names) == list(to):
        return stream
    return _Reindexed(stream, np.array([list(to).index(n) for n in names], dtype=np.int64))
