"""``TokenLoader``: batches from worker processes through shared memory.

torch's DataLoader moves every batch from a worker as a pickled message and a
freshly allocated shared-memory segment; that costs about the same for a tiny
batch as for a big one and caps a loader at a few thousand batches a second.
TokenLoader gives each worker a ring of batch slots in shared memory,
allocated once. A worker writes a batch straight into a free slot (decoded
tokens gathered from its block arena, widened to int64 there) and sends only
the slot number; the main process copies the batch out (or, with
``zero_copy=True``, hands out views that stay valid until the next batch is
requested) and returns the slot.

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

import ctypes
import functools
import multiprocessing as mp
import os
import signal
import time
import traceback
import warnings
import weakref
from collections.abc import Callable, Generator, Iterator
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from stoker import errors
from stoker.errors import ConfigError, StateError, StokerError, WorkerError
from stoker.loader import state as st
from stoker.loader import supervise
from stoker.loader.dataset import TokenDataset
from stoker.loader.distributed import Placement
from stoker.metrics import WorkerMeter, apply_worker, serve_once, timed
from stoker.metrics_export import rank_stats
from stoker.pinned import Lent, Loans, register

if TYPE_CHECKING:
    from stoker.coordinator.client import CoordinatorClient
    from stoker.coordinator.embedded import Embedded
    from stoker.coordinator.leases import Config
    from stoker.device import DevicePrefetcher
    from stoker.loader.dynamic import DynamicEpoch

_DYNAMIC = {"stoker_state": st.STATE_VERSION, "mode": "coordinator"}
Register = Callable[[list[torch.Tensor]], Callable[[], None]]


class _Slots:
    """``depth`` batch buffers in shared memory; tokens as ``dtype`` (int64 unless they are
    lent to a device tier, which copies them in its transfer dtype)."""

    def __init__(
        self, depth: int, batch: int, width: int, masks: bool, dtype: torch.dtype = torch.int64
    ) -> None:
        self.tokens = torch.zeros((depth, batch, width), dtype=dtype).share_memory_()
        self.ids = torch.zeros((depth, batch), dtype=torch.int64).share_memory_()
        self.masks = (
            torch.zeros((depth, batch, width), dtype=torch.bool).share_memory_() if masks else None
        )

    def tensors(self) -> list[torch.Tensor]:
        return [t for t in (self.tokens, self.ids, self.masks) if t is not None]


def _fill(reader: Any, ids: np.ndarray, slots: _Slots, slot: int) -> None:
    """Gather a batch straight into a shared-memory slot."""
    n = len(ids)
    mask = None if slots.masks is None else slots.masks[slot, :n].numpy()
    reader.read(ids, slots.tokens[slot, :n].numpy(), mask)
    slots.ids[slot, :n].numpy()[...] = ids


def die_with_parent(parent: int) -> None:
    """End this (forked worker) process when its parent dies, even by SIGKILL: it would
    otherwise wait forever on a pipe whose other end it inherited itself (Linux)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # it died before the line above
        os._exit(1)


def _worker_main(
    ds: TokenDataset,
    progress: st.Progress,
    rank: int,
    worker: int,
    num_workers: int,
    slots: _Slots,
    conn: Connection,
    parent: int,
) -> None:
    die_with_parent(parent)
    torch.set_num_threads(1)
    reader = ds._reader()
    meter = WorkerMeter()
    try:
        batches = ds._batches(reader, progress, rank, worker, num_workers)
        while True:
            t = time.perf_counter()
            batch = next(batches, None)
            if batch is None:
                break
            busy = time.perf_counter() - t
            slot = conn.recv()
            if slot is None:
                return
            t = time.perf_counter()
            _fill(reader, batch, slots, slot)
            conn.send((slot, len(batch), meter.delta(busy + time.perf_counter() - t)))
        conn.send(None)
    except BaseException as exc:
        try:
            conn.send(("error", *errors.encode(exc), traceback.format_exc()))
        except Exception:
            pass
    finally:
        reader.close()
        conn.close()


def _give_back(conn: Connection, slot: int) -> None:
    """Return a slot; a worker that already sent its last batch may be gone."""
    try:
        conn.send(slot)
    except (OSError, ValueError):  # the next receive from it says what happened
        pass


def _stop_workers(conns: list[Connection], procs: list[Any]) -> None:
    """Tell every worker to stop and reap it, escalating to SIGTERM and SIGKILL for one
    that does not (a stopped one too), then close the pipes: no worker outlives this."""
    supervise.stop(conns, procs)


