"""``TokenLoader``: a rank's batches, from the one worker pool (:mod:`stoker.loader.pool`).

The loader is the small part on top of the pool. For the static plan it hands
out the pool's batches in order (round robin over the workers), counting each
as consumed when the caller takes it, and copies it out of its shared-memory
slot (or, with ``zero_copy=True``, hands out views that stay valid until the
next batch is requested) before the slot goes back. Fed by a coordinator, it
runs :class:`~stoker.loader.coordinated.CoordinatedEpoch` over the same pool:
confirms, holding back and re-cutting short batches.

With ``device=...`` the loader feeds its own device tier and *lends* the slots
instead (:mod:`stoker.pinned`): they hold tokens in the dtype they cross the
bus in (uint16 for a GPT-2-sized vocabulary, as the decoded blocks already
are), the main process page-locks them once the workers are forked, the device
tier copies each batch straight from its slot, and the slot goes back to its
worker once that copy's event completed.

Batches come out in the rank's sample order, the same order as
``DataLoader(TokenDataset(..., batch_size=B), batch_size=B)`` for any number
of workers, and the loader counts what the caller consumed, so
``state_dict()`` is exact and topology-free (it restores with another world
size or number of workers).
"""

from __future__ import annotations

import atexit
import functools
import os
import warnings
import weakref
from collections.abc import Callable, Generator, Iterator
from typing import TYPE_CHECKING, Any

import torch

from stoker.device.pinning import register
from stoker.errors import ConfigError, StateError, StokerError, WorkerError
from stoker.loader import state as st
from stoker.loader.batch import SAMPLE_ID
from stoker.loader.distributed import Placement
from stoker.loader.handout import Handout
from stoker.loader.planned import PlannedDataset
from stoker.loader.pool import WorkerPool
from stoker.observe.export import rank_stats
from stoker.observe.registry import LoaderStats, registry, timed
from stoker.observe.serving import serve_once
from stoker.pinned import Lent, Loans

if TYPE_CHECKING:
    from stoker.coordinator.client import CoordinatorClient
    from stoker.coordinator.embedded import Embedded
    from stoker.coordinator.leases import Config
    from stoker.device import DevicePrefetcher
    from stoker.loader.coordinated import CoordinatedEpoch

_DYNAMIC = {"stoker_state": st.STATE_VERSION, "mode": "coordinator"}
Register = Callable[[list[torch.Tensor]], Callable[[], None]]
Batch = dict[str, torch.Tensor]
Snapshot = Callable[[], dict[str, Any]]


