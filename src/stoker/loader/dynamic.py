"""``TokenLoader`` fed by the coordinator's leases instead of the static plan.

Workers (or the main process, with ``num_workers=0``) are consumers: each
takes leases (:class:`~stoker.coordinator.source.LeaseStream`), turns positions
into sample ids with the same pure plan (``plan.Stream``) and gathers batches
into shared-memory slots as in the static path. The main process confirms each
batch (``ConfirmBatch``, the rank's next batch number) *before* handing it out
and drops the rows of any segment the coordinator refuses (its lease expired
and went to another consumer), so a sample reaches training at most once, and,
with the coordinator requeueing what was not confirmed, exactly once.

Every rank must see the same number of batches (collectives hang otherwise),
but leases are not cut in batch multiples. So a batch shorter than
``batch_size`` (a worker's last one, or one that lost rows) is held back, and
the held rows are re-cut into full batches at the end of the epoch: a rank
gets exactly ``ceil(quota / batch_size)`` batches, the same for every rank.
That rule lives in :mod:`stoker.coordinator.delivery`, so the coordinator,
which logs every confirmed batch, knows what each rank's first ``k`` batches
were (checkpoints) and the whole order (replay).
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import threading
import time
import traceback
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from stoker import errors, plan
from stoker._proto import coordinator_pb2 as pb
from stoker.coordinator.client import CoordinatorClient, LeaseRejected, answers
from stoker.coordinator.source import LeaseStream
from stoker.loader.dataset import TokenDataset
from stoker.loader.locality import local_ranges
from stoker.loader.sources import PositionSource
from stoker.metrics import WorkerMeter, apply_worker

if TYPE_CHECKING:
    from stoker.loader.fast import _Slots

Batch = dict[str, torch.Tensor]
Segments = list[tuple[int, int, int]]  # (lease, upto, rows)


def _stream_json(ds: TokenDataset) -> str:
    """How this rank maps positions to samples; the coordinator checks that all agree."""
    c = ds.shuffle_config
    return json.dumps(
        {
            "dataset_id": ds.source.manifest.dataset_id,
            "num_samples": ds.num_samples,
            "seq_len": ds.seq_len,
            "seed": c.seed,
            "shuffle": c.shuffle,
            "shard_size": c.shard_size,
            "window_shards": c.window_shards,
        },
        sort_keys=True,
    )


def _consumer(ds: TokenDataset) -> dict[str, Any]:
    """How this rank's consumers describe themselves: the position-to-sample mapping, and,
    with a node agent, the node's cache and what of each epoch it holds."""
    out: dict[str, Any] = {"stream": _stream_json(ds)}
    agent = ds.agent
    if agent is not None:
        m = ds.source.manifest

        def local(epoch: int) -> list[tuple[int, int]]:
            held = agent.holdings(m.dataset_id)
            return local_ranges(
                ds.num_samples, ds.seq_len, m.block_tokens, ds.shuffle_config, epoch, held
            )

        out.update(node=agent.node, local=local)
    return out


#: Batches a rank reads ahead while their confirms are in flight: one coordinator round
#: trip and journal write (a few ms) then covers many batches. 64 rather than 16 took
#: an epoch from 25 to 41 M tok/s with num_workers=0 (benchmarks/dynamic_bench.py's
#: dataset, no training step); at most :data:`CONFIRM_BYTES` of batches wait.
CONFIRM_WINDOW = 64
CONFIRM_BYTES = 256 << 20