class TokenLoader:
    """Batches of a :class:`TokenDataset` (its ``batch_size``), loaded by ``num_workers`` processes.

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
    the static plan (see :mod:`stoker.loader.dynamic`): work stealing between
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
        dataset: TokenDataset,
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
        self.dataset = dataset
        self.num_workers = num_workers
        self.prefetch = prefetch
        self.zero_copy = zero_copy
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
        self._progress: st.Progress | None = None
        self.last_epoch: DynamicEpoch | None = None
        self._suspended: Generator[dict[str, torch.Tensor], None, None] | None = None
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

        pl = self.dataset._placement()
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
        from stoker.loader.dynamic import _stream_json

        st.check_dynamic(state, _stream_json(self.dataset), self.dataset.num_samples)
        if self._client is not None:
            raise StateError("load_state_dict() must come before the first iteration")
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

            pl = self.dataset._placement()
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

    def close(self) -> None:
        """Stop a broken-off pass and the coordinator this rank started, if any."""
        self._drop_suspended()
        if self._embedded is not None:
            self._embedded.close()
            self._embedded = None

    def stats(self) -> dict[str, Any]:
        """This rank's stall and throughput figures (what ``/metrics`` shows, as numbers):
        batches, samples, tokens, ``wait_seconds`` (training waiting for data),
        ``step_seconds`` (training working), ``stall_share``, batches and tokens per
        second of that span, ``ready_batches`` and the workers' ``worker_busy_share``;
        plus this process's storage counters."""
        return rank_stats(self.dataset._placement().rank)

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        """Each batch (on ``device``, if given), in order."""
        if self.device is None:
            return self._host_iter()
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
        pl = self.dataset._placement()
        if self.metrics_port is not None:
            serve_once(self.metrics_port, pl.local_rank)
        self._ready = 0
        batches, self._suspended = self._suspended, None
        if batches is None:
            batches = self._iter(pl, lend)
        keep = False
        try:
            for batch in timed(batches, pl.rank, _count, lambda: self._ready):
                try:
                    yield batch
                except GeneratorExit:
                    # the caller broke out: a static pass stops its workers now and the
                    # next one continues from what was consumed (the dataset's progress);
                    # a coordinator-fed pass, whose batches were confirmed as they were
                    # read, is kept as it is and continued by the next pass
                    keep = self.coordinator is not None and lend is None
                    raise
        finally:
            if keep:
                self._suspended = batches
            else:
                batches.close()

    def _iter(
        self, pl: Placement, lend: _HostView | None
    ) -> Generator[dict[str, torch.Tensor], None, None]:
        ds = self.dataset
        if self.coordinator is not None:
            from stoker.loader.dynamic import DynamicEpoch

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
            self.last_epoch = DynamicEpoch(
                ds, client, pl.rank, self.num_workers, self.prefetch, self._min_epoch, self
            )
            yield from self.last_epoch
            if self.last_epoch.epoch is not None:
                self._min_epoch = self.last_epoch.epoch + 1
            return
        progress, _ = ds._start(pl)
        if self.num_workers == 0:
            yield from self._in_process(progress, pl.rank)
        else:
            yield from self._from_workers(progress, pl.rank, lend)
        ds._finish_epoch(progress)

    def _batch(
        self, toks: torch.Tensor, ids: torch.Tensor, mask: torch.Tensor | None
    ) -> dict[str, torch.Tensor]:
        out = {"tokens": toks, "sample_id": ids}
        if mask is not None:
            out["doc_start_mask"] = mask
        return out

    def _in_process(self, progress: st.Progress, rank: int) -> Iterator[dict[str, torch.Tensor]]:
        ds = self.dataset
        reader = ds._reader()
        try:
            for batch in ds._batches(reader, progress, rank, 0, 1):
                toks, mask = reader.read(batch)
                progress.consumed += len(batch)  # handed to the caller = consumed
                yield self._batch(
                    torch.from_numpy(toks),
                    torch.from_numpy(batch.copy()),
                    None if mask is None else torch.from_numpy(mask),
                )
        finally:
            reader.close()

    def _from_workers(
        self, progress: st.Progress, rank: int, lend: _HostView | None
    ) -> Iterator[dict[str, torch.Tensor]]:
        ds = self.dataset
        nw = self.num_workers
        B = ds.batch_size
        total = -(-(progress.split.per_rank - progress.consumed) // B)
        ctx = mp.get_context("fork")
        dtype = torch.int64 if lend is None else lend.slot_dtype()
        rings = [_Slots(self.prefetch, B, ds.seq_len + 1, ds.doc_starts, dtype) for _ in range(nw)]
        conns: list[Connection] = []
        procs = []
        loans = None if lend is None else Loans()
        unpin: Callable[[], None] | None = None
        try:
            for w in range(nw):
                parent, child = ctx.Pipe(duplex=True)
                proc = ctx.Process(
                    target=_worker_main,
                    args=(ds, progress, rank, w, nw, rings[w], child, os.getpid()),
                    daemon=True,
                    name=f"stoker-loader-{w}",
                )
                proc.start()
                child.close()
                conns.append(parent)
                procs.append(proc)
                for slot in range(self.prefetch):
                    _give_back(parent, slot)  # a worker gone already: its receive says so
            if lend is not None:
                lend.loans = loans
                # after the forks: CUDA may mark page-locked memory not to be inherited by a
                # fork (MADV_DONTFORK), and the workers write into these slots
                unpin = lend.pin([t for ring in rings for t in ring.tensors()])
            direct = unpin is not None
            for b in range(total):
                w = b % nw
                if loans is not None:
                    loans.reap()
                    while loans.out(w) >= self.prefetch:  # the worker has no slot to fill
                        if not loans.wait():
                            raise StokerError(f"worker {w}'s slots are all lent and unsettled")
                slot, n = self._receive(conns[w], procs[w], w, rank)
                ring = rings[w]
                toks, ids = ring.tokens[slot, :n], ring.ids[slot, :n]
                mask = None if ring.masks is None else ring.masks[slot, :n]
                progress.consumed += n  # handed to the caller = consumed
                self._ready = sum(c.poll(0) for c in conns)  # batches waiting in the slots
                if loans is not None:  # back to the worker once its copy completed
                    loan = loans.lend(w, functools.partial(_give_back, conns[w], slot), direct)
                    yield Lent(self._batch(toks, ids, mask), loan)
                elif not self.zero_copy:
                    toks, ids = toks.clone(), ids.clone()
                    mask = None if mask is None else mask.clone()
                    _give_back(conns[w], slot)
                    yield self._batch(toks, ids, mask)
                else:
                    yield self._batch(toks, ids, mask)
                    _give_back(conns[w], slot)
        finally:
            copied = False
            try:
                if loans is not None:  # every copy from the slots completed; the slots
                    loans.close(give_back=False)  # stay here: the workers stop now
                copied = True
            finally:
                _stop_workers(conns, procs)
                if unpin is not None and copied:  # never under a copy still in flight
                    unpin()

    def _receive(self, conn: Connection, proc: Any, w: int, rank: int) -> tuple[int, int]:
        """Worker ``w``'s next batch (slot, rows); a :class:`WorkerError` naming it (number
        and pid) when it died, broke its pipe or sent nothing for ``timeout`` seconds."""
        deadline = time.monotonic() + self.timeout
        try:
            while not conn.poll(min(1.0, max(0.0, deadline - time.monotonic()))):
                if not proc.is_alive():
                    raise supervise.gone(w, proc)
                if time.monotonic() >= deadline:
                    raise supervise.silent(w, proc, self.timeout)
            msg = conn.recv()
        except (EOFError, OSError) as exc:  # ConnectionResetError, BrokenPipeError, ...
            raise supervise.gone(w, proc, exc) from exc
        if msg is None:
            raise WorkerError(
                f"loader worker {w} (pid {proc.pid}) ran out of samples early; this is a "
                "stoker bug",
                worker=w,
                pid=proc.pid,
            )
        if isinstance(msg[0], str):
            _, kind, text, fields, trace = msg
            typed = errors.decode(kind, text, f"in loader worker {w}", fields)
            if typed is not None:
                raise typed  # the typed error, re-raised
            raise WorkerError(
                f"loader worker {w} (pid {proc.pid}) failed:\n{trace}", worker=w, pid=proc.pid
            )
        apply_worker(rank, w, msg[2])
        return int(msg[0]), int(msg[1])


def _count(batch: dict[str, torch.Tensor]) -> tuple[int, int]:
    return len(batch["sample_id"]), int(batch["tokens"].numel())


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
        return self._loader._host_iter(self)

    def __len__(self) -> int:
        return len(self._loader)

    def slot_dtype(self) -> torch.dtype:
        """The dtype ``tokens`` cross the bus in (the device tier's default transfer)."""
        from stoker.device import _auto_transfer

        return _auto_transfer(self).get("tokens", torch.int64)

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

    def __getattr__(self, name: str) -> Any:  # dataset, coordinator, last_epoch, state_at...
        return getattr(self._loader, name)
