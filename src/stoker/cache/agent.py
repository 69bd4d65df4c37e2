"""The node agent: one process per machine owns the cache every local reader reads through.

Readers (each rank, each DataLoader worker) connect over a Unix socket
(:mod:`stoker.cache.server` accepts and serves the connections and dispatches
their requests, :mod:`stoker.cache.wire` frames them, messages in
``proto/agent.proto``). For a block they get back the name of a file in shared
memory holding it decoded; they map it read-only, so a block is fetched once
and decoded once per machine however many processes read it. Behind the memory
tier, a disk tier keeps the verified compressed records across restarts. This
module is what a request does to blocks: the tiers, single flight (one load per
block however many ask) and prefetch along the readers' plans.

The agent owns its files outright: a lock held with ``flock`` (dropped by the
kernel when the agent dies) admits one agent per cache directory; pins belong
to connections, so a reader killed with SIGKILL loses its pins when its socket
closes; and the agent only ever deletes files under the directories it names.
Bookkeeping (sizes, pins, clairvoyant eviction) is the pure
:class:`~stoker.cache.table.TierTable`; this module does the I/O it decides on.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import socket
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from stoker import errors
from stoker._proto import agent_pb2 as pb
from stoker.cache.config import FRAME_TIMEOUT, MAX_CONNECTIONS, AgentConfig
from stoker.cache.paths import AgentPaths
from stoker.cache.remote import RateLimiter, RemoteStorage
from stoker.cache.server import AgentServer
from stoker.cache.table import TierTable
from stoker.cache.tiers import DiskTier, Key
from stoker.cache.views import HeldImages, RecordBlocks, TokenBlocks
from stoker.coordinator.relay import Relays
from stoker.errors import AgentError, AgentRunningError, ConfigError
from stoker.formats.tokens import TokenSource
from stoker.observe.agent import AgentCollector, Counters

log = logging.getLogger("stoker.agent")
#: The memory tier's files (the only names the agent removes there).
SHM_SUFFIXES = (".tok", ".arrow", ".tmp")
View = TokenBlocks | RecordBlocks


def remove_tree(shm: Path) -> None:
    """Remove the memory tier's directory and its files (only the names the agent writes)."""
    if not shm.is_dir():
        return
    for f in shm.iterdir():
        if f.suffix in SHM_SUFFIXES:
            f.unlink(missing_ok=True)
    with contextlib.suppress(OSError):
        shm.rmdir()


