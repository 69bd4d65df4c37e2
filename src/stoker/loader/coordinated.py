"""``TokenLoader`` fed by the coordinator's leases instead of the static plan.

Workers (or the main process, with ``num_workers=0``) are consumers: each
takes leases (:class:`~stoker.coordinator.consumer.LeaseStream`), turns positions
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

from collections import deque
from collections.abc import Callable, Iterator

import numpy as np
import torch

from stoker.coordinator.client import CoordinatorClient
from stoker.coordinator.consumer import Confirmer, LeaseStream, confirm_window
from stoker.errors import StokerError
from stoker.loader.consumer import ConsumerSpec
from stoker.loader.planned import PlannedDataset
from stoker.loader.pool import WorkerPool

Batch = dict[str, torch.Tensor]
Segments = list[tuple[int, int, int]]  # (lease, upto, rows)


class CoordinatedEpoch:
    """One epoch of a rank's batches through the coordinator: the worker pool's batches
    (unordered), confirmed in order, short ones held back and re-cut at the end."""

    def __init__(
        self,
        ds: PlannedDataset,
        client: CoordinatorClient,
        rank: int,
        num_workers: int,
        prefetch: int,
        min_epoch: int = 0,
        *,
        timeout: float = 300.0,
        ready: Callable[[int], None] | None = None,
    ) -> None:
        # the Lease, Heartbeat and ConfirmBatch calls go with the node's others, one
        # message per tick, through its agent when the dataset reads through one
        self.ds, self.client, self.rank = ds, client.relayed(ds.relay()), rank
        self.num_workers, self.prefetch = num_workers, prefetch
        self.epoch: int | None = None
        self.min_epoch = min_epoch
        self.timeout = timeout
        self.ready = ready  # told how many batches wait for their confirms
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
        if None not in answers:  # all accepted: the common case
            return batch
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
        pending: deque[tuple[Batch, Segments]] = deque()  # handed to the confirmer, in order
        window = confirm_window(self.prefetch, B * self.ds.layout.row_bytes())
        confirmer = Confirmer(self.client, B, gather=max(1, window // 2))

        def hand_out() -> Batch | None:
            """The next pending batch once confirmed: full, or None (held back)."""
            batch, segments = pending.popleft()
            out = self._keep(batch, segments, confirmer.take())
            rows = len(out["sample_id"])
            if rows == B:
                self.delivered += B
                self.batches += 1
                return out
            if rows:
                held.append(out)
            return None

        answers = confirmer.answers  # read per batch: a deque, not a call
        ready = self.ready
        try:
            for consumer, batch, segments in self._produce():
                assert self.epoch is not None
                confirmer.submit(self.epoch, consumer, segments)
                pending.append((batch, segments))
                # hand out what is confirmed; wait for a confirm only with `window` queued
                while pending and (answers or len(pending) > window):
                    if ready is not None:
                        ready(len(pending) - 1)
                    out = hand_out()
                    if out is not None:
                        yield out
            while pending:
                out = hand_out()
                if out is not None:
                    yield out
        finally:
            confirmer.close()
            self.client.close()  # this epoch's copy: its channel and its link to the agent
        if held:
            merged = {k: torch.cat([r[k] for r in held]) for k in held[0]}
            n = len(merged["sample_id"])
            for lo in range(0, n, B):
                self.delivered += min(B, n - lo)
                self.batches += 1
                yield {k: v[lo : lo + B] for k, v in merged.items()}
        self.finished = True

    def _produce(self) -> Iterator[tuple[int, Batch, Segments]]:
        """``(consumer, batch, segments)`` as the pool's consumers read them."""
        ds = self.ds
        ds.release_readers()  # (a reader an in-process static pass kept: not this pass's)
        stream, locality = ds.stream_identity(), ds.locality()
        # the pass is one epoch: the coordinator's current one, unless this rank is past it;
        # a worker that could only join a later epoch (the others finished this one first)
        # hands out nothing
        epoch = max(self.min_epoch, self.client.status().epoch)
        spec = ConsumerSpec(
            source=lambda w: LeaseStream(
                self.client,
                self.rank,
                w,
                min_epoch=epoch,
                max_epoch=epoch,
                stream=stream,
                ahead=True,  # the reader plans the next lease's blocks before it begins
                **locality,
            ),
            samples=ds.lease_stream().samples,
            reader=ds.open_reader,
            batch_size=ds.batch_size,
        )
        pool = WorkerPool(
            spec, ds.layout, self.num_workers, prefetch=self.prefetch, timeout=self.timeout,
            rank=self.rank, ordered=False, name="stoker-lease-worker",
        )  # fmt: skip
        try:
            seen = None
            for got in pool.batches():
                began = pool.began[got.worker]
                if began is not seen:  # a consumer (re)registered: check its epoch once
                    seen = began
                    self._began(began.epoch, began.first_step)
                if began.epoch != self.epoch:  # (LeaseStream's max_epoch keeps this from happening)
                    raise StokerError(
                        f"loader worker {got.worker} read epoch {began.epoch} in a pass of epoch "
                        f"{self.epoch}; this is a stoker bug"
                    )
                batch = got.arrays
                if not got.owned:  # held until confirmed: out of the slot
                    batch = {k: v.clone() for k, v in batch.items()}
                    pool.give_back(got)
                yield began.consumer, batch, got.segments
        finally:
            pool.close()


DynamicEpoch = CoordinatedEpoch  # its name before 0.2
