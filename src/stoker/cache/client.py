"""A reader's handle on the node agent: connect (starting the agent if none runs), ask, map.

:class:`AgentClient` holds only its settings, so it pickles into DataLoader
workers; every process opens its own connection on first use (pins belong to
a connection, so each process's pins are its own). When the agent dies the
next request reconnects, starting a new agent if needed, reopens the datasets
and repeats the request; blocks already mapped stay readable (a mapping
outlives the file's name), so nothing a reader holds is lost.

Every socket call has a timeout (``connect_timeout`` for the connection and
its Hello, ``request_timeout`` for each send and receive of a request). When
no agent answers (stopped, wedged, gone and none could be started, or it
refuses the connection), the client *falls back*, with one warning per
process: block requests answer "read it yourself" (a ``Block`` neither pinned
nor carrying a record, so the reader fetches and decodes from storage), and
plans and releases are dropped. Meanwhile each request checks, without
waiting, a connection left pending on the agent's socket; once the agent
answers it (it was continued, or a new one started) the datasets are reopened
and requests go to the agent again. :meth:`AgentClient.stats` has nothing to fall back to and raises
:class:`~stoker.errors.AgentError` instead.

Starting an agent (autostart) is off the reader's path: the client spawns it
and, while it starts (a fraction of a second: an interpreter and its imports),
answers block requests with "read it yourself" instead of waiting (for up to
:attr:`AgentClient.early_reads` blocks of a dataset, a first batch's worth;
past those the reader waits for the agent), remembers
the reader's plan, and checks without waiting whether the agent answers yet;
once it does, the datasets are opened there and the plan is sent. The blocks
read meanwhile are handed to the agent (appended to every plan, so it loads
them behind what the reader needs next, and at :meth:`AgentClient.hand_over`,
called when a reader closes, loaded for certain): the node's cache ends up
holding every block its readers read, at the price of reading the first
blocks of a cold start twice. Spawning the agent and the one-per-machine spawn lock
are in :mod:`stoker.cache.starting`; connecting and probing its socket in
:mod:`stoker.cache.connection`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import socket
import subprocess
import threading
import time
import warnings
from collections.abc import Iterator
from typing import Any

from stoker import errors
from stoker._proto import agent_pb2 as pb
from stoker.cache import connection, starting, wire
from stoker.cache.config import AgentConfig
from stoker.cache.connection import Unanswered
from stoker.cache.paths import AgentPaths, default_cache_dir
from stoker.errors import AgentError


class AgentClient:
    """Talks to the agent that owns ``cache_dir`` (by default the user's cache directory).

    ``cache_limit``, ``shm_limit``, ``max_remote``, ``max_rate`` and
    ``idle_exit`` (or all of an agent's settings at once, ``config``, an
    :class:`~stoker.AgentConfig` whose ``cache_dir`` is then the directory) are
    used when this client has to start the agent (which then
    exits after ``idle_exit`` seconds without a reader); an agent already
    running keeps its own settings. ``timeout`` bounds the wait for an agent
    to start (or restart); ``connect_timeout`` the connection and its Hello;
    ``request_timeout`` each send and receive of a request. Without an
    answering agent, requests fall back to storage (see the module's
    docstring) and a pending connection is tried again at most every
    ``retry_interval`` seconds after it failed.
    """

    def __init__(
        self,
        cache_dir: str | os.PathLike[str] | None = None,
        cache_limit: int = AgentConfig.cache_limit,
        shm_limit: int = AgentConfig.shm_limit,
        *,
        autostart: bool = True,
        timeout: float = 60.0,
        connect_timeout: float = 5.0,
        request_timeout: float = 30.0,
        retry_interval: float = 5.0,
        max_remote: int = AgentConfig.max_remote,
        max_rate: float = AgentConfig.max_rate,
        idle_exit: float | None = 300.0,
        config: AgentConfig | None = None,
    ) -> None:
        if config is not None:  # the settings of an agent this client starts, all at once
            cache_dir, cache_limit, shm_limit = (
                config.cache_dir,
                config.cache_limit,
                config.shm_limit,
            )
            max_remote, max_rate, idle_exit = config.max_remote, config.max_rate, config.idle_exit
        self.config = config
        for name, value in (
            ("timeout", timeout),
            ("connect_timeout", connect_timeout),
            ("request_timeout", request_timeout),
        ):
            if not value > 0:
                raise errors.ConfigError(f"AgentClient {name} must be > 0 seconds, got {value}")
        if retry_interval < 0:
            raise errors.ConfigError(
                f"AgentClient retry_interval must be >= 0 seconds, got {retry_interval}"
            )
        self.paths = AgentPaths(cache_dir if cache_dir is not None else default_cache_dir())
        self.cache_limit = cache_limit
        self.shm_limit = shm_limit
        self.autostart = autostart
        self.timeout = timeout
        self.connect_timeout = connect_timeout
        self.request_timeout = request_timeout
        self.retry_interval = retry_interval
        self.max_remote = max_remote
        self.max_rate = max_rate
        self.idle_exit = idle_exit
        self._opened: dict[str, pb.Open] = {}
        self._reset()

    def _reset(self) -> None:
        inherited = getattr(self, "_starting", None)
        if inherited is not None:  # forked while starting: the parent's lock is its own
            inherited.close()
        for conn in (getattr(self, "_sock", None), getattr(self, "_probe", None)):
            if conn is not None:  # forked: this process's copy of the parent's connection
                conn.close()  # (closing a copy leaves the parent's connection open)
        self._pid = os.getpid()
        self._sock: socket.socket | None = None
        self._lock = threading.Lock()
        self._next_id = 0
        self._warned_inline = False
        self._warned_fallback = False
        self._fallback = False  # no agent answers: requests fall back to storage
        self._why = ""  # how the agent failed to answer, last time
        self._probe: socket.socket | None = None  # a connection waiting for the agent's Ack
        self._next_probe = 0.0
        self._starting: starting.Start | None = None  # an agent being started, not answering yet
        self._start_deadline = 0.0
        self._skipped: dict[str, set[int]] = {}  # blocks read from storage while it started
        self._plans: dict[str, list[int]] = {}  # the latest plan per dataset
        # released blocks waiting to go with the next get, per dataset (this connection's)
        self._unpin: dict[str, list[int]] = {}
        self._unpin_lock = threading.Lock()
        self.reconnects = 0
        self.fallbacks = 0  # times this process stopped using the agent
        # a closing reader's requests (on its thread): no agent is started for them, and
        # whether one of them found none
        self._closing_on = threading.local()

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        for k in ("_sock", "_lock", "_pid", "_warned_inline", "_warned_fallback", "_probe",
                  "_starting", "_skipped", "_plans", "_unpin", "_unpin_lock",
                  "_closing_on"):  # fmt: skip
            state.pop(k, None)
        state["_opened"] = {k: v.SerializeToString() for k, v in self._opened.items()}
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        opened = state.pop("_opened")
        self.__dict__.update(state)
        self._opened = {k: pb.Open.FromString(v) for k, v in opened.items()}
        self._reset()

    @property
    def falling_back(self) -> bool:
        """True while this process reads storage itself because no agent answers."""
        return self._pid == os.getpid() and self._fallback

    # -- connection -----------------------------------------------------------------
    def _connect_once(self) -> socket.socket:
        return connection.connect(self.paths, self.connect_timeout, self.request_timeout)

    def _agent_config(self) -> AgentConfig:
        """The settings of an agent this client starts."""
        return dataclasses.replace(
            self.config or AgentConfig(str(self.paths.cache_dir)),
            cache_dir=str(self.paths.cache_dir),
            cache_limit=self.cache_limit,
            shm_limit=self.shm_limit,
            max_remote=self.max_remote,
            max_rate=self.max_rate,
            idle_exit=self.idle_exit,
        )

    def _connect(self, spawned: subprocess.Popen[bytes] | None = None) -> socket.socket:
        """Connect, starting an agent when none answers (unless ``spawned``, the agent this
        client started already, is still starting: then wait for that one); give up after
        ``timeout``."""
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                return self._connect_once()
            except (
                FileNotFoundError,
                ConnectionRefusedError,
                ConnectionResetError,
                BrokenPipeError,
            ):
                pass
            if not self.autostart:
                raise Unanswered(
                    "is not running (start one with "
                    f"`stoker agent --cache-dir {self.paths.cache_dir} --cache-limit ...`)"
                )
            if spawned is None and self._no_spawn:
                raise Unanswered("is not running (a closing reader does not start one)")
            if spawned is None:
                spawned = starting.spawn(self.paths, self._agent_config())
            elif spawned.poll() not in (None, 3):  # 3: another agent won the race; fine
                raise starting.exited(self.paths, spawned)
            if time.monotonic() > deadline:
                raise Unanswered(f"did not start within {self.timeout:g} s (see {self.paths.log})")
            time.sleep(0.005)  # the agent is starting: poll its socket (a cheap connect)

    def _call(self, req: pb.Request, fallback: pb.Response | None = None) -> pb.Response:
        """Send ``req`` and wait for its answer; ``fallback`` is the answer when no agent
        answers (None: raise :class:`AgentError`)."""
        if self._pid != os.getpid():  # forked: never share the parent's connection
            self._reset()
        with self._lock:
            try:
                if self._starting is not None or (
                    self._sock is None and not self._fallback and self._may_start(req)
                ):
                    early = self._while_starting(req, fallback)
                    if early is not None:
                        return early
                if self._fallback and not self._revive():
                    raise Unanswered(self._why)
                resp = self._exchange(req)
            except Unanswered as exc:
                if self._no_spawn and fallback is not None:  # (a closing reader's)
                    self._drop()
                    self._closing_on.lost = True
                    return fallback
                self._fall_back(str(exc))
                if fallback is not None:
                    return fallback
                raise AgentError(f"the stoker agent at {self.paths.socket} {exc}") from None
        if resp.error:
            typed = errors.decode(resp.error_kind, resp.error, "from the stoker agent")
            if typed is not None:
                raise typed
            raise AgentError(f"stoker agent: {resp.error}")
        return resp

    #: Requests answered without waiting while an agent this client spawned is starting:
    #: blocks are read from storage meanwhile, plans and opens remembered, pins dropped.
    _EARLY = frozenset(("open", "get", "plan", "release"))
    #: Blocks of a dataset read from storage while the agent starts, at most (a first
    #: batch's worth); the agent reads them again, so past these the reader waits for it.
    early_reads = 32

    def _may_start(self, req: pb.Request) -> bool:
        """Whether ``req`` may find no agent and start one without waiting for it."""
        return self.autostart and req.WhichOneof("kind") in self._EARLY

    def _while_starting(self, req: pb.Request, fallback: pb.Response | None) -> pb.Response | None:
        """The answer to ``req`` while the agent this client started is not up yet (None:
        it answers now, or ``req`` must wait for it: send it there).

        Spawns the agent when none listens. Raises :class:`AgentError` when the spawned
        agent failed, :class:`Unanswered` when it did not answer within ``timeout``.
        """
        if self._starting is None:
            try:
                sock = self._connect_once()  # an agent runs: no need to start one
            except (FileNotFoundError, ConnectionRefusedError, ConnectionResetError,
                    BrokenPipeError):  # fmt: skip
                if self._no_spawn:
                    raise Unanswered(
                        "is not running (a closing reader does not start one)"
                    ) from None
                self._starting = starting.claim_start(self.paths, self._agent_config())
                self._start_deadline = time.monotonic() + self.timeout
            except OSError:
                return None  # _exchange deals with it, as it always has
            else:
                self._sock = sock
                try:  # a new connection: reopen the datasets, as _exchange does
                    if req.WhichOneof("kind") != "open":
                        self._reopen()
                except (ConnectionError, OSError):
                    self._drop()  # _exchange reconnects
                return None
        if self._agent_answers():
            return None
        if fallback is None or req.WhichOneof("kind") not in self._EARLY:
            if self._probe is not None:  # stats, holdings: wait for it, as always
                self._probe.close()
                self._probe = None
            # the agent this client started, not a second one beside it
            self._sock = self._connect(self._starting.proc if self._starting else None)
            self._begin()
            return None
        kind = req.WhichOneof("kind")
        if kind == "get":
            skipped = self._skipped.setdefault(req.get.dataset_id, set())
            if len(skipped) >= self.early_reads:  # enough read twice: wait for the agent
                while not self._agent_answers():
                    time.sleep(0.005)
                return None
            skipped.add(int(req.get.block))
        return fallback

    def _end_start(self) -> None:
        if self._starting is not None:
            self._starting.close()
            self._starting = None

    def _agent_answers(self) -> bool:
        """Without waiting: does the agent being started answer yet? Then use it."""
        start = self._starting
        assert start is not None
        spawned = start.proc
        code = spawned.poll() if spawned is not None else None
        if code not in (None, 3):  # 3: another agent won the race; it serves the socket
            assert spawned is not None
            self._end_start()
            if self._probe is not None:
                self._probe.close()
                self._probe = None
            raise starting.exited(self.paths, spawned)
        if self._probe is None:
            self._probe = connection.probe(self.paths)
        if self._probe is not None and connection.answered(self._probe):
            probe, self._probe = self._probe, None
            resp = connection.ack(probe, self.connect_timeout)  # None: gone, try again later
            if resp is not None:
                if resp.error:
                    probe.close()
                    raise Unanswered(f"refused the connection ({resp.error})")
                probe.settimeout(self.request_timeout)
                self._sock = probe
                return self._begin()
        if spawned is None and self._probe is None and not self._no_spawn:
            # another reader was starting it and none listens: take over if it gave up
            taken = starting.claim_start(self.paths, self._agent_config())
            if taken.proc is not None:
                self._starting = taken
        if time.monotonic() > self._start_deadline:
            self._end_start()
            raise Unanswered(f"did not start within {self.timeout:g} s (see {self.paths.log})")
        return False

    def _reopen(self, check: bool = False) -> None:
        """Open this client's datasets on a new connection (``check``: a refusal is a
        :class:`ConnectionError`, as a broken connection is)."""
        for op in self._opened.values():
            if self._request(pb.Request(open=op)).error and check:
                raise ConnectionError("the agent could not reopen a dataset")

    def _begin(self) -> bool:
        """The agent answers on ``_sock``: open the datasets there and send the plans.
        False (and still starting) when the connection broke meanwhile."""
        try:
            self._reopen()
            for ds, blocks in self._plans.items():
                plan = pb.Plan(dataset_id=ds, blocks=self._with_skipped(ds, blocks))
                self._request(pb.Request(plan=plan))
        except (ConnectionError, OSError):
            self._drop()
            return False
        self._end_start()
        return True

    def _with_skipped(self, dataset_id: str, blocks: list[int]) -> list[int]:
        """``blocks`` with the blocks of ``dataset_id`` read while the agent started moved
        to the end (the reader holds those already: the agent loads them last)."""
        skipped = self._skipped.get(dataset_id)
        if not skipped:
            return blocks
        return [b for b in blocks if b not in skipped] + sorted(skipped)

    def _exchange(self, req: pb.Request) -> pb.Response:
        """One request and its answer, reconnecting (and restarting the agent) when the
        connection breaks; :class:`Unanswered` when the agent does not answer in time."""
        deadline = time.monotonic() + self.timeout
        while True:
            fresh = self._sock is None
            try:
                if self._sock is None:
                    self._sock = self._connect()
                    if req.WhichOneof("kind") != "open":
                        self._reopen()
                return self._request(req)
            except (ConnectionError, OSError) as exc:
                if isinstance(exc, wire.ProtocolError):
                    raise
                self._drop()
                if isinstance(exc, TimeoutError):
                    raise Unanswered(
                        f"did not answer a {req.WhichOneof('kind')} request within "
                        f"{self.request_timeout:g} s"
                    ) from exc
                self.reconnects += 1
                if time.monotonic() > deadline:
                    raise Unanswered(
                        f"was lost and no agent answered again within {self.timeout:g} s ({exc})"
                    ) from exc
                if fresh:
                    time.sleep(0.05)  # back off between failed connections

    def _drop(self) -> None:
        if self._sock is not None:
            self._sock.close()
        self._sock = None
        with self._unpin_lock:  # the connection's pins went with it
            self._unpin.clear()

    def _fall_back(self, why: str) -> None:
        """Stop using the agent (the agent drops this connection's pins when it notices)."""
        self._drop()
        self._end_start()
        self._why = why
        if not self._fallback:
            self._fallback = True
            self.fallbacks += 1
        if not self._warned_fallback:
            self._warned_fallback = True
            warnings.warn(
                f"the stoker agent at {self.paths.socket} {why}; this process reads blocks "
                "from storage itself until the agent answers again",
                RuntimeWarning,
                stacklevel=4,
            )

    def _revive(self) -> bool:
        """Without waiting: has the agent answered the pending connection? Then use it."""
        if self._probe is None:
            now = time.monotonic()
            if now < self._next_probe:
                return False
            self._next_probe = now + self.retry_interval
            self._probe = connection.probe(self.paths)
            if self._probe is None:
                return False
        probe = self._probe
        if not connection.answered(probe):
            return False
        self._probe = None
        resp = connection.ack(probe, self.connect_timeout)
        if resp is None:
            return False
        if resp.error:
            probe.close()
            return False
        probe.settimeout(self.request_timeout)
        self._sock = probe
        try:
            self._reopen(check=True)
        except (ConnectionError, OSError):
            self._drop()
            return False
        self._fallback = False
        return True

    def _request(self, req: pb.Request) -> pb.Response:
        assert self._sock is not None
        self._next_id += 1
        req.id = self._next_id
        wire.send(self._sock, req)
        resp = wire.recv(self._sock, pb.Response)
        if resp.id != req.id:
            raise wire.ProtocolError(f"agent answered request {resp.id}, expected {req.id}")
        return resp

    def close(self) -> None:
        """Close this process's connection (the agent releases its pins)."""
        if self._pid != os.getpid():
            self._reset()  # (a forked child's copy of its parent's connection)
        else:
            self._drop()
            if self._probe is not None:
                self._probe.close()
                self._probe = None
        starting.reap()

    # -- requests -------------------------------------------------------------------
    def open(
        self,
        url: str,
        storage_options: dict[str, Any] | None,
        dataset_id: str,
        view: Any = None,
    ) -> str:
        """Make the dataset known to the agent; the key later requests name it by (a token
        dataset's id; for a records dataset, its ``view``'s key:
        :class:`stoker.records.held.View`, how the agent holds it)."""
        op = pb.Open(
            url=url,
            storage_options_json=json.dumps(storage_options) if storage_options else "",
            dataset_id=dataset_id,
            view_json=view.to_json() if view is not None else "",
        )
        key = view.key(dataset_id) if view is not None else dataset_id
        self._call(pb.Request(open=op), pb.Response())
        self._opened[key] = op  # reopened on every new connection
        return key

    def get(self, dataset_id: str, block: int) -> pb.Block:
        """Pin ``block`` and say where it is (or carry its record inline). Without an
        answering agent: neither pinned nor a record, the reader reads storage itself.
        The blocks of the dataset released since the last get go with it."""
        if self._pid != os.getpid():
            self._reset()
        fallback = pb.Response(block=pb.Block())
        with self._unpin_lock:
            release = self._unpin.pop(dataset_id, [])
        req = pb.Request(get=pb.Get(dataset_id=dataset_id, block=block, release=release))
        resp = self._call(req, fallback)
        got = resp.block
        if resp is not fallback and not got.pinned and not self._warned_inline:
            self._warned_inline = True
            warnings.warn(
                f"the stoker agent at {self.paths.socket} has no room in shared memory; this "
                "process decodes blocks itself until there is (raise the agent's --shm-limit "
                "or free /dev/shm)",
                stacklevel=2,
            )
        return got

    def release(self, dataset_id: str, blocks: list[int]) -> None:
        """Let go of pinned ``blocks``: they go with this process's next get of the dataset
        (a reader asks for its next block as it lets one go), or on their own once
        :data:`UNPIN_BATCH` wait, or at :meth:`flush_releases` (a reader's close)."""
        if not blocks:
            return
        if self._pid != os.getpid():
            self._reset()
        with self._unpin_lock:
            waiting = self._unpin.setdefault(dataset_id, [])
            waiting.extend(int(b) for b in blocks)
            if len(waiting) < self.UNPIN_BATCH:
                return
            del self._unpin[dataset_id]
        self._send_release(dataset_id, waiting)

    #: Released blocks of a dataset that wait for the next get, at most.
    UNPIN_BATCH = 64

    def flush_releases(self) -> None:
        """Send the releases still waiting for a get."""
        if self._pid != os.getpid():
            self._reset()
            return
        with self._unpin_lock:
            waiting, self._unpin = self._unpin, {}
        with self._closing():
            for dataset_id, blocks in waiting.items():
                self._send_release(dataset_id, blocks)

    @contextlib.contextmanager
    def _closing(self) -> Iterator[None]:
        """What a closing reader sends: to the agent that answers, or to none. It never
        starts (or takes over the start of) an agent, and finding none neither warns nor
        sends the process to storage: a reader's close, racing an agent that died, had
        started a new one, which loaded the plan the reopen sent it for no one."""
        local = self._closing_on
        outer = getattr(local, "depth", 0)
        local.depth = outer + 1
        if not outer:
            local.lost = False
        try:
            yield
        finally:
            local.depth = outer

    @property
    def _no_spawn(self) -> bool:
        """This thread is closing a reader (see :meth:`_closing`)."""
        return bool(getattr(self._closing_on, "depth", 0))

    @property
    def _lost(self) -> bool:
        return bool(getattr(self._closing_on, "lost", False))

    def _send_release(self, dataset_id: str, blocks: list[int]) -> None:
        if self._sock is None:  # no connection: its pins went with the one that took them
            return
        req = pb.Request(release=pb.Release(dataset_id=dataset_id, blocks=blocks))
        with self._closing():  # a release never starts an agent (a new one holds no pins)
            self._call(req, pb.Response())

    def plan(self, dataset_id: str, blocks: list[int]) -> None:
        """The blocks this process reads next, in order (the agent prefetches them)."""
        if self._pid != os.getpid():
            self._reset()
        self._plans[dataset_id] = list(blocks)
        blocks = self._with_skipped(dataset_id, self._plans[dataset_id])
        self._call(pb.Request(plan=pb.Plan(dataset_id=dataset_id, blocks=blocks)), pb.Response())

    def hand_over(self, dataset_id: str) -> None:
        """Make sure the agent holds the blocks of ``dataset_id`` that this process read
        from storage itself while the agent was starting (waiting for it if it still
        starts): a reader calls this when it closes. Nothing without an answering agent."""
        if self._pid != os.getpid() or not self._skipped.get(dataset_id):
            return
        skipped = self._skipped[dataset_id]
        with self._closing():
            held = set(self.holdings(dataset_id))  # waits for a starting agent
            if self.falling_back or self._lost:
                return
            for b in sorted(skipped - held):
                got = self.get(dataset_id, b)  # loads it there (one download, one decode)
                if got.pinned:
                    self.release(dataset_id, [b])
        skipped.clear()
        self.flush_releases()  # the last one's pin

    def holdings(self, dataset_id: str) -> list[int]:
        """Blocks of the dataset this node's agent holds (memory or disk); none without
        an answering agent."""
        r = self._call(pb.Request(holdings=pb.Holdings(dataset_id=dataset_id)), pb.Response())
        return [int(b) for b in r.held.blocks]

    @property
    def node(self) -> str:
        """This node's cache, named for locality: the host and the agent's directory."""
        return f"{socket.gethostname()}:{self.paths.cache_dir}"

    def stats(self) -> dict[str, Any]:
        """The agent's counters and gauges."""
        return dict(json.loads(self._call(pb.Request(stats=pb.StatsRequest())).stats.json))
