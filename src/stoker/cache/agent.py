"""The node agent: one process per machine owns the cache every local reader reads through.

Readers (each rank, each DataLoader worker) connect over a Unix socket
(:mod:`stoker.cache.wire`, messages in ``proto/agent.proto``). For a block they
get back the name of a file in shared memory holding it decoded; they map it
read-only, so a block is fetched once and decoded once per machine however
many processes read it. Behind the memory tier, a disk tier keeps the verified
compressed records across restarts.

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
import queue
import socket
import struct
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from stoker import errors
from stoker._proto import agent_pb2 as pb
from stoker.cache import wire
from stoker.cache.config import FRAME_TIMEOUT, MAX_CONNECTIONS, AgentConfig
from stoker.cache.layout import decoded_size, write_decoded
from stoker.cache.paths import AgentPaths
from stoker.cache.remote import RateLimiter, RemoteStorage
from stoker.cache.table import TierTable
from stoker.cache.tiers import DiskTier, Key
from stoker.errors import AgentError, AgentRunningError, ConfigError, StokerError
from stoker.formats.tokens import TokenSource
from stoker.observe.agent import AgentCollector, Counters

log = logging.getLogger("stoker.agent")


def remove_tree(shm: Path) -> None:
    """Remove the memory tier's directory and its files (only the names the agent writes)."""
    if not shm.is_dir():
        return
    for f in shm.iterdir():
        if f.suffix in (".tok", ".tmp"):
            f.unlink(missing_ok=True)
    with contextlib.suppress(OSError):
        shm.rmdir()


class _Dataset:
    def __init__(self, source: TokenSource) -> None:
        self.source = source
        m = source.manifest
        self.id = m.dataset_id
        self.itemsize = m.np_dtype.itemsize

    def size(self, block: int) -> int:
        return decoded_size(self.source.manifest.block_len(block), self.itemsize)