class _LaterPuts:
    """The disk tier as a dataset's cache, written behind: a load makes its block ready in
    memory and answers its readers first; its record then goes to a queue that one
    writer thread, at a low scheduling priority, writes to disk (so keeping records
    across restarts takes the cores the readers leave idle). Records in the queue are
    served from it; past ``max_queued`` bytes in it a load writes its own record;
    :meth:`drain` writes what is left (the agent's stop)."""

    def __init__(self, disk: DiskTier, max_queued: int = 256 << 20) -> None:
        self.disk = disk
        self.max_queued = max_queued
        self._local = threading.local()
        self._cond = threading.Condition()
        self._queued: dict[str, bytes] = {}  # written by the writer in insertion order
        self._bytes = 0
        self._writing = 0
        self._writer: threading.Thread | None = None

    def get(self, key: str) -> bytes | None:
        with self._cond:
            data = self._queued.get(key)
        return data if data is not None else self.disk.get(key)

    def put(self, key: str, data: bytes) -> None:
        pending: list[tuple[str, bytes]] | None = getattr(self._local, "pending", None)
        if pending is None:
            self.disk.put(key, data)  # not inside a load: at once
        else:
            pending.append((key, data))

    def discard(self, key: str) -> None:
        with self._cond:
            data = self._queued.pop(key, None)
            if data is not None:
                self._bytes -= len(data)
        self.disk.discard(key)

    @contextlib.contextmanager
    def holding(self) -> Iterator[list[tuple[str, bytes]]]:
        """Inside: this thread's puts wait in the list; :meth:`flush` it afterwards."""
        pending: list[tuple[str, bytes]] = []
        self._local.pending = pending
        try:
            yield pending
        finally:
            self._local.pending = None

    def flush(self, pending: list[tuple[str, bytes]]) -> None:
        """Queue ``pending`` for the writer (or write it here when the queue is full)."""
        for key, data in pending:
            with self._cond:
                if self._bytes + len(data) <= self.max_queued and key not in self._queued:
                    self._queued[key] = data
                    self._bytes += len(data)
                    if self._writer is None:
                        self._writer = threading.Thread(
                            target=self._write_loop, daemon=True, name="stoker-disk-writer"
                        )
                        self._writer.start()
                    self._cond.notify()
                    continue
            self.disk.put(key, data)
        pending.clear()

    def _write_loop(self) -> None:
        with contextlib.suppress(OSError, AttributeError):  # Linux: this thread only
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 10)
        while True:
            with self._cond:
                while not self._queued:
                    self._cond.wait()
                key = next(iter(self._queued))
                data = self._queued[key]
                self._writing += 1
            try:
                self.disk.put(key, data)
            except Exception:  # a record not kept on disk is fetched again when needed
                log.exception("disk tier write of %s failed", key)
            finally:
                with self._cond:
                    if self._queued.get(key) is data:
                        del self._queued[key]
                        self._bytes -= len(data)
                    self._writing -= 1
                    self._cond.notify_all()

    def drain(self, timeout: float = 60.0) -> None:
        """Wait until the writer has written every queued record (up to ``timeout`` s)."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while (self._queued or self._writing) and self._writer is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    log.warning("%d records not written to the disk tier", len(self._queued))
                    return
                self._cond.wait(left)


class _Load:
    """One load of a block in flight (single flight: every asker waits on this)."""

    def __init__(self, prefetch: bool = False) -> None:
        self.future: Future[bytes | None] = Future()  # None: in the memory tier; bytes: inline
        #: started ahead of a request and none waits for it yet (then settling its size
        #: evicts only blocks needed later than it, as its admission did)
        self.prefetch = prefetch


class Agent:
    """The node cache: serve blocks to local readers through shared memory."""

    @classmethod
    def from_config(cls, config: AgentConfig) -> Agent:
        """The agent with ``config``'s settings."""
        return cls(
            config.cache_dir,
            config.cache_limit,
            config.shm_limit,
            max_remote=config.max_remote,
            max_rate=config.max_rate,
            prefetch_bytes=config.prefetch_bytes,
            decode_threads=config.decode_threads,
            metrics_port=config.metrics_port,
            shm_root=Path(config.shm_root) if config.shm_root else None,
            idle_exit=config.idle_exit,
            max_connections=config.max_connections,
            frame_timeout=config.frame_timeout,
        )

    def __init__(
        self,
        cache_dir: str | os.PathLike[str],
        cache_limit: int,
        shm_limit: int = AgentConfig.shm_limit,
        *,
        max_remote: int = AgentConfig.max_remote,
        max_rate: float = AgentConfig.max_rate,
        prefetch_bytes: int | None = None,
        decode_threads: int = AgentConfig.decode_threads,
        metrics_port: int | None = None,
        shm_root: Path | None = None,
        idle_exit: float | None = None,
        max_connections: int = MAX_CONNECTIONS,
        frame_timeout: float = FRAME_TIMEOUT,
    ) -> None:
        if cache_limit <= 0:
            raise ConfigError(f"cache_limit must be positive, got {cache_limit} bytes")
        if shm_limit < 0:
            raise ConfigError(f"shm_limit must be >= 0, got {shm_limit} bytes")
        if max_connections < 1 or not frame_timeout > 0:
            raise ConfigError(
                f"max_connections must be >= 1 and frame_timeout > 0 (--max-connections, "
                f"--frame-timeout), got {max_connections} and {frame_timeout}"
            )
        self.paths = AgentPaths(cache_dir, shm_root)
        self.counters = Counters()
        self.disk = DiskTier(self.paths, cache_limit, self.counters)
        self._records = _LaterPuts(self.disk)  # what the datasets read through
        self.memory = TierTable(shm_limit)
        # prefetch looks this far into a reader's plan (default: half the memory tier)
        self.prefetch_bytes = shm_limit // 2 if prefetch_bytes is None else prefetch_bytes
        self.metrics_port = metrics_port
        self._remote_slots = threading.BoundedSemaphore(max(1, max_remote))
        self._limiter = RateLimiter(max_rate)
        self._pool = ThreadPoolExecutor(max(1, decode_threads), thread_name_prefix="stoker-agent")
        self._lock = threading.Lock()  # memory table, loads, datasets, clients
        self._datasets: dict[str, View] = {}  # by key
        self._loads: dict[Key, _Load] = {}
        self._next_client = 1
        self._clients: set[int] = set()
        self._lock_fd: int | None = None
        self._shm_ok = shm_limit > 0
        self._shm_warned = False
        self.metrics_address: tuple[str, int] | None = None
        self.idle_exit = idle_exit  # exit after this many seconds without a reader
        self.max_connections = max_connections
        self.frame_timeout = frame_timeout
        self._last_active = time.monotonic()
        self._server = AgentServer(self)  # the socket: accept, serve, dispatch, refuse
        # its readers' coordinator calls, one message a tick, sent as this node's cache
        self.relays = Relays(self.counters, sender=f"{socket.gethostname()}:{self.paths.cache_dir}")

    # -- life cycle --------------------------------------------------------------------
    def start(self) -> None:
        """Take the cache directory, adopt the disk tier, listen. Raises AgentRunningError."""
        p = self.paths
        p.cache_dir.mkdir(parents=True, exist_ok=True)
        if not p.marker.exists():
            stray = [
                f.name for f in p.cache_dir.iterdir() if f.name not in ("agent.log", "agent.spawn")
            ]
            if stray:
                raise AgentError(
                    f"{p.cache_dir} holds files that are not a stoker cache ({', '.join(stray[:3])}"
                    f"{', ...' if len(stray) > 3 else ''}); use an empty or new directory"
                )
            p.marker.write_text("stoker node cache\n")
        fd = os.open(p.lock, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            owner = ""
            with contextlib.suppress(OSError):
                owner = p.lock.read_text().strip()
            raise AgentRunningError(
                f"another stoker agent{f' (pid {owner})' if owner else ''} already owns "
                f"{p.cache_dir}; connect to it at {p.socket}"
            ) from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._lock_fd = fd
        # we hold the lock: a socket file left here is stale (its agent is gone)
        p.socket.unlink(missing_ok=True)
        self._prepare_shm()
        adopted = self.disk.scan()
        self._server.listen()
        if self.metrics_port is not None:
            self._start_metrics(self.metrics_port)
        log.info(
            "agent pid %d on %s: disk tier %d records adopted, limit %d B; memory tier %s, "
            "limit %d B",
            os.getpid(),
            p.cache_dir,
            adopted,
            self.disk.table.capacity,
            p.shm if self._shm_ok else "off",
            self.memory.capacity,
        )

    def _prepare_shm(self) -> None:
        shm = self.paths.shm
        if not self._shm_ok:
            return
        try:
            if shm.exists():
                for f in shm.iterdir():  # decoded files of an earlier agent on this directory
                    if f.suffix in SHM_SUFFIXES:
                        f.unlink(missing_ok=True)
            shm.mkdir(mode=0o700, parents=False, exist_ok=True)
        except OSError as exc:
            self._shm_ok = False
            self._warn_shm(f"memory tier off: {shm} is not usable ({exc})")

    def serve_forever(self) -> None:
        """Serve readers until :meth:`stop` (or ``idle_exit`` seconds without one)."""
        self._server.serve_forever()

    # -- readers (the server's calls) -------------------------------------------------
    def idle_for(self) -> float | None:
        """Seconds since the last reader left when none is connected and the agent exits
        when idle (``idle_exit``); None otherwise."""
        with self._lock:
            idle = not self._clients and self.idle_exit is not None
            quiet = time.monotonic() - self._last_active
        return quiet if idle else None

    def admit(self) -> int | None:
        """A number for a new reader connection; None when ``max_connections`` are served."""
        with self._lock:
            if len(self._clients) >= self.max_connections:
                return None
            client = self._next_client
            self._next_client += 1
            self._clients.add(client)
            self._last_active = time.monotonic()
        self.counters.add("connections")
        return client

    def leave(self, client: int) -> None:
        """Reader connection ``client`` closed: its pins go."""
        with self._lock:
            released = self.memory.drop_client(client)
            self._clients.discard(client)
            self._last_active = time.monotonic()
        if released:
            self.counters.add("pins_released_on_disconnect", released)

    def release(self, dataset_id: str, blocks: list[int], client: int) -> None:
        """``client`` no longer holds ``blocks``."""
        with self._lock:
            for b in blocks:
                self.memory.unpin((dataset_id, int(b)), client)

    def stop(self) -> None:
        """Stop serving and remove the memory tier (decoded blocks die with their agent;
        readers keep what they have mapped). The disk tier stays for the next agent."""
        self._server.close()
        self.relays.close()
        self._pool.shutdown(wait=True, cancel_futures=True)
        self._records.drain()  # what loads left for the disk tier, while the lock is held
        if self._shm_ok and self._lock_fd is not None:
            remove_tree(self.paths.shm)
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    # -- datasets ----------------------------------------------------------------------
    def _open(self, req: pb.Open) -> str:
        """Open the dataset at ``req.url`` (a records one as ``req.view_json`` says); the
        key later requests name it by."""
        view = None
        if req.view_json:
            from stoker.records.held import View as RecordView

            view = RecordView.from_json(req.view_json)
        key = view.key(req.dataset_id) if view is not None and req.dataset_id else req.dataset_id
        with self._lock:
            ds = self._datasets.get(key) if key else None
        if ds is not None:
            if (view is None) != isinstance(ds, TokenBlocks):  # (two kinds under one name)
                kind = "a token" if isinstance(ds, TokenBlocks) else "a records"
                raise errors.DatasetError(
                    f"{req.url}: dataset {req.dataset_id} is open on this agent as {kind} "
                    "dataset; open it as one"
                )
            return ds.key
        options = json.loads(req.storage_options_json) if req.storage_options_json else None
        storage = RemoteStorage(req.url, options, self._remote_slots, self._limiter, self.counters)
        held: View
        if view is None:
            held = TokenBlocks(TokenSource(req.url, options, cache=self._records, storage=storage))
        else:
            from stoker.formats.records import RecordSource

            source = RecordSource(req.url, options, storage=storage, cache=self._records)
            view.check(source.schema, source.url)
            held = (HeldImages if view.hold == "images" else RecordBlocks)(source, view)
        got = held.id
        if req.dataset_id and got != req.dataset_id:
            raise errors.DatasetError(
                f"{req.url}: the agent read dataset {got}, the reader expected {req.dataset_id} "
                "(the dataset was rewritten in between); reopen it"
            )
        with self._lock:
            self._datasets.setdefault(held.key, held)
        return held.key

    def _dataset(self, dataset_id: str) -> View:
        with self._lock:
            ds = self._datasets.get(dataset_id)
        if ds is None:
            raise AgentError(f"dataset {dataset_id} is not open on this agent; send Open first")
        return ds

    # -- blocks ------------------------------------------------------------------------
    def _get(self, dataset_id: str, block: int, client: int) -> pb.Block:
        ds = self._dataset(dataset_id)
        if not 0 <= block < ds.num_blocks:
            raise errors.DatasetError(
                f"block {block} is outside dataset {dataset_id} ({ds.num_blocks} blocks)"
            )
        key = (dataset_id, block)
        path = self.paths.decoded(dataset_id, block, ds.suffix)
        counted = False
        while True:
            with self._lock:
                if self.memory.holds(key):
                    self.memory.pin(key, client)
                    if not counted:
                        self.counters.add("memory_hits")
                    return ds.reply(block, path=str(path))
                load = self._loads.get(key)
                if load is None:
                    load = self._start_load(ds, block, prefetch=False)
                    assert load is not None
                load.prefetch = False  # a reader waits for it now
            if not counted:
                self.counters.add("memory_misses")
                counted = True
            record = load.future.result()  # raises the load's error (typed, e.g. ChecksumError)
            if record is not None:
                self.counters.add("inline_fallbacks")
                return ds.reply(block, record=record)
            # loaded into the memory tier: pin it on the next pass (unless evicted meanwhile)

    def _start_load(self, ds: View, block: int, prefetch: bool) -> _Load | None:
        """Reserve room and start loading (call with the lock held).

        A prefetch that finds no room (without evicting a block needed sooner)
        starts nothing and returns None; a demand load without room is served
        inline (the reader decodes it).
        """
        key = (ds.key, block)
        evicted = (
            self.memory.admit(key, ds.size(block), prefetch=prefetch) if self._shm_ok else None
        )
        if evicted is None and prefetch:
            return None
        self._evicted(evicted or [])
        load = _Load(prefetch)
        self._loads[key] = load
        self._pool.submit(self._load, ds, block, evicted is not None, load)
        return load

    def _evicted(self, keys: list[Key]) -> None:
        """Remove the files of evicted entries (call with the lock held)."""
        for k in keys:
            held = self._datasets.get(k[0])
            suffix = held.suffix if held is not None else ".tok"
            self.paths.decoded(k[0], k[1], suffix).unlink(missing_ok=True)
            self.counters.add("memory_evictions")

    def _load(self, ds: View, block: int, reserved: bool, load: _Load) -> None:
        with self._records.holding() as pending:
            try:
                self._load_block(ds, block, reserved, load)
            finally:
                self._records.flush(pending)  # the record to disk, once readers are answered

    def _load_block(self, ds: View, block: int, reserved: bool, load: _Load) -> None:
        key = (ds.key, block)
        path = self.paths.decoded(ds.key, block, ds.suffix)
        try:
            record = ds.source.record(block)
            if not reserved:
                load.future.set_result(record)  # no room in shared memory: serve it inline
                return
            try:
                size = ds.write(block, record, path, self.counters)
            except OSError as exc:
                self._warn_shm(
                    f"memory tier write to {self.paths.shm} failed ({exc}); readers decode "
                    "blocks themselves until there is room"
                )
                with self._lock:
                    self.memory.remove(key)
                load.future.set_result(record)
                return
            with self._lock:
                evicted = self.memory.settle(key, size, prefetch=load.prefetch)
                if evicted is None:  # (took more than its estimate, and more than there is)
                    self.memory.remove(key)
                else:
                    self._evicted(evicted)
                    self.memory.ready(key)
            if evicted is None:
                path.unlink(missing_ok=True)
                load.future.set_result(record)
                return
            load.future.set_result(None)
        except BaseException as exc:
            with self._lock:
                self.memory.remove(key)
            load.future.set_exception(exc)
        finally:
            with self._lock:
                if self._loads.get(key) is load:
                    del self._loads[key]

    def _plan(self, dataset_id: str, blocks: list[int], client: int) -> None:
        """Remember what ``client`` reads next and prefetch the start of it."""
        ds = self._dataset(dataset_id)
        keys = [(dataset_id, b) for b in blocks]
        with self._lock:
            self.memory.set_plan(client, keys)
            if not self._shm_ok:
                return
            started = budget = 0
            for key in keys:
                budget += ds.size(key[1])
                if budget > self.prefetch_bytes:
                    break
                if key in self.memory.entries or key in self._loads:
                    continue
                if self._start_load(ds, key[1], prefetch=True) is None:
                    break  # no room without evicting something needed sooner
                started += 1
        if started:
            self.counters.add("prefetches", started)

    def holdings(self, dataset_id: str) -> list[int]:
        """Blocks of ``dataset_id`` (a key :meth:`_open` gave) held in either tier, ascending."""
        with self._lock:
            mem = {b for (d, b), e in self.memory.entries.items() if d == dataset_id and e.ready}
            held = self._datasets.get(dataset_id)
        stored = held.id if held is not None else dataset_id  # (the disk tier: stored blocks)
        with self.disk._lock:
            disk = {b for (d, b), e in self.disk.table.entries.items() if d == stored and e.ready}
        return sorted(mem | disk)

    # -- stats and metrics -----------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        with self._lock:
            lead = self._prefetch_lead()
            out: dict[str, Any] = dict(self.counters.values)
            out.update(
                memory_bytes=self.memory.used,
                memory_limit=self.memory.capacity,
                memory_blocks=sum(1 for e in self.memory.entries.values() if e.ready),
                pinned_bytes=self.memory.pinned_bytes,
                pinned_blocks=sum(1 for e in self.memory.entries.values() if e.pinned),
                disk_bytes=self.disk.table.used,
                disk_limit=self.disk.table.capacity,
                disk_blocks=len(self.disk.table.entries),
                loads_in_flight=len(self._loads),
                clients=len(self._clients),
                prefetch_lead=lead,
                memory_tier=self._shm_ok,
                pid=os.getpid(),
            )
        out.update(self.counters.latency_stats())
        return out

    def _prefetch_lead(self) -> int:
        """Blocks ready ahead of the slowest reader: the smallest run of resident planned blocks."""
        leads = []
        for ranks in self.memory._next_use.values():
            lead = 0
            for key in sorted(ranks, key=ranks.__getitem__):
                if not self.memory.holds(key):
                    break
                lead += 1
            leads.append(lead)
        return min(leads) if leads else 0

    def _start_metrics(self, port: int) -> None:
        from prometheus_client import CollectorRegistry

        from stoker.observe.serving import serve_registry

        registry = CollectorRegistry()
        registry.register(AgentCollector(self.stats))
        # a taken port (a second agent on the machine) moves to a free one, with a warning
        got = serve_registry(registry, port, "127.0.0.1", role="agent")
        if got is not None:
            self.metrics_address = ("127.0.0.1", got)

    def _warn_shm(self, text: str) -> None:
        if not self._shm_warned:
            self._shm_warned = True
            log.warning("%s", text)


if __name__ == "__main__":  # how readers of 0.1 start the agent: `stoker agent` now
    from stoker.cli.agent import main

    raise SystemExit(main())
