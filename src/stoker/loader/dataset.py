"""``TokenDataset``: a torch IterableDataset of packed token windows."""

from __future__ import annotations

import operator
import os
import uuid
import warnings
from collections import deque
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch.utils.data import IterableDataset

from stoker import intervals, plan
from stoker.cache import BlockCache, DiskCache
from stoker.errors import ConfigError, StateError
from stoker.formats.tokens import Metadata, TokenSource
from stoker.loader import passes
from stoker.loader import state as st
from stoker.loader.arena import NEVER, BlockArena, first_uses
from stoker.loader.distributed import Placement, detect
from stoker.loader.sources import StaticSource
from stoker.metrics_export import exported, worker_export

if TYPE_CHECKING:
    from stoker.cache.client import AgentClient
    from stoker.storage import RetryPolicy

#: Samples planned at a time; the reader looks one to two chunks ahead, far enough
#: to decode the next shuffle window's blocks before the first of them is needed.
PLAN_CHUNK = 2048


class TokenDataset(IterableDataset):  # type: ignore[type-arg]
    """Packed windows of ``seq_len + 1`` tokens from a token dataset at ``url``.

    Each item is a dict: ``tokens`` (int64, ``seq_len + 1``), ``sample_id``
    (its global id) and ``doc_start_mask`` (bool, True where a document
    starts; see :func:`stoker.doc_starts` and :func:`stoker.cu_seqlens`).

    ``batch_size`` should equal the DataLoader's batch size: workers then take
    whole batches in turn, so the sample order does not depend on
    ``num_workers``. Iterated in its own process it counts what it handed out:
    iterating again after breaking out of a loop continues the epoch, and after the
    epoch's end runs the next one. Through torch DataLoader worker processes, which
    cannot report what was consumed, iterating again runs the next epoch (never the
    same one twice; see :mod:`stoker.loader.passes`): call :meth:`set_epoch` before
    each epoch to choose, or use torchdata's StatefulDataLoader or
    :class:`~stoker.TokenLoader` to continue a broken-off epoch.

    Caching: with ``cache_dir`` (or an ``agent``) blocks are read through the
    node agent that owns that directory, started on first use if none runs:
    one download and one decode per machine, shared by every local process
    (``shm_limit`` bounds its shared-memory tier, ``cache_limit`` its disk
    tier; both apply only when this dataset starts the agent). ``agent=False``
    keeps the per-process disk cache instead; without ``cache_dir`` each
    process reads and decodes for itself.

    ``metadata`` (a :class:`~stoker.coordinator.client.CoordinatorClient` whose
    coordinator was started with ``--dataset``) supplies the manifest and the
    block index, so that a large job does not read them from storage once per
    process.

    ``retry`` (a :class:`~stoker.RetryPolicy`) sets the storage retry budget and
    the deadline of each read (default: up to 20 attempts within 120 s).
    """

    def __init__(
        self,
        url: str,
        seq_len: int,
        *,
        batch_size: int = 1,
        seed: int = 0,
        shuffle: bool = True,
        shard_size: int | None = None,
        window_shards: int = 16,
        drop_remainder: bool = False,
        storage_options: dict[str, Any] | None = None,
        cache: BlockCache | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
        cache_limit: int = 64 << 30,
        shm_limit: int = 4 << 30,
        agent: AgentClient | bool | None = None,
        rank: int | None = None,
        world_size: int | None = None,
        doc_starts: bool = True,
        arena_blocks: int | None = None,
        metadata: Metadata | None = None,
        retry: RetryPolicy | None = None,
    ) -> None:
        super().__init__()
        if seq_len < 1:
            raise ConfigError(f"seq_len must be >= 1, got {seq_len}")
        if batch_size < 1:
            raise ConfigError(f"batch_size must be >= 1, got {batch_size}")
        if agent is None:
            agent = cache_dir is not None and cache is None
        if agent is True:
            from stoker.cache.client import AgentClient

            agent = AgentClient(cache_dir, cache_limit, shm_limit)
        elif cache is None and cache_dir is not None:
            cache = DiskCache(cache_dir, cache_limit)
        self.agent: AgentClient | None = agent or None
        self.source = TokenSource(url, storage_options, cache, metadata=metadata, retry=retry)
        m = self.source.manifest
        if m.num_tokens < seq_len + 1:
            raise ConfigError(
                f"seq_len {seq_len} needs {seq_len + 1} tokens per sample, but {self.source.url} "
                f"holds only {m.num_tokens} tokens; use seq_len <= {m.num_tokens - 1}"
            )
        self.seq_len = seq_len
        self.batch_size = batch_size
        self.num_samples = (m.num_tokens - 1) // seq_len
        seed, window_shards = operator.index(seed), operator.index(window_shards)
        shard_size = None if shard_size is None else operator.index(shard_size)
        self.shuffle_config = plan.ShuffleConfig(seed, shuffle, shard_size, window_shards).resolve(
            seq_len
        )
        self.drop_remainder = drop_remainder
        self.rank, self.world_size = rank, world_size
        self.doc_starts = doc_starts
        self.arena_blocks = arena_blocks
        self._epoch = 0
        self._next_set: np.ndarray | None = None  # carried set of the epoch after the last one run
        self._pending: dict[str, Any] | None = None  # a loaded state, applied at the next iteration
        self._finished: dict[str, Any] | None = None  # a worker's state after its epoch ended
        self._progress: st.Progress | None = None
        self._worker: dict[str, int] | None = None
        self._pass_key = uuid.uuid4().hex  # names this dataset's epochs in loader.passes

    # -- identity --------------------------------------------------------------
    @property
    def manifest(self):  # type: ignore[no-untyped-def]
        return self.source.manifest

    def _identity(self) -> dict[str, Any]:
        c = self.shuffle_config
        return {
            "dataset_id": self.source.manifest.dataset_id,
            "num_samples": self.num_samples,
            "seq_len": self.seq_len,
            "seed": c.seed,
            "shuffle": c.shuffle,
            "shard_size": c.shard_size,
            "window_shards": c.window_shards,
        }

    # -- epochs ----------------------------------------------------------------
    def set_epoch(self, epoch: int) -> None:
        """Run epoch ``epoch`` next (like DistributedSampler.set_epoch).

        A state loaded for the same epoch stays in force; for another epoch it is dropped.
        """
        epoch = operator.index(epoch)
        if epoch < 0:
            raise ConfigError(f"epoch must be >= 0, got {epoch}")
        self._pass_key = uuid.uuid4().hex  # what the workers of later passes run anew
        if epoch != self._epoch:
            self._next_set = None
            self._pending = None
            self._finished = None
            self._progress = None  # a pass broken off in another epoch is not continued
            self._worker = None
        self._epoch = epoch

    @property
    def epoch(self) -> int:
        return self._epoch

    def _placement(self) -> Placement:
        return detect(self.rank, self.world_size)

    def _begin(self, pl: Placement) -> tuple[st.Progress, int]:
        """Progress to iterate and how many of this worker's samples to skip.

        A pass that was broken off (the caller stopped iterating before the epoch's
        end) is continued from what it consumed, exactly as its :meth:`state_dict`
        would restore it; so is a loaded state. Otherwise the epoch starts afresh.
        """
        pending = self._pending
        if pending is None and self._progress is not None:
            worker = dict(self._worker) if self._worker is not None else None
            pending = st.build(self._identity(), self.drop_remainder, self._progress, worker)
        if pending is not None:
            progress, worker = st.restore(pending, pl.world, self.batch_size)
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
        pl = self._placement()
        progress, _ = self._begin(pl)
        n = progress.split.per_rank - progress.consumed
        return plan.worker_count(n, pl.worker, pl.num_workers, self.batch_size)

    # -- iteration -------------------------------------------------------------
    def _id_chunks(
        self, progress: st.Progress, rank: int, worker: int, num_workers: int, skip: int, chunk: int
    ) -> Iterator[np.ndarray]:
        """Sample ids of one worker's share of the epoch, in order, ``chunk`` at a time."""
        source = StaticSource(progress, rank, worker, num_workers, self.batch_size, skip)
        stream = plan.Stream(self.num_samples, self.shuffle_config)
        for positions, _ in source.batches(chunk):
            yield stream.samples(positions)

    def _next_epoch_chunks(
        self, progress: st.Progress, rank: int, worker: int, num_workers: int, chunk: int
    ) -> Iterator[np.ndarray] | None:
        """The start of this worker's next epoch, to plan ahead with (computed when reached).

        Only through a node agent: it keeps what it prefetches across epochs, while
        a reader's own arena is dropped at the end of the epoch.
        """
        if self.agent is None:
            return None
        nxt = st.Progress(
            progress.epoch + 1,
            progress.split.next_epoch_set(progress.epoch, self.num_samples, self.drop_remainder),
            progress.world,
            progress.chunk,
        )
        return self._id_chunks(nxt, rank, worker, num_workers, 0, chunk)

    def _batches(
        self, reader: _Reader, progress: st.Progress, rank: int, worker: int, num_workers: int
    ) -> Iterator[np.ndarray]:
        """One worker's sample ids a batch at a time, planned on ``reader`` ahead of use."""
        B = self.batch_size
        chunk = B * max(1, PLAN_CHUNK // B)
        tail = self._next_epoch_chunks(progress, rank, worker, num_workers, chunk)
        chunks = self._id_chunks(progress, rank, worker, num_workers, 0, chunk)
        for ids in reader.lookahead(chunks, tail):
            for lo in range(0, len(ids), B):
                yield ids[lo : lo + B]

    def _reader(self) -> _Reader:
        c = self.shuffle_config
        assert c.shard_size is not None
        horizon = min(max(PLAN_CHUNK, c.shard_size * c.window_shards), 1 << 16)
        return _Reader(
            self.source, self.seq_len, self._arena_slots(), self.doc_starts, horizon, self.agent
        )

    def _finish_epoch(self, progress: st.Progress) -> None:
        if self._worker is not None:
            # inside a DataLoader worker, a state taken now (torchdata's StatefulDataLoader
            # snapshots after the generator ends) must still describe the finished epoch
            self._finished = st.build(
                self._identity(), self.drop_remainder, progress, dict(self._worker)
            )
        self._next_set = progress.split.next_epoch_set(
            progress.epoch, self.num_samples, self.drop_remainder
        )
        self._epoch = progress.epoch + 1
        self._progress = None
        self._worker = None

    def _start(self, pl: Placement) -> tuple[st.Progress, int]:
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
        return progress, skip

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
                    f"{self.source.url}: this DataLoader iteration runs epoch {epoch}: epoch "
                    f"{self._epoch} was run by an earlier iteration of the same loader (its "
                    "workers cannot know what was consumed, so it is not run twice); call "
                    "set_epoch() before each epoch, or use stoker.TokenLoader or torchdata's "
                    "StatefulDataLoader to continue a broken-off epoch",
                    RuntimeWarning,
                    stacklevel=3,
                )
            self._epoch = epoch
            self._next_set = None

    def __iter__(self) -> Iterator[dict[str, Any]]:
        from torch.utils.data import get_worker_info

        if get_worker_info() is None:
            return self._samples()
        # a torch DataLoader worker: its counts reach the parent's /metrics by file
        pl = self._placement()
        return exported(self._samples(), worker_export(pl.rank, pl.worker))

    def _samples(self) -> Iterator[dict[str, Any]]:
        pl = self._placement()
        progress, skip = self._start(pl)
        reader = self._reader()
        try:
            chunks = self._id_chunks(progress, pl.rank, pl.worker, pl.num_workers, skip, PLAN_CHUNK)
            tail = self._next_epoch_chunks(progress, pl.rank, pl.worker, pl.num_workers, PLAN_CHUNK)
            for ids in reader.lookahead(chunks, tail):
                for lo in range(0, len(ids), 64):
                    sub = ids[lo : lo + 64]
                    toks, mask = reader.read(sub)
                    tt = torch.from_numpy(toks)
                    mm = torch.from_numpy(mask) if mask is not None else None
                    for i, sid in enumerate(sub.tolist()):
                        item: dict[str, Any] = {"tokens": tt[i], "sample_id": sid}
                        if mm is not None:
                            item["doc_start_mask"] = mm[i]
                        if self._worker is not None:
                            self._worker["yielded"] += 1
                        else:
                            progress.consumed += 1
                        yield item
        finally:
            reader.close()
        self._finish_epoch(progress)

    def _arena_slots(self) -> int:
        if self.arena_blocks is not None:
            return self.arena_blocks
        m = self.source.manifest
        c = self.shuffle_config
        assert c.shard_size is not None
        window_tokens = c.shard_size * c.window_shards * self.seq_len
        # two windows (current + next) plus the blocks straddling their edges
        return 2 * (-(-window_tokens // m.block_tokens)) + 2 * c.window_shards + 4

    # -- state -------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """A small, exact snapshot of how far this stream got (see stoker.loader.state)."""
        if self._pending is not None:
            return dict(self._pending)
        if self._finished is not None:
            return dict(self._finished)
        progress = self._progress
        if progress is None:
            pl = self._placement()
            progress, _ = self._begin(pl)
        worker = dict(self._worker) if self._worker is not None else None
        return st.build(self._identity(), self.drop_remainder, progress, worker)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state`` at the next iteration. Raises StateError if it does not fit."""
        st.check(state, self._identity())
        if state["drop_remainder"] != self.drop_remainder:
            raise StateError(
                f"state was saved with drop_remainder={state['drop_remainder']}, "
                f"but this dataset has drop_remainder={self.drop_remainder}"
            )
        self._pending = dict(state)
        self._pass_key = uuid.uuid4().hex
        self._finished = None
        self._epoch = state["epoch"]
        self._next_set = None
        self._progress = None

    def epoch_positions(self) -> np.ndarray:
        """Interval set of stream positions of the epoch that would run next."""
        progress, _ = self._begin(self._placement())
        return intervals.make(progress.epoch_set)


class _Reader:
    """Turns sample ids into token windows through the decoded-block arena.

    The reader sees the plan ``horizon`` samples ahead (a whole shuffle window
    beyond the current chunk), so the blocks of the next window are decoded
    while the current one is read, and it re-plans the arena's prefetch and
    eviction every ``_RESCHEDULE`` samples.
    """

    _RESCHEDULE = 512
    _FIRST = 16  # the very first schedule loads only what these many samples need

    def __init__(
        self,
        source: TokenSource,
        seq_len: int,
        slots: int,
        doc_starts: bool,
        horizon: int,
        agent: AgentClient | None = None,
    ) -> None:
        self.source = source
        self.L = seq_len
        self.arena = BlockArena(source, slots, doc_starts, agent)
        self.bt = source.manifest.block_tokens
        self.horizon = horizon
        self._table = np.full(source.manifest.num_blocks, NEVER, dtype=np.int64)
        self._warm = False
        self._seq = np.zeros(0, dtype=np.int64)
        self._pos = 0
        self._scheduled = -1

    def plan(self, current: np.ndarray, upcoming: np.ndarray) -> None:
        """The samples that come next, in order."""
        self._seq = np.concatenate([current, upcoming])
        self._pos = 0
        self._scheduled = -1

    def lookahead(
        self, chunks: Iterator[np.ndarray], tail: Iterator[np.ndarray] | None = None
    ) -> Iterator[np.ndarray]:
        """Pass chunks of ids through, planning each with the ``horizon`` samples after it.

        ``tail`` (the next epoch's first chunks) is planned but never yielded, so
        the blocks the next epoch starts with are prefetched and kept at the end of
        this one.
        """
        ahead: deque[np.ndarray] = deque()
        planned: deque[np.ndarray] = deque()  # from the tail: plan only
        queued = 0
        exhausted = False
        while True:
            while (not exhausted or tail is not None) and (
                len(ahead) < 2 or queued - len(ahead[0]) < self.horizon
            ):
                if not exhausted:
                    nxt = next(chunks, None)
                    if nxt is None:
                        exhausted = True
                        continue
                    ahead.append(nxt)
                else:
                    assert tail is not None
                    nxt = next(tail, None)
                    if nxt is None:
                        tail = None
                        continue
                    planned.append(nxt)
                queued += len(nxt)
            if not ahead:
                return
            cur = ahead.popleft()
            queued -= len(cur)
            rest = [*ahead, *planned]
            self.plan(cur, np.concatenate(rest) if rest else np.zeros(0, dtype=np.int64))
            yield cur

    def read(
        self, ids: np.ndarray, out: np.ndarray | None = None, mask: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray | None]:
        """Windows of the next ``len(ids)`` planned samples, as int64 (into ``out`` if given)."""
        if self._scheduled < 0 or self._pos >= self._scheduled + self._RESCHEDULE:
            self._schedule()
        self._pos += len(ids)
        shape = (len(ids), self.L + 1)
        if out is None:
            out = np.empty(shape, dtype=np.int64)
        if mask is None and self.arena.doc_starts:
            mask = np.empty(shape, dtype=bool)
        self._read(ids, out, mask)
        return out, mask

    def _schedule(self) -> None:
        """Tell the arena which blocks come next, in order of first use."""
        self._scheduled = self._pos
        future = self._seq[self._pos :] * self.L
        seq_blocks = np.stack([future // self.bt, (future + self.L) // self.bt], axis=1).reshape(-1)
        order, first = first_uses(seq_blocks, self._table)
        if not self._warm:
            # the first batch waits for its own blocks only: the rest of the window is
            # scheduled once it is out, instead of competing with it for the cores
            self._warm = True
            needed = int((first < 2 * self._FIRST).sum())
            self.arena.schedule(order, first // 2, ahead=max(1, needed))
            self._scheduled = self._pos - self._RESCHEDULE + self._FIRST
            return
        self.arena.schedule(order, first // 2, ahead=self.arena.slots)

    def _read(self, ids: np.ndarray, out: np.ndarray, mask: np.ndarray | None) -> None:
        starts = ids * self.L
        span = -(-(self.L + 1) // self.bt) + 1  # blocks one window can touch
        if len(ids) * span > self.arena.slots - 1 and len(ids) > 1:  # too many blocks at once
            half = len(ids) // 2
            self._read(ids[:half], out[:half], None if mask is None else mask[:half])
            self._read(ids[half:], out[half:], None if mask is None else mask[half:])
            return
        self.arena.windows(starts, self.L + 1, out, mask)

    def close(self) -> None:
        self.arena.close()
