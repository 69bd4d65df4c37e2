"""``Mixture``: several datasets read as one, at set weights, with an exact state.

A :class:`Mixture` is a :class:`~stoker.loader.planned.PlannedDataset` like any
other kind: the torch DataLoader and :class:`~stoker.TokenLoader` read it as
they read a :class:`~stoker.TokenDataset`. Its plan is the
:class:`~stoker.mixture.plan.MixPlan` (which sources each global step's samples
come from, each source through its own epochs), its positions map to the
sources' sample ids by :class:`~stoker.mixture.stream.MixStream`, and its
reader (:class:`MixReader`) hands each source's ids to that source's own reader,
planned ahead as that source's alone. A batch holds the sources' fields and
``source`` (the index of the row's source in :attr:`Mixture.names`);
``sample_id`` encodes the source too (:func:`~stoker.mixture.stream.decode`).

The state is the plan's (a few integers per source, whatever the position; see
:mod:`stoker.mixture.plan`) beside the mixture's epoch and the rank's count in it.
"""

from __future__ import annotations

import functools
import json
import math
import uuid
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch

from stoker import intervals
from stoker.errors import ConfigError, StateError
from stoker.loader import state as st
from stoker.loader.arena import decoding_threads
from stoker.loader.batch import SAMPLE_ID, Field, Layout
from stoker.loader.consumer import Reader
from stoker.loader.planned import PlannedDataset
from stoker.mixture.deal import rank_counts
from stoker.mixture.plan import MixPlan, schedule_of, weights_json
from stoker.mixture.reader import SOURCE, MixReader
from stoker.mixture.schedule import WeightSchedule
from stoker.mixture.stream import (
    MAX_SOURCE_SAMPLES,
    MAX_SOURCES,
    EpochSets,
    EpochSizes,
    JoinedStream,
    MixStream,
    decode,
    epoch_set,
    from_description,
    reindexed,
    share_start,
)

STATE_VERSION = 1
_MAX_HORIZON = 1 << 16