def confirm_window(prefetch: int, batch_bytes: int) -> int:
    """Batches read ahead of their confirms: :data:`CONFIRM_WINDOW`, fewer for large
    batches (within :data:`CONFIRM_BYTES`, but at least 4 and ``prefetch``)."""
    return max(prefetch, 4, min(CONFIRM_WINDOW, CONFIRM_BYTES // max(1, batch_bytes)))


class _Confirmer:
    """Confirms a rank's batches in order on a thread of its own, as many per message as
    are waiting (``Batch`` of ``ConfirmBatch`` calls), so the coordinator's round trip
    and journal write overlap the reading of the next batches and the training step."""

    def __init__(self, client: CoordinatorClient, size: int) -> None:
        self.client, self.size = client, size
        self.seq = 0
        self._queue: deque[tuple[Future[list[bool | None]], Any]] = deque()
        self._cv = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._run, daemon=True, name="stoker-confirm")
        self._thread.start()

    def submit(self, epoch: int, consumer: int, segments: Segments) -> Future[list[bool | None]]:
        """Confirm the rank's next batch; the future gives an answer per segment."""
        call = pb.Call(
            confirm_batch=pb.ConfirmBatchRequest(
                consumer=consumer,
                epoch=epoch,
                seq=self.seq,
                segments=[pb.Segment(lease=a, upto=u, rows=n) for a, u, n in segments],
                batch_size=self.size,
            )
        )
        self.seq += 1
        fut: Future[list[bool | None]] = Future()
        with self._cv:
            self._queue.append((fut, call))
            self._cv.notify()
        return fut

    def _run(self) -> None:
        while True:
            with self._cv:
                while not self._queue and not self._closed:
                    self._cv.wait()
                if not self._queue:
                    return
                work = list(self._queue)
                self._queue.clear()
            try:
                results = self.client.batch([call for _, call in work])
            except BaseException as exc:  # the coordinator is gone: every waiter learns it
                for fut, _ in work:
                    fut.set_exception(exc)
                continue
            for (fut, _), r in zip(work, results, strict=True):
                if r.WhichOneof("kind") == "error":
                    fut.set_exception(LeaseRejected(r.error.code, r.error.message))
                else:
                    fut.set_result(answers(r.confirm_batch))

    def close(self) -> None:
        with self._cv:
            self._closed = True
            self._cv.notify()
        self._thread.join()


class _Ahead:
    """Sample ids of a consumer's positions, worked out a stretch of its lease at a time,
    with the reader planned on that whole stretch (so its blocks are prefetched) instead
    of one batch: mapping positions to samples and scheduling blocks cost about the same
    for a batch as for thousands of positions."""

    def __init__(self, ds: TokenDataset, reader: Any, leases: PositionSource) -> None:
        self.stream = plan.Stream(ds.num_samples, ds.shuffle_config)
        self.reader, self.leases = reader, leases
        self.limit = max(ds.batch_size, reader.horizon)
        self.pos = np.zeros(0, dtype=np.int64)
        self._ids = self.pos
        self.i = 0

    def ids(self, positions: np.ndarray) -> np.ndarray:
        n = len(positions)
        if np.array_equal(self.pos[self.i : self.i + n], positions):
            self.i += n  # as planned
            return self._ids[self.i - n : self.i]
        # a new lease (or a stolen end): plan again from here
        self.pos = np.concatenate([positions, self.leases.upcoming(self.limit)])
        self._ids = self.stream.samples(self.pos)
        self.reader.plan(self._ids, np.zeros(0, dtype=np.int64))
        self.i = n
        return self._ids[:n]


def _worker(
    ds: TokenDataset,
    client: CoordinatorClient,
    rank: int,
    worker: int,
    min_epoch: int,
    slots: _Slots,
    conn: Connection,
    parent: int,
) -> None:
    from stoker.loader.fast import _fill, die_with_parent

    die_with_parent(parent)
    torch.set_num_threads(1)
    reader = ds._reader()
    try:
        leases = LeaseStream(client, rank, worker, min_epoch=min_epoch, **_consumer(ds))
        conn.send(("epoch", leases.consumer, leases.epoch, leases.first_step))
        ahead = _Ahead(ds, reader, leases)
        meter = WorkerMeter()
        seen = 0
        batches = leases.batches(ds.batch_size)
        while True:
            t = time.perf_counter()
            got = next(batches, None)
            if got is None:
                break
            positions, segments = got
            ids = ahead.ids(positions)
            busy = time.perf_counter() - t
            slot = conn.recv()
            if slot is None:
                return
            t = time.perf_counter()
            _fill(reader, ids, slots, slot)
            busy += time.perf_counter() - t
            if leases.reregistered != seen:  # expired and registered again: a new id
                seen = leases.reregistered
                conn.send(("epoch", leases.consumer, leases.epoch, leases.first_step))
            conn.send(("batch", slot, len(ids), segments, meter.delta(busy)))
        conn.send(("done",))
    except BaseException as exc:
        try:
            conn.send(("error", *errors.encode(exc), traceback.format_exc()))
        except Exception:
            pass
    finally:
        reader.close()
        conn.close()


class DynamicEpoch:
    """One epoch of a rank's batches through the coordinator."""

    def __init__(
        self,
        ds: TokenDataset,
        client: CoordinatorClient,
        rank: int,
        num_workers: int,
        prefetch: int,
        min_epoch: int = 0,
        loader: Any = None,
    ) -> None:
        self.ds, self.client, self.rank = ds, client, rank
        self.num_workers, self.prefetch = num_workers, prefetch
        self.epoch: int | None = None
        self.min_epoch = min_epoch
        self.loader = loader  # told how many batches wait (its `_ready`)
        self.dropped = 0  # rows whose confirm was refused
        self.delivered = 0  # rows handed out
        self.batches = 0  # batches of the epoch handed out (counting those before a restore)
        self.finished = False

    def _began(self, epoch: int, first_step: int) -> None:
        if self.epoch is None:
            self.epoch = epoch
            self.batches = first_step

    def _keep(self, batch: Batch, segments: Segments, answers: list[bool | None]) -> Batch:
        """The rows of ``batch`` whose segments the coordinator accepted."""
        keep = np.ones(len(batch["sample_id"]), dtype=bool)
        row = 0
        for (_, _, rows), answer in zip(segments, answers, strict=True):
            if answer is None:
                keep[row : row + rows] = False
            row += rows
        if keep.all():
            return batch
        self.dropped += int((~keep).sum())
        idx = torch.from_numpy(np.flatnonzero(keep))
        return {k: v[idx] for k, v in batch.items()}

    def __iter__(self) -> Iterator[Batch]:
        """Batches in the order :mod:`stoker.coordinator.delivery` defines: full ones as
        they come, the short ones' rows re-cut at the end."""
        B = self.ds.batch_size
        held: list[Batch] = []
        pending: deque[tuple[Batch, Segments, Future[list[bool | None]]]] = deque()
        confirmer = _Confirmer(self.client, B)
        row = (self.ds.seq_len + 1) * (8 + (1 if self.ds.doc_starts else 0)) + 8
        window = confirm_window(self.prefetch, B * row)  # tokens, masks, ids

        def hand_out() -> Iterator[Batch]:
            batch, segments, answer = pending.popleft()
            out = self._keep(batch, segments, answer.result())
            if len(out["sample_id"]) == B:
                self.delivered += B
                self.batches += 1
                yield out
            elif len(out["sample_id"]):
                held.append(out)

        try:
            for consumer, batch, segments in self._produce():
                assert self.epoch is not None
                pending.append((batch, segments, confirmer.submit(self.epoch, consumer, segments)))
                # hand out what is confirmed; wait for a confirm only with `window` queued
                while pending and (pending[0][2].done() or len(pending) > window):
                    if self.loader is not None:
                        self.loader._ready = len(pending) - 1
                    yield from hand_out()
            while pending:
                yield from hand_out()
        finally:
            confirmer.close()
        if held:
            merged = {k: torch.cat([r[k] for r in held]) for k in held[0]}
            n = len(merged["sample_id"])
            for lo in range(0, n, B):
                self.delivered += min(B, n - lo)
                self.batches += 1
                yield {k: v[lo : lo + B] for k, v in merged.items()}
        self.finished = True

    def _produce(self) -> Iterator[tuple[int, Batch, Segments]]:
        if self.num_workers == 0:
            yield from self._in_process()
        else:
            yield from self._from_workers()

    def _in_process(self) -> Iterator[tuple[int, Batch, Segments]]:
        reader = self.ds._reader()
        try:
            leases = LeaseStream(
                self.client, self.rank, 0, min_epoch=self.min_epoch, **_consumer(self.ds)
            )
            self._began(leases.epoch, leases.first_step)
            ahead = _Ahead(self.ds, reader, leases)
            for positions, segments in leases.batches(self.ds.batch_size):
                ids = ahead.ids(positions)
                toks, mask = reader.read(ids)
                batch = {"tokens": torch.from_numpy(toks), "sample_id": torch.from_numpy(ids)}
                if mask is not None:
                    batch["doc_start_mask"] = torch.from_numpy(mask)
                yield leases.consumer, batch, segments
        finally:
            reader.close()

    def _from_workers(self) -> Iterator[tuple[int, Batch, Segments]]:
        from stoker.errors import WorkerError
        from stoker.loader import supervise
        from stoker.loader.fast import _give_back, _Slots, _stop_workers

        ds = self.ds
        ctx = mp.get_context("fork")
        rings = [
            _Slots(self.prefetch, ds.batch_size, ds.seq_len + 1, ds.doc_starts)
            for _ in range(self.num_workers)
        ]
        conns: list[Connection] = []
        procs = []
        consumer: dict[int, int] = {}
        try:
            for w in range(self.num_workers):
                parent, child = ctx.Pipe(duplex=True)
                proc = ctx.Process(
                    target=_worker,
                    args=(
                        ds,
                        self.client,
                        self.rank,
                        w,
                        self.min_epoch,
                        rings[w],
                        child,
                        os.getpid(),
                    ),
                    daemon=True,
                    name=f"stoker-lease-worker-{w}",
                )
                proc.start()
                child.close()
                conns.append(parent)
                procs.append(proc)
                for slot in range(self.prefetch):
                    _give_back(parent, slot)  # a worker gone already: its receive says so
            live = set(range(self.num_workers))
            timeout = getattr(self.loader, "timeout", 300.0)
            heard = {w: time.monotonic() for w in live}  # last message, less time away
            while live:
                for w in sorted(live):
                    conn, proc = conns[w], procs[w]
                    try:
                        if not conn.poll(0.01):
                            if not proc.is_alive() and not conn.poll(0):
                                raise supervise.gone(w, proc)
                            if time.monotonic() - heard[w] >= timeout:
                                raise supervise.silent(w, proc, timeout)
                            continue
                        msg = conn.recv()
                    except (EOFError, OSError) as exc:  # ConnectionResetError, ...
                        raise supervise.gone(w, proc, exc) from exc
                    heard[w] = time.monotonic()
                    if msg[0] == "epoch":
                        consumer[w] = int(msg[1])
                        self._began(int(msg[2]), int(msg[3]))
                    elif msg[0] == "batch":
                        _, slot, n, segments, delta = msg
                        apply_worker(self.rank, w, delta)
                        ring = rings[w]
                        batch = {"tokens": ring.tokens[slot, :n].clone(),
                                 "sample_id": ring.ids[slot, :n].clone()}  # fmt: skip
                        if ring.masks is not None:
                            batch["doc_start_mask"] = ring.masks[slot, :n].clone()
                        _give_back(conn, slot)
                        away = time.monotonic()
                        yield consumer[w], batch, [tuple(s) for s in segments]
                        away = time.monotonic() - away  # the caller's time is no worker's
                        heard = {k: t + away for k, t in heard.items()}
                    elif msg[0] == "done":
                        live.discard(w)
                    else:
                        _, kind, text, fields, trace = msg
                        typed = errors.decode(kind, text, f"in loader worker {w}", fields)
                        if typed is not None:
                            raise typed  # the typed error, as the static loader raises it
                        raise WorkerError(
                            f"loader worker {w} (pid {proc.pid}) failed ({text}):\n{trace}",
                            worker=w,
                            pid=proc.pid,
                        )
        finally:
            _stop_workers(conns, procs)
