"""A fault-injecting HTTP proxy on 127.0.0.1, in front of a real origin.

``FaultProxy(origin_url)`` forwards every request to the origin (nginx from
``tests/servers.py``, say) over keep-alive connections, and injects a fault into
some of them, chosen per request:

=================  ============================================================
``ok``             forwarded as it is
``500``            ``500 Internal Server Error`` (the origin is not asked)
``reset``          the connection is reset (RST) once the request is read
``truncate``       the origin's headers, half of its body, then the connection
                   is closed
``trickle``        the origin's headers, then its body one byte every
                   ``trickle_interval`` seconds
``flip``           the origin's answer with one body byte inverted
``ignore_range``   the request goes to the origin without its ``Range`` header,
                   so the answer is ``200`` with the whole file (what Python's
                   ``http.server`` does)
=================  ============================================================

Which fault: ``schedule`` (a list: the k-th request gets ``schedule[k]``, then
``ok``; ``repeat=True`` cycles it), else ``rates`` (``{"500": 0.3}``: each
request independently, from a ``random.Random(seed)``), else ``ok``. Only the
requests ``applies(method, path)`` accepts count and get faults (all by
default); the others are forwarded. ``configure()`` changes all of that while
the proxy runs.

The proxy counts what it served (:attr:`requests`, :attr:`bytes_sent` — body
bytes written to clients — and one :class:`Served` record per request), so tests
can assert traffic. Only loopback: it listens on 127.0.0.1 and refuses an origin
elsewhere.
"""

from __future__ import annotations

import contextlib
import http.client
import random
import socket
import socketserver
import struct
import threading
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import pytest

FAULTS = ("ok", "500", "reset", "truncate", "trickle", "flip", "ignore_range")
_HOP = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade", "host"}


@dataclass
class Served:
    """One request the proxy answered (or cut off); counted from its arrival, bytes as sent."""

    method: str
    path: str
    range: str | None
    fault: str
    status: int  # status sent to the client; 0 when none was (reset)
    body_bytes: int  # body bytes written to the client


