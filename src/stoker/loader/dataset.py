"""``TokenDataset``: a torch IterableDataset of packed token windows."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from stoker import plan
from stoker.cache import BlockCache, DiskCache
from stoker.cache.config import AgentConfig
from stoker.errors import ConfigError
from stoker.formats.tokens import Metadata, TokenSource
from stoker.loader.arena import NEVER, BlockArena, first_uses
from stoker.loader.batch import Layout
from stoker.loader.planned import PlannedDataset
from stoker.loader.samples import SampleReader, token_layout
from stoker.manifest import Manifest

if TYPE_CHECKING:
    from stoker.cache.client import AgentClient
    from stoker.storage import RetryPolicy

#: The least a reader plans ahead, in samples (it plans a whole shuffle window ahead,
#: up to 2^16 samples), far enough to decode the next window's blocks before the
#: first of them is needed.
PLAN_CHUNK = 2048


class TokenDataset(PlannedDataset):
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

    ``shuffle`` is True, False or a :class:`~stoker.ShuffleConfig` (seed, order, unit
    or shard size, spread or shuffle window), which then replaces ``seed``,
    ``shard_size`` and ``window_shards``. The default order, ``"spread"``, deals each
    stored block's samples out over the next few blocks' turns; its reader holds only
    the samples decoded and not yet taken (about ``spread + 1`` blocks' worth: some
    13 MiB at ``seq_len`` 2048 with 1 MiB blocks). ``ShuffleConfig(order="window")``
    (the default before there were two; a state saved then resumes only with it)
    shuffles windows of ``window_shards`` shards; its reader holds two windows of
    decoded blocks (about 150 MiB by default). ``arena_blocks`` reads through a
    decoded-block arena of that many blocks whatever the order (the window order's
    reader).

    Caching: ``cache=stoker.AgentConfig(directory, cache_limit=..., ...)`` reads
    blocks through the node agent that owns that directory, started with those
    settings if none runs; ``cache=`` a :class:`~stoker.BlockCache` keeps stored
    records in this process's own cache. The older keywords do the same: with
    ``cache_dir`` (or an ``agent``) blocks are read through the
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
        shuffle: bool | plan.ShuffleConfig = True,
        shard_size: int | None = None,
        window_shards: int = 16,
        drop_remainder: bool = False,
        storage_options: dict[str, Any] | None = None,
        cache: BlockCache | AgentConfig | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
        cache_limit: int = AgentConfig.cache_limit,
        shm_limit: int = AgentConfig.shm_limit,
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
        if isinstance(cache, AgentConfig):  # the node agent, with these settings
            if cache_dir is not None or agent is not None:
                raise ConfigError(
                    "cache=AgentConfig(...) names the agent's directory and limits: give "
                    "neither cache_dir nor agent beside it"
                )
            from stoker.cache.client import AgentClient

            agent = AgentClient(config=cache)
            cache = None
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
        config = plan.shuffle_config(shuffle, seed, shard_size, window_shards)
        self.shuffle_config = config.resolve(seq_len, m.block_tokens)
        self.drop_remainder = drop_remainder
        self.rank, self.world_size = rank, world_size
        self.doc_starts = doc_starts
        self.arena_blocks = arena_blocks
        self.name = self.source.url
        self._init_epochs()

    # -- identity --------------------------------------------------------------
    @property
    def manifest(self) -> Manifest:
        return self.source.manifest

    def identity(self) -> dict[str, Any]:
        """What a state must match (:data:`stoker.loader.state.IDENTITY_FIELDS`)."""
        c = self.shuffle_config
        return {
            "dataset_id": self.source.manifest.dataset_id,
            "num_samples": self.num_samples,
            "seq_len": self.seq_len,
            "seed": c.seed,
            "shuffle": c.shuffle,
            "shard_size": c.shard_size,
            "window_shards": c.window_shards,
            # only beside the second order: states saved before it existed name none
            **({"order": c.order, "spread": c.spread} if c.order != "window" else {}),
        }

    @property
    def plans_next_epoch(self) -> bool:  # type: ignore[override]
        """Through a node agent, which keeps what it prefetches across epochs (a reader's
        own arena is dropped at the end of the epoch)."""
        return self.agent is not None

    @property
    def reader_spans_epochs(self) -> bool:  # type: ignore[override]
        """A token sample is the same whatever the epoch: a pass in the process that uses
        its batches keeps its reader for the next, without a node agent (through one, the
        agent keeps what it prefetched, and a reader kept would keep its blocks pinned)."""
        return self.agent is None

    @property
    def layout(self) -> Layout:
        return TokenReader.layout_for(self.seq_len, self.doc_starts)

    def open_reader(
        self, epoch: int = 0, decoding: int | None = None
    ) -> TokenReader | SampleReader:
        """This dataset's reader (a token sample is the same whatever the ``epoch``);
        ``decoding``: how many blocks the spread order's reader
        decodes at once (default: :func:`~stoker.loader.arena.decoding_threads`; a mixture
        shares that out among its sources' readers; the window order's arena reader
        decodes as it always does)."""
        c = self.shuffle_config
        assert c.shard_size is not None
        m = self.source.manifest
        if c.order == "spread" and self.arena_blocks is None and self.seq_len + 1 <= m.block_tokens:
            # a unit's samples are all dealt out within D turns of its arrival
            D = len(plan.spread_profile(c.shard_size, c.spread))
            horizon = max(PLAN_CHUNK // 4, (D + 1) * c.shard_size)
            return SampleReader(
                self.source,
                self.seq_len,
                self.doc_starts,
                horizon,
                self.agent,
                # four turns' read-ahead (sixteen from a network): with one, the consumer
                # waited at nearly every turn's start for its new unit's block (2 cores)
                ahead=4 * c.shard_size,
                gap=2 * c.shard_size + 1,  # a unit's samples come at least once a turn
                decoding=decoding,
            )
        horizon = min(max(PLAN_CHUNK, c.shard_size * c.window_shards), 1 << 16)
        return TokenReader(
            self.source, self.seq_len, self._arena_slots(), self.doc_starts, horizon, self.agent
        )

    def transfer_dtypes(self) -> dict[str, torch.dtype]:
        """``tokens`` in the narrowest dtype of the vocabulary (they are stored so)."""
        from stoker.device import narrow_dtype

        narrow = narrow_dtype(self.source.manifest.vocab_size)
        return {"tokens": narrow} if narrow is not None else {}

    def locality(self) -> dict[str, Any]:
        """With a node agent: the node's cache, and what of each epoch it holds."""
        agent = self.agent
        if agent is None:
            return {}
        from stoker.coordinator.consumer import local_ranges

        m = self.source.manifest

        def local(epoch: int) -> list[tuple[int, int]]:
            held = agent.holdings(m.dataset_id)
            return local_ranges(
                self.num_samples, self.seq_len, m.block_tokens, self.shuffle_config, epoch, held
            )

        return {"node": agent.node, "local": local}

    def relay(self) -> str | None:
        return None if self.agent is None else str(self.agent.paths.socket)

    def holds(self) -> Callable[[np.ndarray], np.ndarray] | None:
        agent = self.agent
        if agent is None:
            return None
        m = self.source.manifest
        held = np.zeros(m.num_blocks, dtype=bool)
        got = np.asarray(agent.holdings(m.dataset_id), dtype=np.int64)
        held[got[(got >= 0) & (got < m.num_blocks)]] = True
        # held blocks before each block: a run of blocks is held whole when the count
        # over it is its length (a sample spans more than two when seq_len > block_tokens)
        before = np.concatenate([[0], np.cumsum(held)])
        L, bt = self.seq_len, m.block_tokens

        def test(ids: np.ndarray) -> np.ndarray:  # sample i is tokens [i L, i L + L]
            i = np.asarray(ids, dtype=np.int64)
            first, last = i * L // bt, np.minimum((i * L + L) // bt, m.num_blocks - 1)
            whole: np.ndarray = before[last + 1] - before[first] == last - first + 1
            return whole

        return test

    def _arena_slots(self) -> int:
        if self.arena_blocks is not None:
            return self.arena_blocks
        m = self.source.manifest
        c = self.shuffle_config
        assert c.shard_size is not None
        window_tokens = c.shard_size * c.window_shards * self.seq_len
        # two windows (current + next) plus the blocks straddling their edges
        return 2 * (-(-window_tokens // m.block_tokens)) + 2 * c.window_shards + 4


class TokenReader:
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
        self.layout = self.layout_for(seq_len, doc_starts)
        self.bt = source.manifest.block_tokens
        self.horizon = horizon
        self._table = np.full(source.manifest.num_blocks, NEVER, dtype=np.int64)
        self._warm = False
        self._seq = np.zeros(0, dtype=np.int64)
        self._pos = 0
        self._scheduled = -1

    @staticmethod
    def layout_for(seq_len: int, doc_starts: bool) -> Layout:
        """A batch of windows (:func:`stoker.loader.samples.token_layout`)."""
        return token_layout(seq_len, doc_starts)

    def plan(self, upcoming: np.ndarray) -> None:
        """The samples that come next, in order."""
        self._seq = upcoming
        self._pos = 0
        self._scheduled = -1

    def fill(self, ids: np.ndarray, out: dict[str, np.ndarray]) -> None:
        """Windows of the next ``len(ids)`` planned samples into ``out`` (any integer
        dtype wide enough for the vocabulary; the copy converts)."""
        self.read(ids, out["tokens"], out.get("doc_start_mask"))

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
