"""Frames of the node agent's local protocol: a 4-byte length, then a protobuf message.

A frame's memory follows the bytes that arrived (never the length its prefix claims),
a length over the receiver's limit is refused before anything is read, and a receiver
may give a frame a deadline once it has begun, so a peer that sends a prefix and then
trickles or stops holds neither memory nor a thread for long."""

from __future__ import annotations

import socket
import struct
import time
from typing import TypeVar

from google.protobuf.message import Message

from stoker.errors import ProtocolError as ProtocolError  # re-exported: imported from here too

#: Bumped when a message changes meaning; the agent refuses other versions. 2: the
#: decoded-block file holds document starts as offsets (:mod:`stoker.cache.layout`); 3:
#: records datasets, held as a view (``Open.view_json``).
PROTOCOL_VERSION = 3
#: No frame is larger (an inline block record is at most a few MiB).
MAX_FRAME = 256 << 20

_LEN = struct.Struct("<I")
M = TypeVar("M", bound=Message)


def send(sock: socket.socket, msg: Message) -> None:
    body = msg.SerializeToString()
    sock.sendall(_LEN.pack(len(body)) + body)


#: No request to the agent is larger (a Plan of a whole window's blocks is a few hundred KiB).
MAX_REQUEST = 16 << 20
#: Bytes read into a frame at a time: memory follows the bytes that arrived, not the
#: length the prefix claims.
_CHUNK = 1 << 20


def _read(sock: socket.socket, n: int, deadline: float | None, what: str) -> bytes:
    """``n`` bytes (grown as they arrive); past ``deadline`` (monotonic) a ProtocolError."""
    buf = bytearray()
    while len(buf) < n:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise ProtocolError(f"{what} not finished in time ({len(buf)} of {n} bytes)")
            sock.settimeout(left)
        try:
            chunk = sock.recv(min(n - len(buf), _CHUNK))
        except TimeoutError:
            if deadline is None:
                raise
            raise ProtocolError(f"{what} not finished in time ({len(buf)} of {n} bytes)") from None
        if not chunk:
            raise ConnectionResetError("the peer closed the connection")
        buf += chunk
    return bytes(buf)


def _exactly(sock: socket.socket, n: int) -> bytes:
    return _read(sock, n, None, "frame")


def recv(
    sock: socket.socket,
    kind: type[M],
    limit: int = MAX_FRAME,
    frame_timeout: float | None = None,
) -> M:
    """The next frame's message. A frame longer than ``limit`` is a ProtocolError before
    any of it is read. With ``frame_timeout`` a frame, once its first byte arrived, must
    be complete within that many seconds (else ProtocolError); the wait for that first
    byte follows the socket's own timeout."""
    head = sock.recv(_LEN.size)
    if not head:
        raise ConnectionResetError("the peer closed the connection")
    before = sock.gettimeout()
    deadline = None if frame_timeout is None else time.monotonic() + frame_timeout
    try:
        if len(head) < _LEN.size:
            head += _read(sock, _LEN.size - len(head), deadline, "frame length")
        (n,) = _LEN.unpack(head)
        if n > limit:
            raise ProtocolError(f"frame of {n} bytes exceeds the {limit}-byte limit")
        body = _read(sock, n, deadline, f"{kind.__name__} frame")
    finally:
        if deadline is not None:
            sock.settimeout(before)
    msg = kind()
    try:
        msg.ParseFromString(body)
    except Exception as exc:  # protobuf's DecodeError
        raise ProtocolError(f"malformed {kind.__name__} frame: {exc}") from exc
    return msg
