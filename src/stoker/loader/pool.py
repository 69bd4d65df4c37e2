"""The one worker pool: consumers in forked processes, batches through shared memory.

torch's DataLoader moves every batch from a worker as a pickled message and a
freshly allocated shared-memory segment; that costs about the same for a tiny
batch as for a big one and caps a loader at a few thousand batches a second.
This pool gives each worker a ring of batch slots in shared memory, allocated
once from the batch :class:`~stoker.loader.batch.Layout`. A worker runs the
consumer loop (:func:`stoker.loader.consumer.produce`) straight into a free
slot and sends only small messages on its pipe:

* :class:`~stoker.loader.consumer.Began` ``(consumer, epoch, first_step)``:
  it registered (again);
* ``Ready(slot, rows, segments, meter)``: a batch is in ``slot``;
* ``Failed(kind, text, fields, trace)``: it raised (re-raised here as the same
  error class, :func:`stoker.errors.decode`, else a
  :class:`~stoker.errors.WorkerError` with its traceback);
* ``Done()``: its share is read.

The main process returns a slot by sending its number (``None`` asks the worker
to stop). Workers die with their parent (``PR_SET_PDEATHSIG``); a worker that
died, closed its pipe or sent nothing for ``timeout`` seconds of waiting on it
is a :class:`~stoker.errors.WorkerError` naming it; :meth:`WorkerPool.close`
leaves no worker behind (:func:`stoker.loader.supervise.stop`).

With ``num_workers=0`` the pool is the same loop run in the calling process
(no slots, no pipes): a pool of zero workers, not another loop.

``ordered`` pools hand out batches round robin, worker by worker (the static
plan's order, independent of the number of workers); unordered ones hand out
whichever batch is ready first (the coordinator's leases: the order is fixed
later, by the confirms).
"""

from __future__ import annotations

import ctypes
import multiprocessing as mp
import os
import signal
import time
import traceback
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import Any, NamedTuple

import numpy as np
import torch

from stoker import errors
from stoker.errors import WorkerError
from stoker.loader import supervise
from stoker.loader.arena import reader_processes
from stoker.loader.batch import Layout, Slots
from stoker.loader.consumer import Began, ConsumerSpec, Made, allocate, produce
from stoker.loader.handout import own_workers
from stoker.loader.sources import Segments
from stoker.observe.workers import WorkerMeter, apply_worker


class Ready(NamedTuple):
    slot: int
    rows: int
    segments: Segments
    meter: Any


class Failed(NamedTuple):
    kind: str
    text: str
    fields: dict[str, Any]
    trace: str


class Done(NamedTuple):
    pass


@dataclass
class Got:
    """A batch from worker ``worker``: ``arrays`` are views of its ``slot`` (-1: arrays
    of its own, read in this process) until the slot is given back."""

    worker: int
    slot: int
    arrays: dict[str, torch.Tensor]
    segments: Segments

    @property
    def owned(self) -> bool:
        return self.slot < 0


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
    spec: ConsumerSpec, worker: int, workers: int, slots: Slots, conn: Connection, parent: int
) -> None:
    die_with_parent(parent)
    torch.set_num_threads(1)
    reader_processes(workers)  # the reader sizes its decoding threads by the pool
    meter = WorkerMeter()

    def take(rows: int) -> tuple[int, dict[str, np.ndarray]] | None:
        slot = conn.recv()
        return None if slot is None else (slot, slots.numpy_view(slot, rows))

    try:
        for event in produce(spec, worker, take):
            if isinstance(event, Made):
                conn.send(Ready(event.slot, event.rows, event.segments, meter.delta(event.busy)))
            else:
                conn.send(event)
        conn.send(Done())
    except BaseException as exc:
        try:
            conn.send(Failed(*errors.encode(exc), traceback.format_exc()))
        except Exception:
            pass
    finally:
        conn.close()


def give_back(conn: Connection, slot: int) -> None:
    """Return a slot; a worker that already sent its last batch may be gone."""
    try:
        conn.send(slot)
    except (OSError, ValueError):  # the next receive from it says what happened
        pass