class FaultProxy:
    def __init__(
        self,
        upstream: str,
        *,
        schedule: Sequence[str] | None = None,
        repeat: bool = False,
        rates: dict[str, float] | None = None,
        seed: int = 0,
        applies: Callable[[str, str], bool] | None = None,
        trickle_interval: float = 2.0,
    ) -> None:
        parts = urlsplit(upstream)
        if parts.scheme != "http" or not (parts.hostname or "").startswith("127."):
            raise ValueError(f"FaultProxy only forwards to http://127.x.x.x, not {upstream}")
        self.upstream = (parts.hostname or "127.0.0.1", parts.port or 80)
        self.trickle_interval = trickle_interval
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._clients: set[socket.socket] = set()
        self.records: list[Served] = []
        self.requests = 0
        self.bytes_sent = 0
        self._server: socketserver.ThreadingTCPServer | None = None
        self._thread: threading.Thread | None = None
        self.configure(schedule=schedule, repeat=repeat, rates=rates, seed=seed, applies=applies)

    # -- configuration ------------------------------------------------------------
    def configure(
        self,
        *,
        schedule: Sequence[str] | None = None,
        repeat: bool = False,
        rates: dict[str, float] | None = None,
        seed: int = 0,
        applies: Callable[[str, str], bool] | None = None,
    ) -> None:
        """Set the faults to inject from now on (the count of applicable requests restarts)."""
        for name in [*(schedule or ()), *(rates or {})]:
            if name not in FAULTS:
                raise ValueError(f"unknown fault {name!r}; one of {FAULTS}")
        if rates and sum(rates.values()) > 1:
            raise ValueError(f"fault rates add up to more than 1: {rates}")
        if repeat and not schedule:
            raise ValueError("repeat=True needs a schedule")
        with self._lock:
            self._schedule = list(schedule or ())
            self._repeat = repeat
            self._rates = dict(rates or {})
            self._rng = random.Random(seed)
            self._applies = applies
            self._k = 0

    def _choose(self, method: str, path: str) -> str:
        with self._lock:
            if self._applies is not None and not self._applies(method, path):
                return "ok"
            k, self._k = self._k, self._k + 1
            if self._schedule:
                if self._repeat:
                    return self._schedule[k % len(self._schedule)]
                return self._schedule[k] if k < len(self._schedule) else "ok"
            u = self._rng.random()
            for name, p in self._rates.items():
                if u < p:
                    return name
                u -= p
            return "ok"

    def _flip_at(self, n: int) -> int:
        with self._lock:
            return self._rng.randrange(n)

    # -- counts -----------------------------------------------------------------------
    def count(self, fault: str | None = None) -> int:
        """Requests served, or those that got ``fault``."""
        with self._lock:
            if fault is None:
                return self.requests
            return sum(1 for r in self.records if r.fault == fault)

    def faults(self) -> Counter[str]:
        with self._lock:
            return Counter(r.fault for r in self.records)

    def reset_counts(self) -> None:
        with self._lock:
            self.records.clear()
            self.requests = 0
            self.bytes_sent = 0

    def _begin(self, method: str, path: str, rng: str | None, fault: str) -> Served:
        rec = Served(method, path, rng, fault, 0, 0)
        with self._lock:
            self.records.append(rec)
            self.requests += 1
        return rec

    def _send(self, sock: socket.socket, rec: Served, body: bytes) -> None:
        # counted before the write: once the client holds the bytes, the counts do too
        # (counting after sendall raced a test that reads them as soon as its read returns)
        with self._lock:
            rec.body_bytes += len(body)
            self.bytes_sent += len(body)
        try:
            sock.sendall(body)
        except OSError:
            with self._lock:  # the client went away: these did not (all) cross
                rec.body_bytes -= len(body)
                self.bytes_sent -= len(body)
            raise

    # -- lifecycle ----------------------------------------------------------------
    @property
    def url(self) -> str:
        if self._server is None:
            raise RuntimeError("FaultProxy is not started")
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def url_for(self, path: str) -> str:
        return f"{self.url}/{path.lstrip('/')}"

    def start(self) -> FaultProxy:
        proxy = self

        class Handler(socketserver.StreamRequestHandler):
            def handle(self) -> None:
                proxy._serve(self.connection, self.rfile)

        class Server(socketserver.ThreadingTCPServer):
            daemon_threads = True
            allow_reuse_address = True

        self._server = Server(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="fault-proxy", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        with self._lock:
            clients = list(self._clients)
        for sock in clients:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        if self._thread is not None:
            self._thread.join(10)

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- serving --------------------------------------------------------------------
    def _serve(self, sock: socket.socket, rfile: Any) -> None:
        with self._lock:
            self._clients.add(sock)
        # headers and body go out in separate writes: without this, Nagle's algorithm and
        # the client's delayed ACK hold each body back for tens of milliseconds
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        origin: http.client.HTTPConnection | None = None
        try:
            while not self._stop.is_set():
                line = rfile.readline(65537)
                if not line or not line.strip():
                    return
                method, target, _version = line.decode("latin-1").split()
                headers = http.client.parse_headers(rfile)
                path = target.split("?", 1)[0]
                fault = self._choose(method, path)
                rec = self._begin(method, path, headers.get("Range"), fault)
                if fault == "500":
                    body = b"injected fault\n"
                    head = f"HTTP/1.1 500 Internal Server Error\r\nContent-Length: {len(body)}\r\n"
                    rec.status = 500
                    sock.sendall(head.encode() + b"\r\n")
                    self._send(sock, rec, b"" if method == "HEAD" else body)
                    continue
                if fault == "reset":
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    return
                forward = {k: v for k, v in headers.items() if k.lower() not in _HOP}
                if fault == "ignore_range":
                    forward.pop("Range", None)
                if origin is None:
                    origin = http.client.HTTPConnection(*self.upstream, timeout=30)
                origin.request(method, target, headers=forward)
                resp = origin.getresponse()
                body = resp.read()
                if resp.will_close:
                    origin.close()
                    origin = None
                if not self._answer(sock, method, rec, resp, body):
                    return
        except OSError:
            return  # the client went away (or the proxy stopped)
        finally:
            if origin is not None:
                origin.close()
            with self._lock:
                self._clients.discard(sock)

    def _answer(
        self,
        sock: socket.socket,
        method: str,
        rec: Served,
        resp: http.client.HTTPResponse,
        body: bytes,
    ) -> bool:
        """Send the origin's answer with the fault applied; False when the connection ends."""
        head = [f"HTTP/1.1 {resp.status} {resp.reason}"]
        for k, v in resp.getheaders():
            if k.lower() not in _HOP and k.lower() != "content-length":
                head.append(f"{k}: {v}")
        length = int(resp.headers.get("Content-Length", len(body)))
        head.append(f"Content-Length: {length}")
        rec.status = resp.status
        sock.sendall(("\r\n".join(head) + "\r\n\r\n").encode("latin-1"))
        if method == "HEAD":
            return True
        if rec.fault == "flip" and body:
            i = self._flip_at(len(body))
            body = body[:i] + bytes([body[i] ^ 0xFF]) + body[i + 1 :]
        if rec.fault == "truncate":
            self._send(sock, rec, body[: len(body) // 2])
            return False
        if rec.fault == "trickle":
            for i in range(len(body)):
                self._send(sock, rec, body[i : i + 1])
                if self._stop.wait(self.trickle_interval):
                    break
            return False
        self._send(sock, rec, body)
        return True


@pytest.fixture
def fault_proxy() -> Iterator[Callable[..., FaultProxy]]:
    """Factory: ``fault_proxy(origin_url, **kwargs)`` -> a started FaultProxy, stopped at teardown."""
    started: list[FaultProxy] = []

    def make(upstream: str, **kwargs: Any) -> FaultProxy:
        proxy = FaultProxy(upstream, **kwargs).start()
        started.append(proxy)
        return proxy

    yield make
    for proxy in reversed(started):
        proxy.stop()
