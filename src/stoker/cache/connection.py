"""A reader's connection to the node agent's socket: connect and greet, or greet without
waiting (a *probe*) and see later whether the agent answered.

Every call has a timeout; a refusal (another protocol version, no room for another
connection) or silence is :class:`Unanswered`, on which the client falls back to
reading storage itself.
"""

from __future__ import annotations

import os
import select
import socket

from stoker._proto import agent_pb2 as pb
from stoker.cache import wire
from stoker.cache.paths import AgentPaths


class Unanswered(Exception):
    """No agent answers (the message says how); the client falls back to storage."""


def hello() -> pb.Request:
    return pb.Request(id=0, hello=pb.Hello(protocol=wire.PROTOCOL_VERSION, pid=os.getpid()))


def connect(paths: AgentPaths, connect_timeout: float, request_timeout: float) -> socket.socket:
    """A connection the agent has acknowledged, its timeout ``request_timeout``.

    Raises what ``connect`` raises when none listens (FileNotFoundError,
    ConnectionRefusedError, ...) and :class:`Unanswered` when the agent is silent for
    ``connect_timeout`` or refuses the connection.
    """
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(connect_timeout)
    try:
        sock.connect(str(paths.socket))
        wire.send(sock, hello())
        resp = wire.recv(sock, pb.Response)
    except TimeoutError as exc:
        sock.close()
        raise Unanswered(f"did not answer a connection within {connect_timeout:g} s") from exc
    except BaseException:
        sock.close()
        raise
    if resp.error:  # another protocol version, or no room for another connection
        sock.close()
        raise Unanswered(f"refused the connection ({resp.error})")
    sock.settimeout(request_timeout)
    return sock


def probe(paths: AgentPaths) -> socket.socket | None:
    """A connection to the agent's socket with its Hello sent, not waiting for the answer;
    None if none listens."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.setblocking(False)
    try:
        sock.connect(str(paths.socket))
        wire.send(sock, hello())  # a few bytes: fits the socket's buffer
    except OSError:
        sock.close()
        return None
    return sock


def answered(sock: socket.socket) -> bool:
    """Without waiting: has the agent answered the probe ``sock`` (or has it broken)?"""
    try:
        return bool(select.select([sock], [], [], 0)[0])
    except (OSError, ValueError):
        return True  # broken: reading the answer says so


def ack(sock: socket.socket, connect_timeout: float) -> pb.Response | None:
    """The agent's answer to an answered probe; None (and ``sock`` closed) when the
    connection went away before it."""
    try:
        sock.settimeout(connect_timeout)
        return wire.recv(sock, pb.Response)
    except (ConnectionError, OSError):
        sock.close()
        return None
