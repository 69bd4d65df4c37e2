"""``PlannedDataset``: epochs, the static plan and resume state, for any kind of data.

What a dataset of any kind shares: which epoch runs, where each rank and
worker is in it (:class:`~stoker.loader.state.Progress`), the exact,
topology-free state, the torch DataLoader protocol (an IterableDataset whose
workers each take whole batches in turn) and the contract the loaders read an
epoch through (:meth:`PlannedDataset.begin_epoch`, :class:`EpochPlan`). A kind
adds only what its samples are: their number, an identity for resume checks, a
batch :class:`~stoker.loader.batch.Layout` and a reader
(:class:`~stoker.loader.consumer.Reader`). :class:`~stoker.TokenDataset` is one
kind; the tests add a second.
"""

from __future__ import annotations

import json
import operator
import os
import uuid
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch
from torch.utils.data import IterableDataset

from stoker import intervals, plan
from stoker.errors import ConfigError, StateError
from stoker.loader import passes
from stoker.loader import state as st
from stoker.loader.batch import SAMPLE_ID, Layout
from stoker.loader.carry import Kept, PassCarry, pass_key
from stoker.loader.consumer import ConsumerSpec, Made, Reader, allocate, produce
from stoker.loader.distributed import Placement, detect
from stoker.loader.sources import StaticSource
from stoker.observe.export import arm, exported, worker_export

#: Samples a dataset iterated in its own process (or a torch DataLoader worker) reads
#: per call into its reader before it hands them out one by one.
ITEM_CHUNK = 64


def imported_before_forks() -> None:
    """What numpy imports on first use, imported in the process that makes a dataset,
    before its loader's (or a torch DataLoader's) workers are forked from it: numpy 2's
    ``np.unique`` imports ``numpy.ma`` on its first call (0.15 s on a 2-core machine),
    which every worker forked for a pass paid again, before its first batch."""
    import numpy.ma  # noqa: F401


