"""The coordinator's gRPC server against hostile or broken peers: garbage, a silent
connection, an HTTP/2 request whose message claims a GiB and never comes, more
connections than it serves. The coordinator is the real process; it must stay up,
keep answering a well-behaved client, and not grow its memory (its RSS, from /proc)."""

from __future__ import annotations

import os
import select
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from stoker.coordinator.client import CoordinatorClient

from .helpers import closed_by_peer, reap

MiB = 1 << 20
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"


def frame(kind: int, flags: int, stream: int, payload: bytes) -> bytes:
    return (
        struct.pack(">I", len(payload))[1:]
        + bytes([kind, flags])
        + struct.pack(">I", stream)
        + payload
    )


def literal(name: str, value: str) -> bytes:
    """An HPACK literal header field, not indexed, new name (short strings only)."""
    n, v = name.encode(), value.encode()
    return b"\x00" + bytes([len(n)]) + n + bytes([len(v)]) + v


def claims_a_gib(token: str) -> bytes:
    """A Register call whose message says it is 1 GiB long; 100 bytes of it follow."""
    headers = b"".join(
        literal(k, v)
        for k, v in (
            (":method", "POST"),
            (":scheme", "http"),
            (":authority", "x"),
            (":path", "/stoker.coordinator.v1.Coordinator/Register"),
            ("content-type", "application/grpc"),
            ("te", "trailers"),
            ("authorization", f"Bearer {token}"),
        )
    )
    return (
        PREFACE
        + frame(4, 0, 0, b"")  # SETTINGS
        + frame(1, 0x4, 1, headers)  # HEADERS, END_HEADERS
        + frame(0, 0, 1, b"\x00" + struct.pack(">I", 1 << 30) + b"x" * 100)  # DATA
    )


class Running:
    def __init__(self, proc: subprocess.Popen[str], address: str, token: str) -> None:
        self.proc, self.address, self.token = proc, address, token
        host, port = address.rsplit(":", 1)
        self.host, self.port = host, int(port)
        self.sockets: list[socket.socket] = []  # every connection made, closed at the end

    def connect(self) -> socket.socket:
        s = socket.create_connection((self.host, self.port), timeout=60)
        self.sockets.append(s)
        return s

    def close(self) -> None:
        for s in self.sockets:
            s.close()

    def rss(self) -> int:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        raise AssertionError("no VmRSS")

    def serves(self) -> bool:
        client = CoordinatorClient(self.address, retry_for=30)
        try:
            return client.status().world == 1
        finally:
            client.close()


@pytest.fixture
def start(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., Running]]:
    monkeypatch.setenv("STOKER_RUNTIME_DIR", str(tmp_path / "run"))
    monkeypatch.delenv("STOKER_COORDINATOR_TOKEN", raising=False)
    procs: list[subprocess.Popen[str]] = []
    running: list[Running] = []

    def go(*flags: str) -> Running:
        proc = subprocess.Popen(
            [sys.executable, "-m", "stoker.cli", "coordinator", "--state",
             str(tmp_path / f"s{len(procs)}"), "--world", "1", "--num-samples", "100",
             "--metrics-port", "-1", *flags],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=dict(os.environ),
        )  # fmt: skip
        procs.append(proc)
        assert proc.stdout is not None
        seen = []
        for line in proc.stdout:
            seen.append(line)
            if "stoker coordinator: serving" in line:
                token_file = next(x for x in seen if "token in " in x).split("token in ")[1]
                token = Path(token_file.split()[0]).read_text().strip()
                running.append(Running(proc, line.split("serving ")[1].split()[0], token))
                return running[-1]
        raise AssertionError("".join(seen))

    yield go
    for c in running:
        c.close()
    for p in procs:
        reap(p)


def test_garbage_silence_and_a_gib_claimed_leave_it_serving(start: Callable[..., Running]) -> None:
    c = start("--handshake-timeout", "1")
    assert c.serves()
    base = c.rss()
    garbage = [c.connect() for _ in range(20)]
    for s in garbage:
        s.sendall(os.urandom(512))
    claims = [c.connect() for _ in range(30)]
    for s in claims:
        s.sendall(claims_a_gib(c.token))
    silent = c.connect()  # connects and never says anything
    assert c.serves()  # meanwhile a well-behaved client is answered
    assert c.rss() - base < 64 * MiB  # 30 GiB claimed, nothing like it held
    for s in garbage:
        assert closed_by_peer(s)
    assert closed_by_peer(silent, 20)  # the handshake deadline (1 s; gRPC's own: 60 s)
    assert c.serves() and c.proc.poll() is None
    for s in claims:
        s.close()


def test_connections_past_the_limit_are_closed(start: Callable[..., Running]) -> None:
    c = start("--max-connections", "8")
    held = [c.connect() for _ in range(5)]
    for s in held:
        s.sendall(PREFACE + frame(4, 0, 0, b""))  # a real HTTP/2 client, idle
    extra = [c.connect() for _ in range(30)]
    for s in extra:
        s.sendall(PREFACE + frame(4, 0, 0, b""))
    # those past the limit are closed at once; wait 10 s for them (gRPC itself would
    # give up on these idle peers only after a minute)
    closed = 0
    pending = set(extra)
    deadline = time.monotonic() + 10
    while pending and time.monotonic() < deadline:
        ready, _, _ = select.select(list(pending), [], [], max(0.0, deadline - time.monotonic()))
        for s in ready:
            try:
                data = s.recv(65536)
            except ConnectionResetError:
                data = b""
            if not data:
                closed += 1
                pending.discard(s)
    assert closed >= len(extra) - 3
    for s in extra:
        s.close()
    assert c.serves() and c.proc.poll() is None
    for s in held:
        s.close()