class TokenLoader:
    """Batches of a :class:`TokenDataset` (its ``batch_size``), loaded by ``num_workers`` processes.

    Any :class:`~stoker.loader.planned.PlannedDataset` loads the same way: the batch
    holds what its reader's layout says (for tokens, as below).

    Each batch is a dict: ``tokens`` (B, seq_len + 1) int64, ``sample_id``
    (B,) int64 and ``doc_start_mask`` (B, seq_len + 1) bool. The last batch of
    an epoch may be shorter. Iterating again after the end of an epoch runs the next
    epoch; iterating again after breaking out of a loop continues the epoch from what
    was consumed (what :meth:`state_dict` says), with or without a coordinator and a
    device, so nothing is delivered twice.

    ``device`` (e.g. ``"cuda"``) puts each batch on that device before the
    training step asks, ``device_depth`` batches ahead, through
    :class:`~stoker.DevicePrefetcher`; the state still counts what training
    took. With workers the batches are copied to the device straight from
    their page-locked shared-memory slots, tokens narrow (no host copy; see
    :mod:`stoker.device`).

    ``metrics_port`` serves this process's metrics at ``/metrics`` on that port
    plus the local rank (off by default); :meth:`stats` gives the same stall
    and throughput figures in Python.

    With ``coordinator`` positions come from the coordinator's leases instead of
    the static plan (see :mod:`stoker.loader.coordinated`): work stealing between
    consumers, and exactly-once delivery when consumers fail. The epoch is the
    coordinator's. ``coordinator`` is a
    :class:`~stoker.coordinator.client.CoordinatorClient` of a running
    coordinator, or ``"rank0"``: rank 0 starts one and the other ranks find it
    (:mod:`stoker.coordinator.embedded`); ``coordinator_state`` is then its
    state URL (default: a fresh local directory) and ``coordinator_config`` its
    lease settings. ``state_dict()`` then asks the coordinator for a
    checkpoint of what every rank had handed out at this rank's count of
    batches, and carries it inline, so it restores on any number of ranks.
    """

    def __init__(
        self,
        dataset: PlannedDataset,
        num_workers: int = 0,
        *,
        prefetch: int = 4,
        zero_copy: bool = False,
        timeout: float = 300.0,
        coordinator: CoordinatorClient | str | None = None,
        coordinator_state: str | None = None,
        coordinator_config: Config | None = None,
        metrics_port: int | None = None,
        device: torch.device | str | None = None,
        device_depth: int = 2,
    ) -> None:
        if num_workers < 0:
            raise ConfigError(f"num_workers must be >= 0, got {num_workers}")
        if prefetch < 1:
            raise ConfigError(f"prefetch must be >= 1, got {prefetch}")
        if isinstance(coordinator, str) and coordinator != "rank0":
            raise ConfigError(
                f'coordinator must be a CoordinatorClient or "rank0", not {coordinator!r}'
            )
        if coordinator is not None and not dataset.coordinated:
            raise ConfigError(
                f"{dataset.name} is read by the static plan only: a coordinator's leases "
                "do not feed it yet"
            )
        self.dataset = dataset
        self.num_workers = num_workers
        self.prefetch = prefetch
        self.zero_copy = zero_copy
        self.last_handout: Handout | None = None  # the last pass's slots out with the caller
        self.timeout = timeout
        self.coordinator = coordinator
        self.coordinator_state = coordinator_state
        self.coordinator_config = coordinator_config
        self.metrics_port = metrics_port
        self.device, self.device_depth = device, device_depth
        self._device: DevicePrefetcher | None = None
        self._ready = 0
        self._client: CoordinatorClient | None = None
        self._embedded: Embedded | None = None
        self._restore: dict[str, Any] | None = None  # a dynamic state to resume from
        self._min_epoch = 0
        self.last_epoch: CoordinatedEpoch | None = None
        self._suspended: Generator[dict[str, torch.Tensor], None, None] | None = None
        self._pass_progress: st.Progress | None = None  # the static pass's, as it counts
        self._pass_first = 0  # with a coordinator: the batch number this pass starts at
        self._pass_batches: int | None = None  # and the one it ends at

    @property
    def batch_size(self) -> int:
        return self.dataset.batch_size

    def set_epoch(self, epoch: int) -> None:
        if self._device is not None:
            self._device.close()  # what it read ahead belongs to the old epoch
        self._drop_suspended()
        self.dataset.set_epoch(epoch)

    def _drop_suspended(self) -> None:
        """End a broken-off coordinator-fed pass (its workers stop)."""
        batches, self._suspended = self._suspended, None
        if batches is not None:
            batches.close()

    def __len__(self) -> int:
        """Batches that iterating now hands out on this rank: the rest of the epoch in
        progress (after a restore or a broken-off loop), else the whole next epoch. The
        same with a coordinator: every rank gets ``ceil(per_rank / batch_size)``
        batches of the epoch there too (counted from the static plan's equal split,
        which the coordinator's quota per rank equals)."""
        if self.coordinator is None:
            return -(-len(self.dataset) // self.batch_size)
        ep, end = self.last_epoch, self._pass_batches
        taken = None if self._device is None else self._device.suspended_taken()
        if taken is not None and end is not None:  # the device tier keeps the pass
            return max(0, end - self._pass_first - taken)
        if self._suspended is not None and ep is not None and end is not None:
            return max(0, end - ep.batches)
        return self._epoch_batches()[1]

    def _epoch_batches(self) -> tuple[int, int]:
        """Fed by a coordinator: ``(first, n)``, the batch number the next pass starts at
        and how many it hands out (from a restored checkpoint: its rest, on this world)."""
        from stoker import intervals, plan

        pl = self.dataset.placement()
        B = self.batch_size
        r = self._restore
        if r is not None and self.last_epoch is None and r.get("epoch") is not None:
            snap = r["snapshot"]
            left = intervals.size(intervals.subtract(
                intervals.make([tuple(p) for p in snap["epoch_set"]]),
                intervals.make([tuple(p) for p in snap["consumed"]]),
            ))  # fmt: skip
            return int(r["batches"]), -(-(left // pl.world) // B)
        ds = self.dataset
        epoch_set = plan.first_epoch_set(
            self._min_epoch, ds.num_samples, pl.world, ds.drop_remainder
        )
        return 0, -(-(intervals.size(epoch_set) // pl.world) // B)

    def state_dict(self) -> dict[str, Any]:
        """Exact state: samples the caller consumed, not what workers (or, with ``device``,
        the device tier) read ahead."""
        if self._device is not None:
            return self._device.state_dict()
        return self._host_state()

    def _host_state(self) -> dict[str, Any]:
        if self.coordinator is None:
            return self.dataset.state_dict()
        ep = self.last_epoch
        if ep is None or ep.epoch is None:
            return dict(self._restore) if self._restore else {**_DYNAMIC, "epoch": None}
        return self.state_at(ep.epoch, ep.batches)

    def state_at(self, epoch: int, batches: int) -> dict[str, Any]:
        """Fed by a coordinator: the state after this rank's first ``batches`` batches of
        ``epoch`` (a Checkpoint call of what every rank had handed out by then)."""
        if self.coordinator is None:
            raise StateError("state_at() is for a loader fed by a coordinator; use state_dict()")
        name, snapshot = self._coordinator().checkpoint(epoch, batches)
        return {
            **_DYNAMIC,
            "epoch": epoch,
            "batches": batches,
            "checkpoint": name,
            "snapshot": snapshot,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self._device is not None:
            self._device.load_state_dict(state)  # stops its read-ahead, then loads below
            return
        self._host_load(state)

    def _host_load(self, state: dict[str, Any]) -> None:
        if self.coordinator is None:
            self.dataset.load_state_dict(state)
            return
        ds = self.dataset
        taking: list[Callable[[], None]] = []

        def adopt(theirs: str, epoch: int) -> tuple[str, int]:
            # a stream the dataset can continue though it differs (a mixture: the world
            # its plan was made on, its weights until the epoch ends), taken once every
            # check has passed
            mine = ds.stream_identity()
            got = ds.adoption(theirs, epoch) if theirs != mine else None
            if got is None:
                return mine, ds.num_samples
            taking.append(got[1])
            return theirs, got[0]

        state = st.check_dynamic(state, ds.stream_identity(), ds.num_samples, adopt=adopt,
                                 explain=ds.stream_change)  # fmt: skip
        if self._client is not None:
            raise StateError("load_state_dict() must come before the first iteration")
        for take in taking:
            take()
        if state.get("epoch") is None:
            return
        self._restore = dict(state)
        self._min_epoch = int(state["epoch"])

    def _coordinator(self) -> CoordinatorClient:
        """This rank's client; with ``"rank0"`` the coordinator is found or started here."""
        if self._client is not None:
            return self._client
        if not isinstance(self.coordinator, str):
            assert self.coordinator is not None
            self._client = self.coordinator
        else:
            from stoker.coordinator import embedded

            pl = self.dataset.placement()
            r = self._restore
            self._client, self._embedded = embedded.connect(
                self.dataset.num_samples,
                pl.rank,
                pl.world,
                state_url=self.coordinator_state,
                config=self.coordinator_config,
                drop_remainder=self.dataset.drop_remainder,
                restore=(r["checkpoint"], r["snapshot"]) if r and pl.rank == 0 else None,
            )
            if self._embedded is not None:
                weakref.finalize(self, self._embedded.close)
        if self._restore is not None:
            origin = self._client.status().origin
            name = self._restore["checkpoint"]
            if origin != name:
                raise StateError(
                    f"the coordinator at {self._client.address} was not restored from checkpoint "
                    f"{name} (its table came from {origin or 'a fresh start'}): start it with "
                    f"--restore {name} and the new --world"
                )
        return self._client

    # -- stoker.device.Prefetchable -------------------------------------------------
    @property
    def rank(self) -> int:
        """This process's rank."""
        return self.dataset.placement().rank

    @property
    def keeps_passes(self) -> bool:
        """Fed by a coordinator: a broken-off pass is kept as it is and continued (its
        batches were confirmed as they were read), not reloaded from its state."""
        return self.coordinator is not None

    def transfer_dtypes(self) -> dict[str, torch.dtype]:
        """The dtypes a device tier copies batches in (``tokens`` as narrow as the
        vocabulary allows)."""
        return self.dataset.transfer_dtypes()

    def snapshot(self) -> Snapshot:
        """The state as of the last batch handed out, cheap to take after every batch:
        the state itself, or, fed by a coordinator, the rank's batch count, for which
        the Checkpoint call is made only when the state is asked for."""
        if self._device is not None:
            return self._device.snapshot()
        return self._host_snapshot()

    def _host_snapshot(self) -> Snapshot:
        if self.coordinator is None:
            return self.dataset.state_snapshot()
        ep = self.last_epoch
        if ep is None or ep.epoch is None:
            state = self._host_state()  # nothing handed out yet: no call made
            return lambda: dict(state)
        epoch, batches = int(ep.epoch), int(ep.batches)
        return lambda: self.state_at(epoch, batches)

    def end_pass(self) -> None:
        """End a broken-off pass (its workers stop); the next iteration starts anew."""
        self._drop_suspended()

    def close(self) -> None:
        """Stop a broken-off pass (and the device tier's reading thread, which a
        coordinator-fed pass keeps) and the coordinator this rank started, if any."""
        if self._device is not None:
            self._device.close()
        self._drop_suspended()
        release = getattr(self.dataset, "release_readers", None)
        if release is not None:
            release()  # (a reader its last pass kept for the next)
        if self._embedded is not None:
            self._embedded.close()
            self._embedded = None

    def stats(self) -> dict[str, Any]:
        """This rank's stall and throughput figures (what ``/metrics`` shows, as numbers):
        batches, samples, tokens, ``wait_seconds`` (training waiting for data),
        ``step_seconds`` (training working), ``stall_share``, batches and tokens per
        second of that span, ``ready_batches`` and the workers' ``worker_busy_share``;
        plus this process's storage counters."""
        return rank_stats(self.dataset.placement().rank)

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        """Each batch (on ``device``, if given), in order."""
        if self.device is None:
            return _closed_at_exit(self._host_iter())
        return iter(self._prefetcher())

    def _prefetcher(self) -> DevicePrefetcher:
        """The device tier over this loader's lent slots (made on first use)."""
        if self._device is None:
            from stoker.device import DevicePrefetcher

            view = _HostView(self)
            # stage=True: the copy path (lent slots, loans) also runs without CUDA
            self._device = DevicePrefetcher(view, self.device, self.device_depth, stage=True)
            if self._device.device.type == "cuda":
                view.register = functools.partial(register, device=self._device.device)
        return self._device

    def _host_iter(self, lend: _HostView | None = None) -> Iterator[dict[str, torch.Tensor]]:
        """Each host batch, timed: the wait inside ``next()`` is the data stall, the time
        until the next ``next()`` the training step (see :meth:`stats`). With ``lend``
        (the device tier's view) batches from workers are lent slots."""
        pl = self.dataset.placement()
        if self.metrics_port is not None:
            serve_once(self.metrics_port, pl.local_rank)
        self._ready = 0
        batches, self._suspended = self._suspended, None
        if batches is None:
            stage = getattr(self.dataset, "batch_stage", lambda: None)()
            # (a batch a dataset's stage makes here, a records dataset's DALI decode, is a
            # new one: the slots it was made from are not lent on to the device tier)
            batches = self._iter(pl, lend if stage is None else None)
            if stage is not None:
                batches = self._staged(stage, batches)
        keep = False
        try:
            count = (
                _count
                if not hasattr(self.dataset, "count_sources")
                else functools.partial(self._count_mixed, registry().loader(pl.rank))
            )
            for batch in timed(batches, pl.rank, count, lambda: self._ready):
                try:
                    yield batch
                except GeneratorExit:
                    # the caller broke out: a static pass stops its workers now and the
                    # next one continues from what was consumed (the dataset's progress);
                    # a coordinator-fed pass, whose batches were confirmed as they were
                    # read, is kept as it is and continued by the next pass
                    keep = self.coordinator is not None and lend is None and not _exiting
                    raise
                del batch  # (not held while the next one is read: its slot may be lent again)
        finally:
            if keep:
                self._suspended = batches
            else:
                batches.close()

    def _staged(
        self,
        stage: Callable[[Iterator[Batch]], Iterator[Batch]],
        batches: Generator[Batch, None, None],
    ) -> Generator[Batch, None, None]:
        """``stage(batches)``, where a batch the stage fails on (a records dataset's DALI
        decode raising the error of an image it could not decode) is not counted as
        consumed: a state_dict() taken after the error reads it again, as when a worker
        fails on it. (A coordinator-fed pass confirmed it when it was read.)"""
        held = 0  # samples the stage took from the pass and has not handed out
        progress: st.Progress | None = None  # that pass's (once it began)

        def pulled() -> Generator[Batch, None, None]:
            nonlocal held, progress
            try:
                for batch in batches:
                    progress = self._pass_progress
                    held = len(batch[SAMPLE_ID])
                    yield batch
            finally:
                batches.close()

        out = stage(pulled())
        try:
            for batch in out:
                held = 0
                yield batch
        except BaseException:  # (a KeyboardInterrupt in the decode too: the state after it)
            if held and self.coordinator is None and progress is not None:
                progress.consumed -= held
            raise
        finally:
            close = getattr(out, "close", None)
            if close is not None:
                close()

    def _iter(
        self, pl: Placement, lend: _HostView | None
    ) -> Generator[dict[str, torch.Tensor], None, None]:
        if self.coordinator is not None:
            yield from self._coordinated_pass(pl)
        else:
            yield from self._static_pass(pl, lend)

    def _coordinated_pass(self, pl: Placement) -> Iterator[Batch]:
        """One epoch of the coordinator's (see :mod:`stoker.loader.coordinated`)."""
        from stoker.loader.coordinated import CoordinatedEpoch

        client = self._coordinator()
        ep = self.last_epoch
        if ep is not None and not ep.finished and ep.epoch is not None:
            raise StateError(
                f"this rank's pass of epoch {ep.epoch} ended after {ep.batches} batches, "
                "before the epoch's end, and was not kept (it was closed, or failed): the "
                "batches it had read ahead were confirmed with the coordinator, so a new "
                "pass would not see them. Continue from a state_dict() taken before, in a "
                "new loader (load_state_dict, then iterate)"
            )
        first, n = self._epoch_batches()
        self._pass_first, self._pass_batches = first, first + n
        self.last_epoch = CoordinatedEpoch(
            self.dataset,
            client,
            pl.rank,
            self.num_workers,
            self.prefetch,
            self._min_epoch,
            timeout=self.timeout,
            ready=self._set_ready,
        )
        yield from self.last_epoch
        if self.last_epoch.epoch is not None:
            self._min_epoch = self.last_epoch.epoch + 1

    def _count_mixed(self, stats: LoaderStats, batch: dict[str, torch.Tensor]) -> tuple[int, int]:
        """A mixture's batch: counted per source too (``loader.stats()["sources"]``)."""
        ds, ep, step = self.dataset, self.last_epoch, None
        if self.coordinator is not None and ep is not None and ep.epoch is not None:
            # the rank's batch number in the epoch, as the plan's step (its batches of the
            # epoch, set when the pass began: steps_per_epoch on the plan's world)
            n = self._pass_batches or 1
            step = ds.lease_step(ep.epoch, max(ep.batches - 1, 0), n)  # type: ignore[attr-defined]
        counts, per_row, targets = ds.count_sources(batch, step)  # type: ignore[attr-defined]
        with registry().lock:
            stats.sourced(ds.names, counts, per_row, targets)  # type: ignore[attr-defined]
        n = sum(counts)
        return n, n * per_row

    def _set_ready(self, n: int) -> None:
        self._ready = n

    def _static_pass(self, pl: Placement, lend: _HostView | None) -> Iterator[Batch]:
        """One rank's pass of the static plan through the worker pool: batches in the
        rank's sample order; each counted as consumed when it is handed out."""
        ds = self.dataset
        epoch = ds.begin_epoch(pl)
        progress, total = epoch.progress, epoch.batches
        self._pass_progress = progress
        nw, depth = self.num_workers, self.prefetch
        layout = ds.layout if lend is None else ds.layout.with_dtypes(lend.transfer_dtypes())
        pool = WorkerPool(
            epoch.spec(nw, carry=nw == 0), layout, nw, prefetch=depth, timeout=self.timeout, rank=pl.rank,
            ordered=True,
        )  # fmt: skip
        loans = None if lend is None or nw == 0 else Loans()
        # batches handed out in their slots (not copied) while the caller lets go of them
        handout = Handout(nw, depth - 1) if lend is None and nw and not self.zero_copy else None
        self.last_handout = handout
        unpin: Callable[[], None] | None = None

        def room(w: int) -> None:  # worker w needs a slot to fill before it is waited on
            if handout is not None:
                for g in handout.returned():
                    pool.give_back(g)
                return
            assert loans is not None
            loans.reap()
            while loans.out(w) >= depth:
                if not loans.wait():
                    raise StokerError(f"worker {w}'s slots are all lent and unsettled")

        handed = 0
        try:
            pool.start()
            if loans is not None:
                assert lend is not None
                lend.loans = loans
                # after the forks: CUDA may mark page-locked memory not to be inherited by a
                # fork (MADV_DONTFORK), and the workers write into these slots
                unpin = lend.pin(pool.slot_tensors())
            direct = unpin is not None
            for got in pool.batches(room if loans is not None or handout is not None else None):
                batch = got.arrays
                progress.consumed += len(batch[SAMPLE_ID])  # handed to the caller = consumed
                handed += 1
                self._ready = pool.waiting  # batches waiting in the slots
                if got.owned:
                    yield batch
                elif loans is not None:  # back to the worker once its copy completed
                    loan = loans.lend(got.worker, functools.partial(pool.give_back, got), direct)
                    yield Lent(batch, loan)
                elif handout is not None and handout.can_lend(got.worker):
                    rows = len(batch[SAMPLE_ID])
                    yield handout.lend(got, pool.rings[got.worker].numpy_view(got.slot, rows))
                elif not self.zero_copy:
                    batch = {k: v.clone() for k, v in batch.items()}
                    pool.give_back(got)
                    yield batch
                else:
                    yield batch
                    pool.give_back(got)
            if handed < total:
                raise WorkerError(
                    f"the loader's workers ran out of samples after {handed} of {total} "
                    "batches; this is a stoker bug"
                )
        finally:
            if handout is not None:
                handout.end()  # (slots let go of later stay with the closed pool's rings)
            copied = False
            try:
                if loans is not None:  # every copy from the slots completed; the slots
                    loans.close(give_back=False)  # stay here: the workers stop now
                copied = True
            finally:
                pool.close()
                if unpin is not None and copied:  # never under a copy still in flight
                    unpin()
        epoch.finish()


#: A loader's passes not yet finished or closed: closed when the interpreter exits, while
#: the modules their clean-up uses still exist (a pass left open at the end of a script
#: was closed by the garbage collector after them, and printed a traceback).
_open_passes: weakref.WeakSet[Any] = weakref.WeakSet()
_hooked = False  # the exit hook is installed (by the first pass, not by importing stoker)
_exiting = False  # the interpreter is exiting: a coordinator-fed pass is closed, not kept


def _closed_at_exit(
    gen: Iterator[dict[str, torch.Tensor]],
) -> Iterator[dict[str, torch.Tensor]]:
    """``gen`` (a generator), closed at the interpreter's exit if still open then."""
    global _hooked
    if not _hooked:
        atexit.register(_close_open_passes, os.getpid())
        _hooked = True
    _open_passes.add(gen)
    return gen


def _close_open_passes(pid: int) -> None:
    global _exiting
    if os.getpid() != pid:  # a forked child exiting: the passes are its parent's
        return
    _exiting = True
    for gen in list(_open_passes):
        try:
            gen.close()
        except Exception:
            pass  # exiting: a pass that fails to close has nothing left to lose


def _count(batch: dict[str, torch.Tensor]) -> tuple[int, int]:
    """A batch's samples and tokens."""
    tokens = batch.get("tokens")
    return len(batch[SAMPLE_ID]), 0 if tokens is None else int(tokens.numel())


class _HostView:
    """A TokenLoader as its device tier sees it: host batches and the loader's own state.

    Batches from worker processes come as lent slots (:class:`~stoker.pinned.Lent`),
    tokens in the device tier's transfer dtype. ``register`` page-locks the slots'
    memory (set for a CUDA device); if it fails the batches are staged, with one
    warning. ``loans`` are those of the last pass (tests).
    """

    def __init__(self, loader: TokenLoader, register: Register | None = None) -> None:
        self._loader = loader
        self.register = register
        self.loans: Loans | None = None
        self._warned = False

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        return _closed_at_exit(self._loader._host_iter(self))

    def __len__(self) -> int:
        return len(self._loader)

    def pin(self, tensors: list[torch.Tensor]) -> Callable[[], None] | None:
        """Page-lock ``tensors`` for direct copies: the undo (a no-op when no registration
        is needed), or None when it failed and the batches are to be staged."""
        if self.register is None:
            return lambda: None
        try:
            return self.register(tensors)
        except Exception as exc:
            if not self._warned:
                self._warned = True
                warnings.warn(
                    f"could not page-lock the loader's batch slots ({exc}); batches are "
                    "staged through pinned buffers instead (one host copy more per batch)",
                    RuntimeWarning,
                    stacklevel=2,
                )
            return None

    def state_dict(self) -> dict[str, Any]:
        return self._loader._host_state()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._loader._host_load(state)

    # -- stoker.device.Prefetchable: the loader's own answers --------------------
    @property
    def rank(self) -> int:
        return self._loader.rank

    @property
    def keeps_passes(self) -> bool:
        return self._loader.keeps_passes

    zero_copy = False  # lent slots are settled by the device tier itself

    def snapshot(self) -> Snapshot:
        return self._loader._host_snapshot()

    def transfer_dtypes(self) -> dict[str, torch.dtype]:
        return self._loader.transfer_dtypes()

    def end_pass(self) -> None:
        self._loader._drop_suspended()