class EpochPlan:
    """One pass of a rank over the static plan: where it starts (``progress``, whose
    ``consumed`` the loader advances as it hands batches out), the sources of its
    workers, and :meth:`finish`, which moves the dataset on to the next epoch."""

    def __init__(self, dataset: PlannedDataset, progress: st.Progress, rank: int) -> None:
        self.dataset, self.progress, self.rank = dataset, progress, rank

    @property
    def batches(self) -> int:
        """Batches left on this rank (the last may be short)."""
        p = self.progress
        return -(-(p.split.per_rank - p.consumed) // self.dataset.batch_size)

    def source(
        self, worker: int, num_workers: int, skip: int = 0, follow: bool = False
    ) -> StaticSource:
        """Worker ``worker`` of ``num_workers``'s positions, the next epoch's first ones
        planned behind them when the dataset asks for that (:attr:`plans_next_epoch`) or
        ``follow`` (the consumer's reader is kept for the next pass)."""
        ds = self.dataset
        following = None
        if ds.plans_next_epoch or follow:
            following = StaticSource(
                self.next_progress(), self.rank, worker, num_workers, ds.batch_size
            )
        return StaticSource(
            self.progress, self.rank, worker, num_workers, ds.batch_size, skip, following
        )

    def next_progress(self) -> st.Progress:
        """Where the next epoch's pass starts once this one has read the whole epoch."""
        ds, p = self.dataset, self.progress
        return st.Progress(
            p.epoch + 1,
            p.split.next_epoch_set(p.epoch, ds.num_samples, ds.drop_remainder),
            p.world,
            p.chunk,
        )

    def spec(
        self, num_workers: int, batch_size: int | None = None, skip: int = 0, carry: bool = False
    ) -> ConsumerSpec:
        """What each of ``num_workers`` consumers of this pass runs; with ``carry`` (its
        one consumer runs in this process), the consumer's planner and reader are
        adopted from the pass before and kept for the next (:mod:`stoker.loader.carry`)
        where the dataset's readers read any epoch."""
        ds = self.dataset
        n = max(1, num_workers)
        carried: PassCarry | None = None
        if carry and ds.reader_spans_epochs:
            stream = ds.stream_identity()
            this = pass_key(self.progress, self.rank, n, ds.batch_size, stream)
            after = pass_key(self.next_progress(), self.rank, n, ds.batch_size, stream)
            carried = PassCarry(ds._kept, this, after)
        else:
            ds._kept.release()  # (workers of their own, or another kind of pass)
        follow = carried is not None
        return ConsumerSpec(
            source=lambda w: self.source(w, n, skip, follow),
            samples=ds.stream().samples,
            reader=ds.open_reader,
            batch_size=batch_size or ds.batch_size,
            carry=carried,
        )

    def finish(self) -> None:
        """The pass read the whole epoch: the dataset goes on to the next."""
        self.dataset._finish_epoch(self.progress)


class PlannedDataset(IterableDataset):  # type: ignore[type-arg]
    """The kind-independent half of a stoker dataset (see the module docstring).

    A subclass sets ``num_samples``, ``batch_size``, ``shuffle_config`` (resolved),
    ``drop_remainder``, ``rank``, ``world_size`` and ``name`` (how messages name
    it), and implements :meth:`identity`, :attr:`layout` and :meth:`open_reader`;
    then calls :meth:`_init_epochs`.
    """

    num_samples: int
    batch_size: int
    shuffle_config: plan.ShuffleConfig
    drop_remainder: bool
    rank: int | None
    world_size: int | None
    name: str
    #: Plan (prefetch) the next epoch's first samples at the end of this one: only
    #: worth it where what is prefetched outlives the reader (a node agent).
    plans_next_epoch: bool = False
    #: Whether a coordinator's leases can feed it (positions it maps one by one).
    coordinated: bool = True
    #: Whether its reader reads the samples of any epoch (a token sample is the same
    #: whatever the epoch; an augmented record is not), so that a pass in the process
    #: that uses its batches keeps its reader for the next (:mod:`stoker.loader.carry`).
    reader_spans_epochs: bool = False

    # -- what a kind supplies ----------------------------------------------------
    def identity(self) -> dict[str, Any]:
        """What a state must match to resume here (which data, which order)."""
        raise NotImplementedError

    @property
    def layout(self) -> Layout:
        """What a batch of this dataset holds."""
        raise NotImplementedError

    def open_reader(self, epoch: int = 0, decoding: int | None = None) -> Reader:
        """A reader of this dataset's samples of epoch ``epoch`` (one per consumer; close
        it when done); ``decoding``: how many of its units of storage (blocks) it decodes
        at once (default: the reader's own choice)."""
        raise NotImplementedError

    def locality(self) -> dict[str, Any]:
        """How this rank's consumers describe their node's cache to the coordinator
        (``node`` and ``local(epoch)``; see :class:`~stoker.coordinator.consumer.LeaseStream`)."""
        return {}

    def relay(self) -> str | None:
        """The socket of the node agent that carries this rank's coordinator calls with
        its node's others (:mod:`stoker.coordinator.relay`); None: each process makes its
        own."""
        return None

    def holds(self) -> Callable[[np.ndarray], np.ndarray] | None:
        """With a node agent: a test of this dataset's sample ids, whether the node's
        cache holds every block each is read from (what the agent holds when this is
        called); None without one. A mixture's locality asks its sources."""
        return None

    def transfer_dtypes(self) -> dict[str, torch.dtype]:
        """The dtypes a device tier should copy fields in (narrower than the layout's)."""
        return {}

    # -- the plan ------------------------------------------------------------------
    def _init_epochs(self) -> None:
        self._epoch = 0
        self._next_set: np.ndarray | None = None  # carried set of the epoch after the last one
        self._pending: dict[str, Any] | None = None  # a loaded state, for the next iteration
        self._finished: dict[str, Any] | None = None  # a worker's state after its epoch ended
        self._progress: st.Progress | None = None
        self._worker: dict[str, int] | None = None
        self._pass_key = uuid.uuid4().hex  # names this dataset's epochs in loader.passes
        self._kept = Kept()  # a pass's reader kept for the next (stoker.loader.carry)
        arm()  # DataLoader workers iterating this dataset export their counts to this process
        imported_before_forks()

    def stream(self) -> plan.Stream:
        """Stream positions -> sample ids (the pure plan; a new one each call, with its
        own cache of epoch orders)."""
        return plan.Stream(self.num_samples, self.shuffle_config)

    def lease_stream(self) -> Any:
        """Positions -> sample ids of the epochs a coordinator hands out (what
        :meth:`stream_identity` describes): :meth:`stream`, unless a kind's stream
        depends on where this process stands."""
        return self.stream()

    def stream_identity(self) -> str:
        """How this dataset maps positions to samples, as JSON; the coordinator checks
        that every rank's consumers agree."""
        return json.dumps(self.identity(), sort_keys=True)

    def adoption(self, theirs: str, epoch: int) -> tuple[int, Callable[[], None]] | None:
        """Before a coordinator-fed restore into ``epoch``: whether this dataset can map
        positions so that they continue the state's stream ``theirs`` though it differs
        (a mixture: the world its plan was made on, the weights it had until the epoch
        ends): ``(num_samples then, take)``, ``take()`` making it so once the rest of the
        state is checked; None (the default) when it cannot."""
        return None

    def stream_change(self, theirs: str) -> str:
        """Why a coordinator's positions mapped as ``theirs`` (a :meth:`stream_identity`)
        cannot be this dataset's: the message of the refusal."""
        return f"the state's data stream {theirs} is not this dataset's {self.stream_identity()}"

    def placement(self) -> Placement:
        """This process's rank, world, local rank and DataLoader worker."""
        return detect(self.rank, self.world_size)

    def set_epoch(self, epoch: int) -> None:
        """Run epoch ``epoch`` next (like DistributedSampler.set_epoch).

        A state loaded for the same epoch stays in force; for another epoch it is dropped.
        """
        epoch = operator.index(epoch)
        if epoch < 0:
            raise ConfigError(f"epoch must be >= 0, got {epoch}")
        self._pass_key = uuid.uuid4().hex  # what the workers of later passes run anew
        if epoch != self._epoch:
            self._kept.release()
            self._next_set = None
            self._pending = None
            self._finished = None
            self._progress = None  # a pass broken off in another epoch is not continued
            self._worker = None
        self._epoch = epoch

    @property
    def epoch(self) -> int:
        return self._epoch

    def release_readers(self) -> None:
        """Close the reader a finished pass kept for the next (:mod:`stoker.loader.carry`):
        its decoded samples and threads go now instead of at the next pass."""
        self._kept.release()

    def _begin(self, pl: Placement) -> tuple[st.Progress, int]:
        """Progress to iterate and how many of this worker's samples to skip.

        A pass that was broken off (the caller stopped iterating before the epoch's
        end) is continued from what it consumed, exactly as its :meth:`state_dict`
        would restore it; so is a loaded state. Otherwise the epoch starts afresh.
        """
        pending = self._pending
        if pending is None and self._progress is not None:
            worker = dict(self._worker) if self._worker is not None else None
            pending = self._make_state(self._progress, worker)
        if pending is not None:
            progress, worker = self._restore_state(pending, pl.world)
            skip = 0
            if worker is not None and (worker.get("worker"), worker.get("num_workers")) == (
                pl.worker,
                pl.num_workers,
            ):
                skip = int(worker.get("yielded", 0))
            return progress, skip
        if self._next_set is not None:
            epoch_set = self._next_set
        else:
            epoch_set = plan.first_epoch_set(
                self._epoch, self.num_samples, pl.world, self.drop_remainder
            )
        return st.Progress(self._epoch, epoch_set, pl.world, self.batch_size), 0

    def __len__(self) -> int:
        """Samples that iterating now delivers to this process (this rank, or this
        DataLoader worker): the rest of the epoch in progress (after a restore or a
        broken-off pass), else the whole of the next one."""
        pl = self.placement()
        progress, _ = self._begin(pl)
        n = progress.split.per_rank - progress.consumed
        return plan.worker_count(n, pl.worker, pl.num_workers, self.batch_size)

    def begin_epoch(self, pl: Placement | None = None) -> EpochPlan:
        """Start (or continue) this rank's pass of the epoch that runs next: the loader's
        way in. Advance ``plan.progress.consumed`` by what is handed out; call
        ``plan.finish()`` once the pass read the whole epoch."""
        plan_, _ = self._start(pl or self.placement())
        return plan_

    def _start(self, pl: Placement) -> tuple[EpochPlan, int]:
        self._claim_epoch()
        progress, skip = self._begin(pl)
        self._finished = None
        self._pending = None
        self._epoch = progress.epoch
        self._progress = progress
        self._worker = (
            {"worker": pl.worker, "num_workers": pl.num_workers, "yielded": skip}
            if pl.num_workers > 1
            else None
        )
        if pl.num_workers == 1 and skip:
            progress.consumed += skip
        return EpochPlan(self, progress, pl.rank), skip

    def _finish_epoch(self, progress: st.Progress) -> None:
        if self._worker is not None:
            # inside a DataLoader worker, a state taken now (torchdata's StatefulDataLoader
            # snapshots after the generator ends) must still describe the finished epoch
            self._finished = self._make_state(progress, dict(self._worker))
        self._next_set = progress.split.next_epoch_set(
            progress.epoch, self.num_samples, self.drop_remainder
        )
        self._epoch = progress.epoch + 1
        self._progress = None
        self._worker = None

    def _claim_epoch(self) -> None:
        """In a torch DataLoader worker, run an epoch no earlier iteration of the loader
        ran (:mod:`stoker.loader.passes`): the main process never learns what its
        workers consumed, so iterating it again starts the next epoch."""
        from torch.utils.data import get_worker_info

        info = get_worker_info()
        if info is None:
            return
        parent, pass_id = os.getppid(), info.seed - info.id
        if self._pending is not None or self._progress is not None:
            # a loaded state, or a pass broken off in the main process: the first
            # DataLoader iteration continues it, later ones go on to the epochs after it
            if passes.claim(parent, f"{self._pass_key}-resume", 0, pass_id) == 0:
                return
            if self._pending is not None:
                done = self._pending["epoch"]
            else:
                assert self._progress is not None
                done = self._progress.epoch
            self._pending = self._progress = self._worker = self._finished = None
            self._epoch, self._next_set = int(done) + 1, None
        epoch = passes.claim(parent, self._pass_key, self._epoch, pass_id)
        if epoch != self._epoch:
            if info.id == 0:
                warnings.warn(
                    f"{self.name}: this DataLoader iteration runs epoch {epoch}: epoch "
                    f"{self._epoch} was run by an earlier iteration of the same loader (its "
                    "workers cannot know what was consumed, so it is not run twice); call "
                    "set_epoch() before each epoch, or use stoker.TokenLoader or torchdata's "
                    "StatefulDataLoader to continue a broken-off epoch",
                    RuntimeWarning,
                    stacklevel=3,
                )
            self._epoch = epoch
            self._next_set = None

    # -- iteration -------------------------------------------------------------
    def __iter__(self) -> Iterator[dict[str, Any]]:
        from torch.utils.data import get_worker_info

        if get_worker_info() is None:
            return self._samples()
        # a torch DataLoader worker: its counts reach the parent's /metrics by file
        pl = self.placement()
        return exported(self._samples(), worker_export(pl.rank, pl.worker))

    def _samples(self) -> Iterator[dict[str, Any]]:
        """One sample at a time: the consumer loop in this process, :data:`ITEM_CHUNK`
        rows per read."""
        from torch.utils.data import get_worker_info

        pl = self.placement()
        epoch, skip = self._start(pl)
        progress = epoch.progress
        spec = epoch.spec(pl.num_workers, ITEM_CHUNK, skip, carry=get_worker_info() is None)
        count: Callable[[], None]
        if self._worker is not None:
            worker = self._worker

            def count() -> None:
                worker["yielded"] += 1

        else:

            def count() -> None:
                progress.consumed += 1

        for event in produce(spec, pl.worker, allocate(self.layout)):
            if not isinstance(event, Made) or event.arrays is None:
                continue  # Began
            arrays = event.arrays
            ids = arrays[SAMPLE_ID].tolist()
            rest = [(k, torch.from_numpy(v)) for k, v in arrays.items() if k != SAMPLE_ID]
            for i, sid in enumerate(ids):
                item: dict[str, Any] = {k: v[i] for k, v in rest}
                item[SAMPLE_ID] = sid
                count()
                yield item
        epoch.finish()

    # -- state -------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """A small, exact snapshot of how far this stream got (see stoker.loader.state)."""
        if self._pending is not None:
            return dict(self._pending)
        if self._finished is not None:
            return dict(self._finished)
        progress = self._progress
        if progress is None:
            pl = self.placement()
            progress, _ = self._begin(pl)
        worker = dict(self._worker) if self._worker is not None else None
        return self._make_state(progress, worker)

    def _make_state(self, progress: st.Progress, worker: dict[str, int] | None) -> dict[str, Any]:
        """The state of ``progress`` (and a DataLoader worker's count)."""
        return st.build(self.identity(), self.drop_remainder, progress, worker)

    def _restore_state(
        self, state: dict[str, Any], world: int
    ) -> tuple[st.Progress, dict[str, int] | None]:
        """The progress a (checked) state continues from on ``world`` ranks."""
        return st.restore(state, world, self.batch_size)

    def state_snapshot(self) -> Callable[[], dict[str, Any]]:
        """:meth:`state_dict` as of now, cheap enough to take after every batch: the
        position is copied now, the state made when the result is called."""
        p = self._progress
        if self._pending is not None or self._finished is not None or p is None:
            state = self.state_dict()
            return lambda: dict(state)
        progress = st.Progress(p.epoch, p.epoch_set, p.world, p.chunk, p.consumed)
        worker = dict(self._worker) if self._worker is not None else None
        return lambda: self._make_state(progress, worker)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state`` at the next iteration. Raises StateError if it does not fit."""
        st.check(state, self.identity())
        if state["drop_remainder"] != self.drop_remainder:
            raise StateError(
                f"state was saved with drop_remainder={state['drop_remainder']}, "
                f"but this dataset has drop_remainder={self.drop_remainder}"
            )
        self._pending = dict(state)
        self._pass_key = uuid.uuid4().hex
        self._kept.release()
        self._finished = None
        self._epoch = state["epoch"]
        self._next_set = None
        self._progress = None

    def epoch_positions(self) -> np.ndarray:
        """Interval set of stream positions of the epoch that would run next."""
        progress, _ = self._begin(self.placement())
        return intervals.make(progress.epoch_set)
