"""Frames of the node agent's local protocol: a 4-byte length, then a protobuf message."""

from __future__ import annotations

import socket
import struct
from typing import TypeVar

from google.protobuf.message import Message

from stoker.errors import StokerError

#: Bumped when a message changes meaning; the agent refuses other versions.
PROTOCOL_VERSION = 1
#: No frame is larger (an inline block record is at most a few MiB).
MAX_FRAME = 256 << 20

_LEN = struct.Struct("<I")
M = TypeVar("M", bound=Message)


class ProtocolError(StokerError, ConnectionError):
    """The peer sent something that is not a valid frame."""


def send(sock: socket.socket, msg: Message) -> None:
    body = msg.SerializeToString()
    sock.sendall(_LEN.pack(len(body)) + body)


def _exactly(sock: socket.socket, n: int) -> bytes:
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        k = sock.recv_into(view[got:])
        if k == 0:
            raise ConnectionResetError("the peer closed the connection")
        got += k
    return bytes(buf)


def recv(sock: socket.socket, kind: type[M]) -> M:
    (n,) = _LEN.unpack(_exactly(sock, _LEN.size))
    if n > MAX_FRAME:
        raise ProtocolError(f"frame of {n} bytes exceeds the {MAX_FRAME}-byte limit")
    msg = kind()
    try:
        msg.ParseFromString(_exactly(sock, n))
    except Exception as exc:  # protobuf's DecodeError
        raise ProtocolError(f"malformed {kind.__name__} frame: {exc}") from exc
    return msg