class WorkerPool:
    """``num_workers`` consumers of ``spec`` (or the calling process, with 0)."""

    _getpid = staticmethod(os.getpid)  # (held here: a module's globals go at shutdown)

    def __init__(
        self,
        spec: ConsumerSpec,
        layout: Layout,
        num_workers: int,
        *,
        prefetch: int,
        timeout: float,
        rank: int,
        ordered: bool,
        name: str = "stoker-loader",
    ) -> None:
        self.spec, self.layout = spec, layout
        self.num_workers, self.prefetch, self.timeout = num_workers, prefetch, timeout
        self.rank, self.ordered, self.name = rank, ordered, name
        self.rings: list[Slots] = []
        self.conns: list[Connection] = []
        self.procs: list[Any] = []
        self.began: dict[int, Began] = {}  # worker -> its consumer's latest registration
        self._inline: Iterator[Began | Made] | None = None
        self._started = False
        self._pid = os.getpid()  # the process whose workers these are

    def start(self) -> None:
        """Fork the workers (each with its ring of slots and every slot to fill)."""
        self._started = True
        if self.num_workers == 0:
            self._inline = produce(self.spec, 0, allocate(self.layout))
            return
        B = self.spec.batch_size
        self.rings = [Slots(self.layout, self.prefetch, B) for _ in range(self.num_workers)]
        _forgotten_in_forks(self)
        ctx = mp.get_context("fork")
        for w in range(self.num_workers):
            parent, child = ctx.Pipe(duplex=True)
            proc = ctx.Process(
                target=_worker_main,
                args=(self.spec, w, self.num_workers, self.rings[w], child, os.getpid()),
                daemon=True,
                name=f"{self.name}-{w}",
            )
            with own_workers():  # (the caller's batches in slots: not frozen for these)
                proc.start()
            child.close()
            self.conns.append(parent)
            self.procs.append(proc)
            for slot in range(self.prefetch):
                give_back(parent, slot)  # a worker gone already: its receive says so

    @property
    def waiting(self) -> int:
        """Workers with a message ready (batches in the slots, not yet received); asked
        for by the static pass after each batch, a poll of each pipe."""
        return sum(c.poll(0) for c in self.conns)

    def slot_tensors(self) -> list[torch.Tensor]:
        """Every slot's arrays (to page-lock them once the workers are forked)."""
        return [t for ring in self.rings for t in ring.tensors()]

    def give_back(self, got: Got) -> None:
        if not got.owned:
            give_back(self.conns[got.worker], got.slot)

    def batches(self, before_wait: Callable[[int], None] | None = None) -> Iterator[Got]:
        """Every batch, as it is handed out; ``before_wait(worker)`` runs before an
        ordered pool waits on that worker (to make sure it has a slot to fill)."""
        if not self._started:
            self.start()
        if self._inline is not None:
            yield from self._run_inline()
            return
        live = list(range(self.num_workers))
        waited = dict.fromkeys(live, 0.0)  # seconds spent waiting on each since its message
        turn = 0
        while live:
            if self.ordered:
                w = live[turn % len(live)]
                if before_wait is not None:
                    before_wait(w)
                w, msg = self._receive([w], waited)
            else:
                w, msg = self._receive(live, waited)
            if isinstance(msg, Ready):
                apply_worker(self.rank, w, msg.meter)
                ring = self.rings[w]
                turn += 1
                yield Got(w, msg.slot, ring.view(msg.slot, msg.rows), list(msg.segments))
            elif isinstance(msg, Began):
                self.began[w] = msg
            elif isinstance(msg, Done):
                if self.ordered:  # round robin: the first worker done ends the turns
                    return
                live.remove(w)
            else:
                raise self._failure(w, msg)

    def _run_inline(self) -> Iterator[Got]:
        assert self._inline is not None
        for event in self._inline:
            if isinstance(event, Began):
                self.began[0] = event
            else:
                assert event.arrays is not None
                arrays = {k: torch.from_numpy(v) for k, v in event.arrays.items()}
                yield Got(0, -1, arrays, event.segments)

    def _receive(self, ws: list[int], waited: dict[int, float]) -> tuple[int, Any]:
        """The next message of one of workers ``ws``; a :class:`WorkerError` naming the
        worker (number and pid) when it died, broke its pipe or sent nothing for
        ``timeout`` seconds of waiting on it."""
        conns = {self.conns[w]: w for w in ws}
        start = time.monotonic()
        while True:
            left = min(self.timeout - waited[w] for w in ws) - (time.monotonic() - start)
            ready = wait(list(conns), timeout=min(1.0, max(0.0, left)))
            now = time.monotonic()
            if ready:
                w = conns[ready[0]]  # type: ignore[index]
                for other in ws:
                    waited[other] += now - start
                waited[w] = 0.0
                try:
                    return w, self.conns[w].recv()
                except (EOFError, OSError) as exc:  # ConnectionResetError, BrokenPipeError
                    raise supervise.gone(w, self.procs[w], exc) from exc
            for w in ws:
                proc = self.procs[w]
                if not proc.is_alive() and not self.conns[w].poll(0):
                    raise supervise.gone(w, proc)
                if waited[w] + now - start >= self.timeout:
                    raise supervise.silent(w, proc, self.timeout)

    def _failure(self, w: int, msg: Any) -> BaseException:
        proc = self.procs[w]
        if not isinstance(msg, Failed):
            return WorkerError(
                f"loader worker {w} (pid {proc.pid}) sent {type(msg).__name__}; this is a stoker bug",
                worker=w,
                pid=proc.pid,
            )
        typed = errors.decode(msg.kind, msg.text, f"in loader worker {w}", msg.fields)
        if typed is not None:
            return typed  # the typed error, re-raised
        return WorkerError(
            f"loader worker {w} (pid {proc.pid}) failed ({msg.text}):\n{msg.trace}",
            worker=w,
            pid=proc.pid,
        )

    def close(self) -> None:
        """Stop every worker (no worker outlives this) or the in-process consumer; in a
        process forked from the pool's (``os.fork()``), nothing: they are the parent's."""
        if self._getpid() != self._pid:
            return
        if self._inline is not None:
            self._inline.close()  # type: ignore[attr-defined]
            self._inline = None
        supervise.stop(self.conns, self.procs)
        self.conns, self.procs = [], []


_pools: weakref.WeakSet[WorkerPool] = weakref.WeakSet()  # pools with worker processes
_fork_hook = False  # whether _forget_pools runs in forked children


def _forgotten_in_forks(pool: WorkerPool) -> None:
    """Keep ``pool``'s workers out of what a child forked from this process
    (``os.fork()``, not stoker's own workers) counts as its own: multiprocessing's exit
    handler in such a child, when it exits normally, terminates the daemonic processes
    it counts, which would kill the parent's workers. Installed by the first pool with
    workers, not by importing stoker."""
    global _fork_hook
    _pools.add(pool)
    if not _fork_hook:
        _fork_hook = True
        os.register_at_fork(after_in_child=_forget_pools)


def _forget_pools() -> None:
    children = getattr(mp.process, "_children", None)
    if children is None:
        return
    for pool in list(_pools):
        for proc in pool.procs:
            children.discard(proc)
