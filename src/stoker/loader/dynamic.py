"""``TokenLoader`` fed by the coordinator's leases instead of the static plan.

Workers (or the main process, with ``num_workers=0``) are consumers: each
takes leases (:class:`~stoker.coordinator.source.LeaseStream`), turns positions
into sample ids with the same pure plan (``plan.Stream``) and gathers batches
into shared-memory slots as in the static path. The main process confirms a
batch's segments with the coordinator *before* handing it out and drops the
rows of any segment the coordinator refuses (its lease expired and went to
another consumer), so a sample reaches training at most once, and, with the
coordinator requeueing what was not confirmed, exactly once.

Every rank must see the same number of batches (collectives hang otherwise),
but leases are not cut in batch multiples. So any batch shorter than
``batch_size`` (a worker's last one, or one that lost rows) is held back, and
the held rows are re-cut into full batches at the end of the epoch: a rank
gets exactly ``ceil(quota / batch_size)`` batches, the same for every rank.
"""

from __future__ import annotations

import multiprocessing as mp
import traceback
from collections.abc import Iterator
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING

import numpy as np
import torch

from stoker import plan
from stoker.coordinator.client import CoordinatorClient, LeaseRejected
from stoker.coordinator.source import LeaseStream
from stoker.loader.dataset import TokenDataset

if TYPE_CHECKING:
    from stoker.loader.fast import _Slots

Batch = dict[str, torch.Tensor]
Segments = list[tuple[int, int, int]]  # (lease, upto, rows)


def _worker(
    ds: TokenDataset,
    client: CoordinatorClient,
    rank: int,
    worker: int,
    slots: _Slots,
    conn: Connection,
) -> None:
    from stoker.loader.fast import _fill

    torch.set_num_threads(1)
    reader = ds._reader()
    stream = plan.Stream(ds.num_samples, ds.shuffle_config)
    try:
        leases = LeaseStream(client, rank, worker)
        conn.send(("epoch", leases.consumer, leases.epoch))
        for positions, segments in leases.batches(ds.batch_size):
            ids = stream.samples(positions)
            reader.plan(ids, np.zeros(0, dtype=np.int64))
            slot = conn.recv()
            if slot is None:
                return
            _fill(reader, ids, slots, slot)
            conn.send(("batch", slot, len(ids), segments))
        conn.send(("done",))
    except BaseException as exc:
        try:
            conn.send(("error", type(exc).__name__, str(exc), traceback.format_exc()))
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
    ) -> None:
        self.ds, self.client, self.rank = ds, client, rank
        self.num_workers, self.prefetch = num_workers, prefetch
        self.epoch: int | None = None
        self.dropped = 0  # rows whose confirm was refused
        self.delivered = 0

    def _confirm(self, consumer: int, batch: Batch, segments: Segments) -> Batch:
        """Confirm each segment; keep the rows of the confirmed ones."""
        assert self.epoch is not None
        keep = np.ones(len(batch["sample_id"]), dtype=bool)
        row = 0
        for lease, upto, rows in segments:
            try:
                self.client.confirm(consumer, self.epoch, lease, upto)
            except LeaseRejected:
                keep[row : row + rows] = False
            row += rows
        if keep.all():
            return batch
        self.dropped += int((~keep).sum())
        idx = torch.from_numpy(np.flatnonzero(keep))
        return {k: v[idx] for k, v in batch.items()}

    def __iter__(self) -> Iterator[Batch]:
        B = self.ds.batch_size
        held: list[tuple[int, Batch, Segments]] = []
        for consumer, batch, segments in self._produce():
            if len(batch["sample_id"]) < B:
                held.append((consumer, batch, segments))  # confirmed when handed out
                continue
            out = self._confirm(consumer, batch, segments)
            if len(out["sample_id"]) < B:
                held.append((consumer, out, []))  # already confirmed; re-cut at the end
                continue
            self.delivered += B
            yield out
        rows = [self._confirm(c, b, s) if s else b for c, b, s in held]
        rows = [r for r in rows if len(r["sample_id"])]
        if rows:
            merged = {k: torch.cat([r[k] for r in rows]) for k in rows[0]}
            n = len(merged["sample_id"])
            for lo in range(0, n, B):
                self.delivered += min(B, n - lo)
                yield {k: v[lo : lo + B] for k, v in merged.items()}

    def _produce(self) -> Iterator[tuple[int, Batch, Segments]]:
        if self.num_workers == 0:
            yield from self._in_process()
        else:
            yield from self._from_workers()

    def _in_process(self) -> Iterator[tuple[int, Batch, Segments]]:
        reader = self.ds._reader()
        stream = plan.Stream(self.ds.num_samples, self.ds.shuffle_config)
        try:
            leases = LeaseStream(self.client, self.rank, 0)
            self.epoch = leases.epoch
            for positions, segments in leases.batches(self.ds.batch_size):
                ids = stream.samples(positions)
                reader.plan(ids, np.zeros(0, dtype=np.int64))
                toks, mask = reader.read(ids)
                batch = {"tokens": torch.from_numpy(toks), "sample_id": torch.from_numpy(ids)}
                if mask is not None:
                    batch["doc_start_mask"] = torch.from_numpy(mask)
                yield leases.consumer, batch, segments
        finally:
            reader.close()

    def _from_workers(self) -> Iterator[tuple[int, Batch, Segments]]:
        from stoker.loader.fast import WorkerError, _give_back, _Slots, _stop_workers

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
                    args=(ds, self.client, self.rank, w, rings[w], child),
                    daemon=True,
                    name=f"stoker-lease-worker-{w}",
                )
                proc.start()
                child.close()
                conns.append(parent)
                procs.append(proc)
                for slot in range(self.prefetch):
                    parent.send(slot)
            live = set(range(self.num_workers))
            while live:
                for w in sorted(live):
                    conn = conns[w]
                    if not conn.poll(0.01):
                        if not procs[w].is_alive() and not conn.poll(0):
                            raise WorkerError(
                                f"loader worker {w} died (exit code {procs[w].exitcode})"
                            )
                        continue
                    msg = conn.recv()
                    if msg[0] == "epoch":
                        consumer[w] = int(msg[1])
                        self.epoch = int(msg[2])
                    elif msg[0] == "batch":
                        _, slot, n, segments = msg
                        ring = rings[w]
                        batch = {"tokens": ring.tokens[slot, :n].clone(),
                                 "sample_id": ring.ids[slot, :n].clone()}  # fmt: skip
                        if ring.masks is not None:
                            batch["doc_start_mask"] = ring.masks[slot, :n].clone()
                        _give_back(conn, slot)
                        yield consumer[w], batch, [tuple(s) for s in segments]
                    elif msg[0] == "done":
                        live.discard(w)
                    else:
                        _, kind, text, trace = msg
                        raise WorkerError(f"loader worker {w} failed ({kind}: {text}):\n{trace}")
        finally:
            _stop_workers(conns, procs)
