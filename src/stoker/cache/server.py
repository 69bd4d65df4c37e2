"""The node agent's socket: accept readers, serve each connection, dispatch its requests.

One thread accepts on the agent's Unix socket; each reader connection gets a
thread that reads a request frame (:mod:`stoker.cache.wire`, messages in
``proto/agent.proto``), has the :class:`~stoker.cache.agent.Agent` answer it,
and writes the answer. A connection past ``max_connections`` is handed to one
refusing thread, which answers it with an error and closes it. What a request
does to blocks (tiers, single flight, prefetch) is the agent's; this module only
moves frames, bounds their time, and tells the agent when readers come and go.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import queue
import socket
import struct
import threading
from typing import TYPE_CHECKING

from stoker import errors
from stoker._proto import agent_pb2 as pb
from stoker.cache import wire
from stoker.errors import AgentError, ConfigError, StokerError

if TYPE_CHECKING:
    from stoker.cache.agent import Agent

log = logging.getLogger("stoker.agent")


class AgentServer:
    """The socket of ``agent`` (its path is the agent's ``paths.socket``)."""

    def __init__(self, agent: Agent) -> None:
        self.agent = agent
        self._sock: socket.socket | None = None
        self._stopping = threading.Event()
        self._refusals: queue.Queue[socket.socket] = queue.Queue(maxsize=64)
        self._refuser: threading.Thread | None = None

    # -- life cycle --------------------------------------------------------------------
    def listen(self) -> None:
        """Bind the socket (private to this user) and listen. Raises ConfigError."""
        path = self.agent.paths.socket
        if len(str(path)) > 100:
            raise ConfigError(
                f"socket path {path} is too long for AF_UNIX; use a shorter cache_dir"
            )
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old = os.umask(0o177)  # the socket is private to this user
        try:
            sock.bind(str(path))
        finally:
            os.umask(old)
        sock.listen(128)
        self._sock = sock

    def serve_forever(self) -> None:
        assert self._sock is not None, "call start() first"
        agent = self.agent
        self._sock.settimeout(1.0)
        while not self._stopping.is_set():
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                quiet = agent.idle_for()
                if quiet is not None and agent.idle_exit is not None and quiet > agent.idle_exit:
                    log.info("no reader for %.0f s: exiting", quiet)
                    break
                continue
            except OSError:
                break
            client = agent.admit()
            if client is None:
                self._refuse(conn)
                continue
            threading.Thread(
                target=self._serve, args=(conn, client), daemon=True, name=f"stoker-client-{client}"
            ).start()

    def close(self) -> None:
        """Stop accepting; close and remove the socket."""
        self._stopping.set()
        if self._sock is not None:
            with contextlib.suppress(OSError):
                self._sock.shutdown(socket.SHUT_RDWR)
            self._sock.close()
            self._sock = None
            self.agent.paths.socket.unlink(missing_ok=True)

    # -- connections -----------------------------------------------------------------
    def _refuse(self, conn: socket.socket) -> None:
        """Hand a connection past :attr:`Agent.max_connections` to the refusing thread (it
        reads the hello, answers with an error and closes); closed at once when that is busy."""
        self.agent.counters.add("connections_refused")
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
            error=f"the agent serves {self.agent.max_connections} connections already "
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
        return wire.recv(conn, pb.Request, wire.MAX_REQUEST, self.agent.frame_timeout)

    def _serve(self, conn: socket.socket, client: int) -> None:
        agent = self.agent
        try:
            with conn:
                # the hello must come within the frame deadline of connecting; later frames
                # may be far apart (a reader between epochs), each must be quick once begun
                conn.settimeout(agent.frame_timeout)
                hello = self._recv(conn)
                conn.settimeout(None)
                # a reader that does not take its answers must not hold this thread either
                secs = int(agent.frame_timeout)
                usecs = int((agent.frame_timeout - secs) * 1e6)
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
                    wire.send(conn, self._handle(req, client, conn))
        except wire.ProtocolError as exc:
            agent.counters.add("bad_frames")
            n = agent.counters.values["bad_frames"]
            if n == 1 or n % 1000 == 0:  # a flood of garbage must not flood the log
                log.warning("dropped reader connection %d: %s (%d so far)", client, exc, n)
        except (ConnectionError, OSError):
            pass  # the reader went away (or was killed): its pins go below
        finally:
            agent.leave(client)

    def _handle(self, req: pb.Request, client: int, conn: socket.socket) -> pb.Response:
        agent = self.agent
        kind = req.WhichOneof("kind")
        try:
            if kind == "open":
                return pb.Response(id=req.id, opened=pb.Opened(dataset_id=agent._open(req.open)))
            if kind == "get":
                if req.get.release:  # released with the next get: no round trip of their own
                    agent.release(req.get.dataset_id, list(req.get.release), client)
                return pb.Response(
                    id=req.id, block=agent._get(req.get.dataset_id, req.get.block, client)
                )
            if kind == "release":
                agent.release(req.release.dataset_id, list(req.release.blocks), client)
                return pb.Response(id=req.id, ack=pb.Ack())
            if kind == "plan":
                agent._plan(req.plan.dataset_id, [int(b) for b in req.plan.blocks], client)
                return pb.Response(id=req.id, ack=pb.Ack())
            if kind == "stats":
                return pb.Response(id=req.id, stats=pb.Stats(json=json.dumps(agent.stats())))
            if kind == "relay":  # waits for the node's next coordinator message
                relayed = agent.relays.call(req.relay, lambda: _hung_up(conn))
                return pb.Response(id=req.id, relayed=relayed)
            if kind == "holdings":
                return pb.Response(
                    id=req.id, held=pb.Held(blocks=agent.holdings(req.holdings.dataset_id))
                )
            raise AgentError(f"unknown request {kind!r}")
        except Exception as exc:
            if not isinstance(exc, StokerError):
                log.exception("request %s failed", kind)
            error_kind, text, _ = errors.encode(exc)  # "" for an error that is not stoker's
            return pb.Response(id=req.id, error=text, error_kind=error_kind)


def _hung_up(conn: socket.socket) -> bool:
    """Whether the reader closed ``conn`` (it reads nothing while its answer is due)."""
    try:
        return conn.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True
