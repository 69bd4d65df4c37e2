"""The node agent against hostile or broken peers on its Unix socket: garbage, lengths that
claim a GiB, frames sent in part and then silence, more connections than it serves. The
agent is the real process; it must stay up, keep serving a well-behaved reader, and not
grow its memory with the attack (its RSS, read from /proc)."""

from __future__ import annotations

import json
import os
import signal
import socket
import struct
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from stoker._proto import agent_pb2 as pb
from stoker.cache import wire

from .helpers import closed_by_peer

MiB = 1 << 20


class RunningAgent:
    def __init__(self, proc: subprocess.Popen[str], sock: Path) -> None:
        self.proc, self.sock = proc, sock
        self.sockets: list[socket.socket] = []  # every connection made, closed at the end

    def connect(self, timeout: float = 30.0) -> socket.socket:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sockets.append(s)
        s.settimeout(timeout)
        s.connect(str(self.sock))
        return s

    def close(self) -> None:
        for s in self.sockets:
            s.close()

    def hello(self, s: socket.socket) -> pb.Response:
        wire.send(s, pb.Request(id=0, hello=pb.Hello(protocol=wire.PROTOCOL_VERSION, pid=1)))
        return wire.recv(s, pb.Response)

    def stats(self) -> dict:
        """What a well-behaved reader gets: a hello, then Stats."""
        with self.connect() as s:
            assert not self.hello(s).error
            wire.send(s, pb.Request(id=1, stats=pb.StatsRequest()))
            return dict(json.loads(wire.recv(s, pb.Response).stats.json))

    def rss(self) -> int:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        raise AssertionError("no VmRSS")


@pytest.fixture
def start_agent(tmp_path: Path) -> Iterator[Callable[..., RunningAgent]]:
    procs: list[subprocess.Popen[str]] = []
    agents: list[RunningAgent] = []

    def start(*flags: str) -> RunningAgent:
        n = len(procs)
        (tmp_path / f"shm{n}").mkdir()
        proc = subprocess.Popen(
            [sys.executable, "-m", "stoker.cli", "agent", "--cache-dir", str(tmp_path / f"c{n}"),
             "--cache-limit", "1G", "--shm-limit", "64M", "--shm-root", str(tmp_path / f"shm{n}"),
             "--metrics-port", "-1", *flags],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
        procs.append(proc)
        assert proc.stdout is not None
        seen = []
        for line in proc.stdout:
            seen.append(line)
            if "stoker agent: serving" in line:
                agents.append(RunningAgent(proc, Path(line.split("serving ")[1].strip())))
                return agents[-1]
        raise AssertionError("".join(seen))

    yield start
    for agent in agents:
        agent.close()
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
        p.communicate(timeout=60)


def test_garbage_and_huge_lengths_neither_crash_nor_allocate(
    start_agent: Callable[..., RunningAgent],
) -> None:
    agent = start_agent("--frame-timeout", "120")  # silence is not what ends these
    assert agent.stats()["clients"] == 1  # the asker itself
    base = agent.rss()
    garbage = [agent.connect() for _ in range(20)]
    for s in garbage:
        s.sendall(b"\xff\xff\xff\x7f" + os.urandom(256))  # a 2 GiB length, then noise
    claims = [agent.connect() for _ in range(4)]
    for s in claims:
        s.sendall(struct.pack("<I", 200 * MiB) + b"x" * 100)  # 200 MiB claimed, 100 B sent
    held = [agent.connect() for _ in range(12)]
    for s in held:
        s.sendall(struct.pack("<I", 15 * MiB) + b"x" * 100)  # under the limit: kept open
    st = agent.stats()  # a well-behaved reader is served meanwhile
    assert st["clients"] >= len(held)  # the partial frames are still open...
    assert agent.rss() - base < 64 * MiB  # ...and hold no memory for what they claim
    for s in garbage + claims:
        assert closed_by_peer(s)  # refused at once
    assert agent.stats()["bad_frames"] >= len(garbage) + len(claims)
    for s in held:
        s.close()
    assert agent.proc.poll() is None


def test_a_half_sent_frame_then_silence_is_dropped(
    start_agent: Callable[..., RunningAgent],
) -> None:
    agent = start_agent("--frame-timeout", "1")
    silent = agent.connect()  # never says hello
    partial = agent.connect()
    assert not agent.hello(partial).error
    partial.sendall(struct.pack("<I", 100) + b"y" * 10)  # 10 of 100 bytes, then nothing
    idle = agent.connect()
    assert not agent.hello(idle).error  # a reader between requests is left alone
    assert closed_by_peer(partial)
    assert closed_by_peer(silent)
    wire.send(idle, pb.Request(id=5, stats=pb.StatsRequest()))
    assert wire.recv(idle, pb.Response).id == 5
    assert agent.stats()["bad_frames"] >= 1
    idle.close()


def test_connections_past_the_limit_are_refused_and_the_rest_served(
    start_agent: Callable[..., RunningAgent],
) -> None:
    agent = start_agent("--max-connections", "8")
    held = [agent.connect() for _ in range(7)]
    for s in held:
        assert not agent.hello(s).error
    extra = [agent.connect() for _ in range(50)]  # many at once, past the limit
    answers = [agent.hello(s) for s in extra[1:]]
    refused = [a for a in answers if a.error]
    assert len(refused) >= len(extra) - 2
    assert all("--max-connections" in a.error for a in refused)
    assert agent.proc.poll() is None
    for s in extra:
        s.close()
    held.pop().close()
    # room again: a well-behaved reader is served (the agent notices the closes)
    for _ in range(600):
        with agent.connect() as s:
            r = agent.hello(s)
            if not r.error:
                wire.send(s, pb.Request(id=1, stats=pb.StatsRequest()))
                assert json.loads(wire.recv(s, pb.Response).stats.json)["connections_refused"]
                break
    else:
        raise AssertionError("the agent never had room again")
    for s in held:
        s.close()


@pytest.mark.parametrize(
    ("command", "flag", "value"),
    [("agent", "--frame-timeout", "0"), ("agent", "--max-connections", "0"),
     ("coordinator", "--handshake-timeout", "-1"), ("coordinator", "--max-connections", "0")],
)  # fmt: skip
def test_a_bad_limit_is_named(tmp_path: Path, command: str, flag: str, value: str) -> None:
    if command == "agent":
        args = ["--cache-dir", str(tmp_path / "c"), "--cache-limit", "1G", "--metrics-port", "-1"]
    else:
        args = ["--state", str(tmp_path / "s"), "--world", "1", "--num-samples", "10",
                "--metrics-port", "-1"]  # fmt: skip
    proc = subprocess.run(
        [sys.executable, "-m", "stoker.cli", command, *args, flag, value],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert flag in proc.stderr and "Traceback" not in proc.stderr