class Mixture(PlannedDataset):
    """Samples of ``sources`` (name -> dataset, every one of the same layout: token
    datasets of one ``seq_len``) at ``weights``: a mapping name -> weight (any
    scale), or a :class:`~stoker.WeightSchedule` of weights over global steps
    (piecewise constant or linear).

    Every global step (``batch_size`` samples on each of the world's ranks) holds
    each source's share rounded by the quota method, so a source's count over the
    run never strays a sample from its target (see :mod:`stoker.mixture.apportion`);
    every rank gets ``batch_size`` samples a step. Each source runs its own epochs, in
    its own order (its ``shuffle``): a small one starts its next epoch when it runs
    out, a large one need not finish. The sources' own ``batch_size`` is not used.

    An epoch of the mixture is ``steps_per_epoch`` steps (default: as many as the
    sources' samples together fill), what ``len()``, ``set_epoch`` and a loader's
    passes count; the plan runs on across epochs.

    :meth:`state_dict` is small whatever the position; :meth:`load_state_dict` takes
    a state saved with other weights (each source continues from where it stood,
    under the new weights from the next step), with a source added (it starts at its
    beginning) or removed (what was taken of the others stands), and on another world
    size (what each source's old ranks had not taken of its current epoch is split
    again). A state taken inside a step (a DataLoader iterated sample by sample) or
    inside a DataLoader worker restores only onto the same sources, weights and world
    size.

    A coordinator's leases feed it too (``TokenLoader(mixture, coordinator=...)``): they
    are stretches of its epoch's positions, so every sample of an epoch comes once (the
    static plan's samples). Its checkpoints restore onto another world (the positions stay
    those of the plan on the world it began on) and with other weights, which hold from
    the next epoch (see :meth:`adoption`).
    """

    def __init__(
        self,
        sources: Mapping[str, PlannedDataset],
        weights: Mapping[str, float] | WeightSchedule,
        *,
        batch_size: int,
        steps_per_epoch: int | None = None,
        rank: int | None = None,
        world_size: int | None = None,
    ) -> None:
        super().__init__()
        if not sources:
            raise ConfigError("a mixture needs at least one source")
        if batch_size < 1:
            raise ConfigError(f"batch_size must be >= 1, got {batch_size}")
        self.sources = dict(sources)
        self.names = tuple(self.sources)
        given = weights if isinstance(weights, WeightSchedule) else WeightSchedule.constant(weights)
        if set(given.names) != set(self.names):
            raise ConfigError(
                f"weights name {sorted(given.names)}, the sources are {sorted(self.names)}"
            )
        schedule = given.reordered(self.names)
        self.schedule = schedule
        first = self.sources[self.names[0]]
        for n, ds in self.sources.items():
            if not isinstance(ds, PlannedDataset):
                raise ConfigError(f"source {n!r} is a {type(ds).__name__}, not a stoker dataset")
            stage = getattr(ds, "batch_stage", None)
            if stage is not None and stage() is not None:
                raise ConfigError(
                    f"source {n!r} finishes its batches in the loader's process "
                    "(decode='dali'): a mixture's sources decode in the workers"
                )
            if dict(ds.layout) != dict(first.layout):
                raise ConfigError(
                    f"source {n!r} holds {dict(ds.layout)}, source {self.names[0]!r} "
                    f"{dict(first.layout)}: a mixture's sources must hold the same fields "
                    "(token datasets of one seq_len)"
                )
        if len(self.names) > MAX_SOURCES:
            raise ConfigError(f"a mixture has {MAX_SOURCES} sources at most, not {len(self.names)}")
        for n, ds in self.sources.items():
            if ds.num_samples > MAX_SOURCE_SAMPLES:
                raise ConfigError(
                    f"source {n!r} has {ds.num_samples:,} samples; a mixture's source has "
                    f"{MAX_SOURCE_SAMPLES:,} at most (2**40: the bits of its sample ids)"
                )
        self.batch_size = batch_size
        self.rank, self.world_size = rank, world_size
        self._world = self.placement().world
        self.sizes = [self.sources[n].num_samples for n in self.names]
        G = batch_size * self._world
        given_steps = steps_per_epoch is not None
        if steps_per_epoch is None:
            steps_per_epoch = max(1, sum(self.sizes) // G)
        if steps_per_epoch < 1:
            raise ConfigError(f"steps_per_epoch must be >= 1, got {steps_per_epoch}")
        self.steps_per_epoch = steps_per_epoch
        self._given_steps = given_steps
        #: after a coordinator-fed restore that changed the weights: the stream before
        #: and the epoch the new weights begin in (see :meth:`adoption`)
        self._origin: dict[str, Any] | None = None
        self._weights_json: dict[str, Any] | None = None  # (the same, in the run's order)
        self.num_samples = steps_per_epoch * G
        self.shuffle_config = first.shuffle_config  # (unused: the plan is the mixture's)
        self.drop_remainder = True  # an epoch is whole steps: nothing is left over
        self.name = f"mixture({', '.join(self.names)})"
        self._anchor: dict[str, Any] | None = None  # the plan's state where walks start
        self._sets: dict[int, tuple[int, np.ndarray]] = {}  # sources' epochs not whole
        self._target_key: Any = None  # (count_sources' weights, kept)
        #: (the step the origin's new weights begin at, the weights before it)
        self._before: tuple[int, WeightSchedule] | None = None
        self._target: dict[str, float] = {}
        self._walker: MixPlan | None = None
        self._init_epochs()

    # -- the plan ----------------------------------------------------------------------
    def _make_plan(self, sets: EpochSets | None = None) -> MixPlan:
        """A fresh plan, its sources' epochs those of ``sets`` (default: this mixture's)."""
        sizes = EpochSizes(tuple(self.sizes), dict(self._sets if sets is None else sets))
        return MixPlan(self.schedule, self.batch_size, self._world, sizes)

    def _plan_at(self, step: int) -> MixPlan:
        """This process's plan, walked to global step ``step``."""
        w = self._walker
        if w is None or w.step > step:
            w = self._make_plan()
            if self._anchor is not None:
                w.load_state_dict(self._anchor)
            if w.step > step:
                raise StateError(f"{self.name}: step {step} is before the state's step {w.step}")
            self._walker = w
        w.skip_to(step)
        return w

    def stream(self) -> Any:  # a MixStream: positions -> mixture sample ids
        p = self._progress
        step = 0 if p is None else p.epoch * self.steps_per_epoch + p.consumed // self.batch_size
        base = self._plan_at(step).state_dict()
        return MixStream(
            self._make_plan,
            base,
            self.steps_per_epoch,
            [self.sources[n].stream().samples for n in self.names],
            self.sizes,
            self._sets,
        )

    def lease_stream(self) -> Any:
        """The plan from step 0, as its description says (after a restore that changed
        the weights, the old plan's epochs, then the new weights): whatever this mixture
        read before or had loaded (a static state), a coordinator's positions map as
        every rank's consumers map them; sample ids encode the source by its index in
        :attr:`names`."""
        desc = self._description()
        return reindexed(self._described(desc), desc["weights"]["names"], self.names)

    def relay(self) -> str | None:
        """Its sources' node agent, when they read through one."""
        sockets = {self.sources[n].relay() for n in self.names}
        return sockets.pop() if len(sockets) == 1 else None

    def locality(self) -> dict[str, Any]:
        """With its sources read through one node agent: that node, and the positions of
        an epoch whose windows (whole steps of a rank, as long as the least lease a
        mixture takes: :func:`~stoker.coordinator.locality.lease_size`) the node holds most of (:mod:`stoker.mixture.locality`); else nothing."""
        nodes = {self.sources[n].locality().get("node") for n in self.names}
        if len(nodes) != 1 or None in nodes:
            return {}
        from stoker.coordinator.locality import lease_size
        from stoker.mixture.locality import local_ranges

        def local(epoch: int) -> list[tuple[int, int]]:
            asked = [self.sources[n].holds() for n in self.names]
            holds = [h for h in asked if h is not None]
            if len(holds) < len(asked):
                return []
            stream = self.lease_stream()
            return local_ranges(
                stream.step_ids,
                epoch,
                self.steps_per_epoch,
                self._world,
                self.batch_size,
                holds,
                window=lease_size(self.stream_identity(), 0),
            )

        return {"node": nodes.pop(), "local": local}

    def stream_identity(self) -> str:
        """How positions map to samples, which a coordinator's consumers must agree on: the
        sources, and the plan's weights and world too (a coordinator hands out positions
        of an epoch planned as on this world, under these weights)."""
        return json.dumps(self._description(), sort_keys=True)

    def _description(self) -> dict[str, Any]:
        """:meth:`stream_identity`, as the object it is the JSON of."""
        return {
            **self.identity(),
            "weights": self._weights_json or weights_json(self.schedule),
            "world": self._world,
            **({"origin": self._origin} if self._origin else {}),
        }

    def adoption(self, theirs: str, epoch: int) -> tuple[int, Callable[[], None]] | None:
        """How this mixture would map a coordinator's positions as the stream ``theirs``
        (a checkpoint's, restored into ``epoch``) did, where it differs from this
        mixture's in the world its plan was made on (and the default ``steps_per_epoch``
        that follows from it) or in the weights: ``(num_samples, take)``, ``take()``
        making it so (the loader calls it once the rest of the state is checked), or None.

        Its positions stay the epochs of a plan on that many ranks, whatever this job's
        world (an elastic restore: every rank then takes ``num_samples // world`` of each
        epoch, the rest dropped). New weights hold from the first step of the next epoch
        (``epoch``'s positions were being handed out under the old ones), each source going
        on from where the old plan left it. Anything else that differs (the sources, the
        batch size, a given ``steps_per_epoch``) is left for the check to name."""
        try:
            old = json.loads(theirs)
            mine = self._description()
            lanes, spe = old["world"], old["steps_per_epoch"]
            same = all(_canon(old.get(k)) == _canon(mine[k]) for k in ("mixture", "batch_size"))
            reweighted = not _same_weights(old["weights"], mine["weights"])
        except (ValueError, TypeError, KeyError, AttributeError, RecursionError):
            return None
        ok = all(isinstance(x, int) and not isinstance(x, bool) and x >= 1 for x in (lanes, spe))
        if not same or not ok or (self._given_steps and spe != self.steps_per_epoch):
            return None
        if reweighted:
            # the plan's state where the new weights begin, worked out once (a walk of the
            # old plan), carried in the description: every consumer and replay starts there
            before = self._described(old).state_at((epoch + 1) * spe)
            origin = {"stream": old, "epoch": epoch + 1, "state": before}
        else:
            origin = old.get("origin")  # an earlier change of weights, carried on

        def take() -> None:
            self._world, self.steps_per_epoch = lanes, spe
            self.num_samples = spe * self.batch_size * lanes
            self._anchor = self._walker = None
            self._origin = origin
            self._before = (
                None
                if origin is None
                else (int(origin["epoch"]) * spe, schedule_of(origin["stream"]["weights"]))
            )
            if not reweighted:  # (the names' order of the run's plan, in its description)
                self._weights_json = old["weights"]

        return spe * self.batch_size * lanes, take

    def _described(self, desc: dict[str, Any]) -> MixStream | JoinedStream:
        """The position map of a stream description of this mixture's sources."""
        names = desc["weights"]["names"]
        return from_description(
            desc,
            [self.sources[n].stream().samples for n in names],
            [self.sources[n].num_samples for n in names],
        )

    def stream_change(self, theirs: str) -> str:
        mine = self._description()
        try:
            old = json.loads(theirs)
            what = [k for k in mine if _canon(old.get(k)) != _canon(mine[k])]
        except (ValueError, TypeError, AttributeError, RecursionError):
            old, what = {}, []
        said = {
            "mixture": "other sources",
            "weights": "other weights",
            "world": f"{old.get('world')} ranks (this job has {self._world})",
            "batch_size": "another batch size",
            "steps_per_epoch": "another number of steps an epoch",
        }
        why = ", ".join(said.get(k, k) for k in what) or "another mixture"
        return (
            f"{self.name}: the coordinator's checkpoint was planned with {why}; a "
            "coordinator-fed mixture restores onto the same sources and batch size, and with "
            "the same steps an epoch when they are given (its positions stay those of the "
            "plan its coordinator began with; other weights or another world are taken)"
        )

    def identity(self) -> dict[str, Any]:
        return {
            "mixture": {n: self.sources[n].identity() for n in self.names},
            "batch_size": self.batch_size,
            "steps_per_epoch": self.steps_per_epoch,
        }

    # -- what a batch holds, and its reader ----------------------------------------------
    @property
    def reader_spans_epochs(self) -> bool:  # type: ignore[override]
        """Whether every source's reader reads any epoch's samples (the sources' epochs
        are the mixture's sample ids' own): then a pass keeps its reader for the next."""
        return all(self.sources[n].reader_spans_epochs for n in self.names)

    @property
    def layout(self) -> Layout:
        fields = {k: f for k, f in self.sources[self.names[0]].layout.items() if k != SAMPLE_ID}
        return Layout({**fields, SOURCE: Field(torch.int64)})

    def open_reader(self, epoch: int = 0, decoding: int | None = None) -> MixReader:
        """The sources' readers, each opened for the mixture's ``epoch``; a source runs
        epochs of its own, which the mixture's sample ids carry, and a reader whose samples
        are random (augmented records: ``per_row_epochs``) draws each row from its
        source's epoch."""
        readers: list[Reader] = []
        # the sources' readers decode as many blocks at once as one source's would, shared
        # out (at least one each): a decode thread each of three sources, not two, ran a
        # pass about 6% faster on 2 cores, its first batch about 20% sooner
        budget = decoding_threads() if decoding is None else decoding
        each = max(1, budget // len(self.names))
        try:
            for n in self.names:
                readers.append(self.sources[n].open_reader(epoch, decoding=each))
        except BaseException:
            for r in readers:
                r.close()
            raise
        # a source of weight w sees about w of the positions planned: plan far enough
        # ahead that each sees its own reader's horizon
        least = [min(ws[i] for _, ws in self.schedule.points) for i in range(len(self.names))]
        need = [int(r.horizon / w) for r, w in zip(readers, least, strict=True) if w > 0]
        horizon = min(_MAX_HORIZON, max([*need, *(r.horizon for r in readers)]))
        # each source's rows are read ahead in the narrow dtypes they are stored in
        layouts = [
            self.sources[n].layout.with_dtypes(self.sources[n].transfer_dtypes())
            for n in self.names
        ]
        return MixReader(readers, layouts, self.layout, horizon, names=list(self.names))

    def transfer_dtypes(self) -> dict[str, torch.dtype]:
        """Per field, the narrowest dtype every source's values fit (their promotion)."""
        per = [self.sources[n].transfer_dtypes() for n in self.names]
        keys = set(per[0]).intersection(*per[1:])
        return {k: functools.reduce(torch.promote_types, (d[k] for d in per)) for k in keys}

    # -- state -------------------------------------------------------------------------
    def _make_state(
        self,
        progress: st.Progress,
        worker: dict[str, int] | None,
        plan: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        step = progress.epoch * self.steps_per_epoch + progress.consumed // self.batch_size
        return {
            "stoker_mixture": STATE_VERSION,
            **self.identity(),
            "world": int(progress.world),
            "epoch": int(progress.epoch),
            "consumed": int(progress.consumed),
            "worker": None if worker is None else {k: int(v) for k, v in worker.items()},
            "plan": plan if plan is not None else self._plan_at(step).state_dict(),
            "epoch_sets": {
                self.names[i]: [e, intervals.to_list(iv)] for i, (e, iv) in self._sets.items()
            },
        }

    def _restore_state(
        self, state: dict[str, Any], world: int
    ) -> tuple[st.Progress, dict[str, int] | None]:
        if state["world"] != world:
            raise StateError(
                f"{self.name}: the state was saved on {state['world']} ranks, this job has "
                f"{world}; a mixture's state restores on the world size it was saved on"
            )
        epoch, consumed = state["epoch"], state["consumed"]
        N = self.num_samples
        epoch_set = intervals.make([(epoch * N, (epoch + 1) * N)])
        return st.Progress(epoch, epoch_set, world, self.batch_size, consumed), state["worker"]

    def state_snapshot(self) -> Callable[[], dict[str, Any]]:
        """:meth:`state_dict` as of now; the plan's part is taken now when this process's
        plan stands at the step (a loader's does: it follows the batches handed out),
        else worked out when the result is called."""
        p = self._progress
        if self._pending is not None or self._finished is not None or p is None:
            return super().state_snapshot()
        step = p.epoch * self.steps_per_epoch + p.consumed // self.batch_size
        w = self._walker
        if w is None or w.step != step:
            return super().state_snapshot()
        progress = st.Progress(p.epoch, p.epoch_set, p.world, p.chunk, p.consumed)
        worker = dict(self._worker) if self._worker is not None else None
        plan = w.state_dict()
        return lambda: self._make_state(progress, worker, plan)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state`` at the next iteration (see the class docstring for what
        may change). Raises :class:`~stoker.StateError`, naming the field, for a state
        that does not fit."""
        where = self.name
        if not isinstance(state, dict) or state.get("stoker_mixture") != STATE_VERSION:
            raise StateError(
                f"{where}: not a mixture's state of version {STATE_VERSION} (a "
                "dataset's state loads into that dataset, not a mixture)"
            )
        self._kept.release()  # (planned as this mixture's stream was before the state)
        saved = state.get("mixture")
        if not isinstance(saved, dict):
            raise StateError(f"{where}: state field 'mixture' must be an object")
        for n in self.names:
            if n not in saved:
                continue  # a source added at this restore
            mine = self.sources[n].identity()
            if not isinstance(saved[n], dict):
                raise StateError(f"{where}: state field 'mixture.{n}' must be an object")
            if _canon(saved[n]) != _canon(mine):
                diff = sorted(
                    k for k in {*saved[n], *mine} if _canon(saved[n].get(k)) != _canon(mine.get(k))
                )
                raise StateError(
                    f"{where}: source {n!r} is not the one the state was saved with "
                    f"(differs in {', '.join(diff)})"
                )
        B, field = self.batch_size, f"{where}: state"
        for key in ("batch_size", "steps_per_epoch", "world"):
            st.integer_field(state, key, 1, st.MAX_POSITION, field)
        for key in ("epoch", "consumed"):
            st.integer_field(state, key, 0, st.MAX_POSITION, field)
        if state["batch_size"] != B:
            raise StateError(
                f"{where}: the state was saved with batch_size {state['batch_size']}, this "
                f"mixture has {B}"
            )
        worker = state.get("worker")
        share = state["steps_per_epoch"] * B  # a rank's samples of an epoch, when saved
        st.check_worker(worker, share, min(state["consumed"], share), B, field)
        plan_state = state.get("plan")
        if not isinstance(plan_state, dict):
            raise StateError(f"{where}: state field 'plan' must be an object")
        sets = _saved_sets(state.get("epoch_sets"), self.names, self.sizes, where)
        regrouped = state["world"] != self._world
        if regrouped:  # each source's epoch split again: what is left of it, over this world
            plan_state, sets = _regroup(plan_state, sets, self.names, self.sizes, where)
        trial = self._make_plan(sets)
        exact = trial.load_state_dict(plan_state, regrouped=regrouped)  # names the field
        step = trial.step
        old_spe, offset = state["steps_per_epoch"], state["consumed"] % B
        if state["epoch"] * old_spe + state["consumed"] // B != step or state["consumed"] > (
            old_spe * B
        ):
            raise StateError(
                f"{where}: state fields 'epoch' {state['epoch']} and 'consumed' "
                f"{state['consumed']} do not reach the plan's step {step} at "
                f"{old_spe} steps an epoch"
            )
        if not exact and (offset or worker is not None):
            raise StateError(
                f"{where}: this state was taken inside a step (after {offset} of its "
                f"{B} samples) or inside a DataLoader worker, and restores only onto the same "
                "sources, weights and world size; take the state from the loader (its states "
                "fall between steps) to change them"
            )
        if worker is not None and old_spe != self.steps_per_epoch:
            raise StateError(
                f"{where}: this state was taken inside a DataLoader worker with "
                f"{old_spe} steps an epoch and restores only with as many (this mixture "
                f"has {self.steps_per_epoch})"
            )
        epoch, in_epoch = divmod(step, self.steps_per_epoch)
        consumed = in_epoch * B + offset
        self._sets = sets
        pending = {
            **state,
            **self.identity(),
            "epoch": epoch,
            "consumed": consumed,
            "world": self._world,
            "worker": worker,
            "plan": trial.state_dict(),
            "epoch_sets": {
                self.names[i]: [e, intervals.to_list(iv)] for i, (e, iv) in sets.items()
            },
        }
        self._anchor = trial.state_dict()
        self._walker = None
        self._pending = pending
        self._pass_key = uuid.uuid4().hex
        self._finished = None
        self._epoch = epoch
        self._next_set = None
        self._progress = None

    def count_sources(
        self, batch: Mapping[str, torch.Tensor], step: int | None = None
    ) -> tuple[list[int], int, dict[str, float]]:
        """A batch's samples per source (by index into :attr:`names`), the tokens a row
        holds, and the weights of global step ``step`` (default: the step now running;
        what a loader's per-source figures count; once a batch, so kept cheap)."""
        n = [0] * len(self.names)
        for i in batch[SOURCE].tolist():  # (a few rows: cheaper than a bincount in numpy)
            n[i] += 1
        tokens = batch.get("tokens")
        per_row = 0 if tokens is None or not any(n) else math.prod(tokens.shape[1:])
        if step is None:
            p = self._progress
            step = (
                0
                if p is None
                else p.epoch * self.steps_per_epoch + max(p.consumed - 1, 0) // self.batch_size
            )
        return n, per_row, self._targets(step)

    def _targets(self, step: int) -> dict[str, float]:
        """The weights of ``step`` by source name (kept while they stay the same): the
        schedule's, or, before the epoch a coordinator-fed restore's new weights begin in,
        the old plan's."""
        s, before = self.schedule, False
        if self._target_key == (False, -1) and self._before is None and len(s.points) == 1:
            return self._target  # (constant weights, worked out before: the same every step)
        if self._before is not None and step < self._before[0]:
            s, before = self._before[1], True
        i = s.segment(step)
        key = (before, step if s.linear and i + 1 < len(s.points) else -1 - i)
        if self._target_key != key:
            w = s.at(step)
            self._target_key = key
            self._target = {name: float(x) for name, x in zip(s.names, w, strict=True)}
        return self._target

    def lease_step(self, epoch: int, batch: int, batches: int) -> int:
        """The plan's global step a coordinator-fed rank's ``batch``-th batch (from 0) of
        ``epoch`` stands at, of its ``batches`` an epoch (its share of the epoch's
        positions: ``steps_per_epoch`` batches, unless the world is not the plan's)."""
        spe = self.steps_per_epoch
        return epoch * spe + min(spe - 1, batch * spe // max(1, batches))

    @staticmethod
    def source_of(sample_ids: np.ndarray) -> np.ndarray:
        """The source index (into :attr:`names`) of mixture sample ids."""
        return decode(sample_ids)[0]


def _saved_sets(
    raw: Any, names: tuple[str, ...], sizes: list[int], where: str
) -> dict[int, tuple[int, np.ndarray]]:
    """A state's ``epoch_sets`` (source -> [epoch, intervals]) of this mixture's sources,
    checked: each inside its epoch's stream range."""
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise StateError(f"{where}: state field 'epoch_sets' must be an object")
    out: dict[int, tuple[int, np.ndarray]] = {}
    for n, v in raw.items():
        field = f"epoch_sets.{n}"
        if not (isinstance(v, list) and len(v) == 2 and isinstance(v[0], int) and v[0] >= 0):
            raise StateError(f"{where}: state field {field!r} must be [epoch, intervals]")
        if n not in names:
            continue  # a source removed at this restore
        i = names.index(n)
        e, pairs = v
        lo, hi = e * sizes[i], (e + 1) * sizes[i]
        if not isinstance(pairs, list) or len(pairs) > st.MAX_INTERVALS or hi >= 1 << 62:
            raise StateError(f"{where}: state field {field!r} must be [epoch, intervals]")
        ok = all(
            isinstance(p, list)
            and len(p) == 2
            and all(isinstance(x, int) and not isinstance(x, bool) for x in p)
            and lo <= p[0] < p[1] <= hi
            for p in pairs
        )
        iv = intervals.make([(a, b) for a, b in pairs]) if ok else None
        if iv is None or len(iv) != len(pairs):  # out of range, empty, or overlapping
            raise StateError(
                f"{where}: state field {field!r} is not inside epoch {e}'s positions "
                f"[{lo}, {hi}) of source {n!r}"
            )
        if len(iv):
            out[i] = (e, iv)
    return out


def _regroup(
    plan_state: dict[str, Any],
    sets: EpochSets,
    names: tuple[str, ...],
    sizes: list[int],
    where: str,
) -> tuple[dict[str, Any], dict[int, tuple[int, np.ndarray]]]:
    """A plan state saved on another world size, made one of this world: every source's
    current epoch becomes what its old ranks had not taken of it (each rank a prefix of
    its contiguous share, of a length that follows from the source's count), dealt
    afresh from zero taken."""
    regime, saved = plan_state.get("regime"), plan_state.get("sources")
    if not isinstance(regime, dict) or not isinstance(saved, dict):
        raise StateError(f"{where}: state fields 'plan.regime' and 'plan.sources' must be objects")
    old_world = regime.get("world")
    if isinstance(old_world, bool) or not isinstance(old_world, int) or old_world < 1:
        raise StateError(f"{where}: state field 'plan.regime.world' must be an int >= 1")
    out_sources: dict[str, Any] = {}
    out_sets: dict[int, tuple[int, np.ndarray]] = {}
    for n, src in saved.items():
        if n not in names or not isinstance(src, dict):
            out_sources[n] = src  # removed (or malformed: the plan's check names it)
            continue
        i = names.index(n)
        e, taken = src.get("epoch"), src.get("taken")
        if not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in (e, taken)):
            raise StateError(
                f"{where}: state fields 'plan.sources.{n}.epoch' and 'taken' must be ints >= 0"
            )
        e, taken = int(e), int(taken)  # type: ignore[arg-type]
        if (e + 1) * sizes[i] >= 1 << 62:
            raise StateError(f"{where}: state field 'plan.sources.{n}.epoch' is out of range")
        iv = epoch_set(sizes[i], e, sets, i)
        size = intervals.size(iv)
        if taken >= size:
            raise StateError(
                f"{where}: state field 'plan.sources.{n}.taken' is {taken}, but its epoch "
                f"{e} deals {size} samples"
            )
        counts = rank_counts(taken, old_world)
        gone = [
            intervals.slice_ordered(iv, start, start + int(c))
            for start, c in ((share_start(size, old_world, r), counts[r]) for r in range(old_world))
        ]
        left = intervals.subtract(iv, intervals.make(np.concatenate([*gone, np.zeros((0, 2))])))
        out_sources[n] = {**src, "taken": 0}
        out_sets[i] = (e, left)
    return {**plan_state, "sources": out_sources}, out_sets


def _canon(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=int)


def _same_weights(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Whether two schedules' JSON (:func:`~stoker.mixture.plan.weights_json`) give every
    source the same weights at the same steps, whatever order they name the sources in."""
    if a.get("linear") != b.get("linear") or sorted(a["names"]) != sorted(b["names"]):
        return False
    if [p[0] for p in a["points"]] != [p[0] for p in b["points"]]:
        return False
    return all(
        dict(zip(a["names"], pa[1], strict=True)) == dict(zip(b["names"], pb[1], strict=True))
        for pa, pb in zip(a["points"], b["points"], strict=True)
    )