class _Load:
    """One load of a block in flight (single flight: every asker waits on this)."""

    def __init__(self) -> None:
        self.future: Future[bytes | None] = Future()  # None: in the memory tier; bytes: inline


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
        self.memory = TierTable(shm_limit)
        # prefetch looks this far into a reader's plan (default: half the memory tier)
        self.prefetch_bytes = shm_limit // 2 if prefetch_bytes is None else prefetch_bytes
        self.metrics_port = metrics_port
        self._remote_slots = threading.BoundedSemaphore(max(1, max_remote))
        self._limiter = RateLimiter(max_rate)
        self._pool = ThreadPoolExecutor(max(1, decode_threads), thread_name_prefix="stoker-agent")
        self._lock = threading.Lock()  # memory table, loads, datasets, clients
        self._datasets: dict[str, _Dataset] = {}
        self._loads: dict[Key, _Load] = {}
        self._next_client = 1
        self._clients: set[int] = set()
        self._lock_fd: int | None = None
        self._sock: socket.socket | None = None
        self._stopping = threading.Event()
        self._shm_ok = shm_limit > 0
        self._shm_warned = False
        self.metrics_address: tuple[str, int] | None = None
        self.idle_exit = idle_exit  # exit after this many seconds without a reader
        self.max_connections = max_connections
        self.frame_timeout = frame_timeout
        self._refusals: queue.Queue[socket.socket] = queue.Queue(maxsize=64)
        self._refuser: threading.Thread | None = None
        self._last_active = time.monotonic()

    # -- life cycle --------------------------------------------------------------------
    def start(self) -> None:
        """Take the cache directory, adopt the disk tier, listen. Raises AgentRunningError."""
        p = self.paths
        p.cache_dir.mkdir(parents=True, exist_ok=True)
        if not p.marker.exists():
            stray = [f.name for f in p.cache_dir.iterdir() if f.name not in ("agent.log",)]
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
        if len(str(p.socket)) > 100:
            raise ConfigError(
                f"socket path {p.socket} is too long for AF_UNIX; use a shorter cache_dir"
            )
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old = os.umask(0o177)  # the socket is private to this user
        try:
            sock.bind(str(p.socket))
        finally:
            os.umask(old)
        sock.listen(128)
        self._sock = sock
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
                    if f.suffix in (".tok", ".tmp"):
                        f.unlink(missing_ok=True)
            shm.mkdir(mode=0o700, parents=False, exist_ok=True)
        except OSError as exc:
            self._shm_ok = False
            self._warn_shm(f"memory tier off: {shm} is not usable ({exc})")

    def serve_forever(self) -> None:
        assert self._sock is not None, "call start() first"
        self._sock.settimeout(1.0)
        while not self._stopping.is_set():
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                with self._lock:
                    idle = not self._clients and self.idle_exit is not None
                    quiet = time.monotonic() - self._last_active
                if idle and self.idle_exit is not None and quiet > self.idle_exit:
                    log.info("no reader for %.0f s: exiting", quiet)
                    break
                continue
            except OSError:
                break
            with self._lock:
                full = len(self._clients) >= self.max_connections
            if full:
                self._refuse(conn)
                continue
            with self._lock:
                client = self._next_client
                self._next_client += 1
                self._clients.add(client)
                self._last_active = time.monotonic()
            self.counters.add("connections")
            threading.Thread(
                target=self._serve, args=(conn, client), daemon=True, name=f"stoker-client-{client}"
            ).start()

    def stop(self) -> None:
        """Stop serving and remove the memory tier (decoded blocks die with their agent;
        readers keep what they have mapped). The disk tier stays for the next agent."""
        self._stopping.set()
        if self._sock is not None:
            with contextlib.suppress(OSError):
                self._sock.shutdown(socket.SHUT_RDWR)
            self._sock.close()
            self._sock = None
            self.paths.socket.unlink(missing_ok=True)
        self._pool.shutdown(wait=True, cancel_futures=True)
        if self._shm_ok and self._lock_fd is not None:
            remove_tree(self.paths.shm)
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    # -- connections -----------------------------------------------------------------
    def _refuse(self, conn: socket.socket) -> None:
        """Hand a connection past :attr:`max_connections` to the refusing thread (it reads
        the hello, answers with an error and closes); closed at once when that is busy."""
        self.counters.add("connections_refused")
        if self._refuser is None:
            self._refuser = threading.Thread(
                target=self._refuse_loop, daemon=True, name="stoker-refuse"
            )
            self._refuser.start()
        try:
            self._refusals.put_nowait(conn)
        except queue.Full:
            conn.close()

    def _refuse_loop(self) -> None:
        error = pb.Response(
            id=0,
            error=f"the agent serves {self.max_connections} connections already "
            "(--max-connections)",
            error_kind="AgentError",
        )
        while True:
            conn = self._refusals.get()
            with conn, contextlib.suppress(OSError):
                conn.settimeout(1.0)
                with contextlib.suppress(wire.ProtocolError):
                    wire.recv(conn, pb.Request, wire.MAX_REQUEST, 1.0)
                wire.send(conn, error)

    def _recv(self, conn: socket.socket) -> pb.Request:
        return wire.recv(conn, pb.Request, wire.MAX_REQUEST, self.frame_timeout)

    def _serve(self, conn: socket.socket, client: int) -> None:
        try:
            with conn:
                # the hello must come within the frame deadline of connecting; later frames
                # may be far apart (a reader between epochs), each must be quick once begun
                conn.settimeout(self.frame_timeout)
                hello = self._recv(conn)
                conn.settimeout(None)
                # a reader that does not take its answers must not hold this thread either
                secs = int(self.frame_timeout)
                usecs = int((self.frame_timeout - secs) * 1e6)
                conn.setsockopt(
                    socket.SOL_SOCKET, socket.SO_SNDTIMEO, struct.pack("ll", secs, usecs)
                )
                if (
                    hello.WhichOneof("kind") != "hello"
                    or hello.hello.protocol != wire.PROTOCOL_VERSION
                ):
                    wire.send(
                        conn,
                        pb.Response(
                            id=hello.id,
                            error=f"protocol mismatch: agent speaks version {wire.PROTOCOL_VERSION}",
                            error_kind="AgentError",
                        ),
                    )
                    return
                wire.send(conn, pb.Response(id=hello.id, ack=pb.Ack()))
                while True:
                    req = self._recv(conn)
                    wire.send(conn, self._handle(req, client))
        except wire.ProtocolError as exc:
            self.counters.add("bad_frames")
            n = self.counters.values["bad_frames"]
            if n == 1 or n % 1000 == 0:  # a flood of garbage must not flood the log
                log.warning("dropped reader connection %d: %s (%d so far)", client, exc, n)
        except (ConnectionError, OSError):
            pass  # the reader went away (or was killed): its pins go below
        finally:
            with self._lock:
                released = self.memory.drop_client(client)
                self._clients.discard(client)
                self._last_active = time.monotonic()
            if released:
                self.counters.add("pins_released_on_disconnect", released)

    def _handle(self, req: pb.Request, client: int) -> pb.Response:
        kind = req.WhichOneof("kind")
        try:
            if kind == "open":
                return pb.Response(id=req.id, opened=pb.Opened(dataset_id=self._open(req.open)))
            if kind == "get":
                return pb.Response(
                    id=req.id, block=self._get(req.get.dataset_id, req.get.block, client)
                )
            if kind == "release":
                ds = req.release.dataset_id
                with self._lock:
                    for b in req.release.blocks:
                        self.memory.unpin((ds, int(b)), client)
                return pb.Response(id=req.id, ack=pb.Ack())
            if kind == "plan":
                self._plan(req.plan.dataset_id, [int(b) for b in req.plan.blocks], client)
                return pb.Response(id=req.id, ack=pb.Ack())
            if kind == "stats":
                return pb.Response(id=req.id, stats=pb.Stats(json=json.dumps(self.stats())))
            if kind == "holdings":
                return pb.Response(
                    id=req.id, held=pb.Held(blocks=self.holdings(req.holdings.dataset_id))
                )
            raise AgentError(f"unknown request {kind!r}")
        except Exception as exc:
            if not isinstance(exc, StokerError):
                log.exception("request %s failed", kind)
            error_kind, text, _ = errors.encode(exc)  # "" for an error that is not stoker's
            return pb.Response(id=req.id, error=text, error_kind=error_kind)

    # -- datasets ----------------------------------------------------------------------
    def _open(self, req: pb.Open) -> str:
        with self._lock:
            ds = self._datasets.get(req.dataset_id) if req.dataset_id else None
        if ds is not None:
            return ds.id
        options = json.loads(req.storage_options_json) if req.storage_options_json else None
        storage = RemoteStorage(req.url, options, self._remote_slots, self._limiter, self.counters)
        source = TokenSource(req.url, options, cache=self.disk, storage=storage)
        got = source.manifest.dataset_id
        if req.dataset_id and got != req.dataset_id:
            raise errors.DatasetError(
                f"{req.url}: the agent read dataset {got}, the reader expected {req.dataset_id} "
                "(the dataset was rewritten in between); reopen it"
            )
        with self._lock:
            self._datasets.setdefault(got, _Dataset(source))
        return got

    def _dataset(self, dataset_id: str) -> _Dataset:
        with self._lock:
            ds = self._datasets.get(dataset_id)
        if ds is None:
            raise AgentError(f"dataset {dataset_id} is not open on this agent; send Open first")
        return ds

    # -- blocks ------------------------------------------------------------------------
    def _get(self, dataset_id: str, block: int, client: int) -> pb.Block:
        ds = self._dataset(dataset_id)
        if not 0 <= block < ds.source.manifest.num_blocks:
            raise errors.DatasetError(
                f"block {block} is outside dataset {dataset_id} ({ds.source.manifest.num_blocks} blocks)"
            )
        key = (dataset_id, block)
        path = self.paths.decoded(dataset_id, block)
        counted = False
        while True:
            with self._lock:
                if self.memory.holds(key):
                    self.memory.pin(key, client)
                    if not counted:
                        self.counters.add("memory_hits")
                    return pb.Block(
                        path=str(path), tokens=ds.source.manifest.block_len(block), pinned=True
                    )
                load = self._loads.get(key)
                if load is None:
                    load = self._start_load(ds, block, prefetch=False)
                    assert load is not None
            if not counted:
                self.counters.add("memory_misses")
                counted = True
            record = load.future.result()  # raises the load's error (typed, e.g. ChecksumError)
            if record is not None:
                self.counters.add("inline_fallbacks")
                return pb.Block(record=record, tokens=ds.source.manifest.block_len(block))
            # loaded into the memory tier: pin it on the next pass (unless evicted meanwhile)

    def _start_load(self, ds: _Dataset, block: int, prefetch: bool) -> _Load | None:
        """Reserve room and start loading (call with the lock held).

        A prefetch that finds no room (without evicting a block needed sooner)
        starts nothing and returns None; a demand load without room is served
        inline (the reader decodes it).
        """
        key = (ds.id, block)
        evicted = (
            self.memory.admit(key, ds.size(block), prefetch=prefetch) if self._shm_ok else None
        )
        if evicted is None and prefetch:
            return None
        for k in evicted or []:
            self.paths.decoded(*k).unlink(missing_ok=True)
            self.counters.add("memory_evictions")
        load = _Load()
        self._loads[key] = load
        self._pool.submit(self._load, ds, block, evicted is not None, load)
        return load

    def _load(self, ds: _Dataset, block: int, reserved: bool, load: _Load) -> None:
        key = (ds.id, block)
        try:
            record = ds.source.record(block)
            if not reserved:
                load.future.set_result(record)  # no room in shared memory: serve it inline
                return
            toks, starts = ds.source.decode(block, record)
            self.counters.add("decodes")
            try:
                write_decoded(self.paths.decoded(ds.id, block), toks, starts)
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
                self.memory.ready(key)
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
        """Blocks of ``dataset_id`` held in either tier, ascending."""
        with self._lock:
            mem = {b for (d, b), e in self.memory.entries.items() if d == dataset_id and e.ready}
        with self.disk._lock:
            disk = {
                b for (d, b), e in self.disk.table.entries.items() if d == dataset_id and e.ready
            }
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
