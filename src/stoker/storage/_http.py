"""Range reads over HTTP(S) with the standard library.

Plain ``http(s)://`` datasets skip fsspec and aiohttp (their imports alone cost
about 0.3 s, which a cold start pays before its first batch). One keep-alive
connection per thread and host. Read-only, like fsspec's HTTP filesystem.

Time limits: connect and every socket read have timeouts, and a request given a
``deadline`` (a ``time.monotonic()`` instant) is cut off then, however the
origin trickles its bytes: a per-process watchdog thread shuts the socket down,
and the call raises :class:`DeadlineExceeded` naming the URL.

An origin that ignores ``Range`` (answers ``200`` with the whole file, as
Python's ``http.server`` does) is noticed on the first range read: one warning
per process and origin, and from then on each file of that origin is downloaded
once, whole, into an anonymous temporary file (``tempfile.TemporaryFile``, in
``TMPDIR``) that serves every later range of it. The copies live as long as the
filesystem object (one per process and dataset), so the disk they take is the
size of the files read. :meth:`HTTPFS.take_wire_bytes` says how many body bytes
really came over the network, which a whole-file answer makes larger than the
range returned.
"""

from __future__ import annotations

import heapq
import http.client
import itertools
import os
import socket
import tempfile
import threading
import time
import warnings
from typing import IO, Any
from urllib.parse import urlsplit

_CHUNK = 1 << 20


class HTTPStatusError(OSError):
    """The server answered with an error status."""

    def __init__(self, url: str, status: int, reason: str) -> None:
        super().__init__(f"HTTP {status} {reason} for {url}")
        self.status = status


class DeadlineExceeded(TimeoutError):
    """A request did not complete by its deadline (it was cut off)."""


# -- the watchdog --------------------------------------------------------------------


class _Alarm:
    __slots__ = ("fired", "sock", "when")

    def __init__(self, when: float, sock: socket.socket) -> None:
        self.when = when
        self.sock: socket.socket | None = sock
        self.fired = False


class _Watchdog:
    """One thread per process that shuts down sockets whose deadline has passed."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._heap: list[tuple[float, int, _Alarm]] = []
        self._live = 0
        self._seq = itertools.count()
        self._thread: threading.Thread | None = None

    def arm(self, when: float, sock: socket.socket) -> _Alarm:
        alarm = _Alarm(when, sock)
        with self._cond:
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="stoker-deadline", daemon=True
                )
                self._thread.start()
            heapq.heappush(self._heap, (when, next(self._seq), alarm))
            self._live += 1
            if len(self._heap) > 4096 and len(self._heap) > 2 * self._live:
                self._heap = [e for e in self._heap if e[2].sock is not None]
                heapq.heapify(self._heap)
            if self._heap[0][2] is alarm:
                self._cond.notify()
        return alarm

    def disarm(self, alarm: _Alarm) -> None:
        with self._cond:
            if alarm.sock is not None:
                alarm.sock = None
                self._live -= 1

    def _run(self) -> None:
        with self._cond:
            while True:
                while self._heap and self._heap[0][2].sock is None:
                    heapq.heappop(self._heap)
                if not self._heap:
                    self._cond.wait()
                    continue
                delay = self._heap[0][0] - time.monotonic()
                if delay > 0:
                    self._cond.wait(delay)
                    continue
                alarm = heapq.heappop(self._heap)[2]
                sock, alarm.sock = alarm.sock, None
                self._live -= 1
                alarm.fired = True
                try:
                    assert sock is not None
                    sock.shutdown(socket.SHUT_RDWR)  # wakes the reader blocked on it
                except OSError:
                    pass  # already closed


_IGNORING: set[str] = set()  # scheme://netloc of origins that answered a range with 200
_per_process: tuple[int, _Watchdog, threading.Lock] | None = None


def _process_state() -> tuple[_Watchdog, threading.Lock]:
    """This process's watchdog and the lock of :data:`_IGNORING`, made on first use and
    anew in a forked child (the parent's thread does not exist there, and another of
    its threads may have held the lock)."""
    global _per_process
    pid = os.getpid()
    state = _per_process
    if state is None or state[0] != pid:
        state = _per_process = (pid, _Watchdog(), threading.Lock())
    return state[1], state[2]


def _note_ignored_range(origin: str, url: str) -> None:
    with _process_state()[1]:
        if origin in _IGNORING:
            return
        _IGNORING.add(origin)
    warnings.warn(
        f"{url}: the HTTP origin {origin} ignores Range requests (it answered 200 with the "
        "whole file); stoker now downloads each of its files once into a temporary file "
        "and reads blocks from that copy. Serve the dataset with a server that supports "
        "byte ranges (nginx, any object store) to read only the blocks needed.",
        RuntimeWarning,
        stacklevel=4,
    )


class _Copy:
    """A whole file of a range-ignoring origin, in an anonymous temporary file."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.file: IO[bytes] | None = None
        self.size = 0

    def pread(self, start: int | None, end: int | None) -> bytes:
        assert self.file is not None
        lo = min(start or 0, self.size)
        hi = self.size if end is None else min(end, self.size)
        return os.pread(self.file.fileno(), max(hi - lo, 0), lo)


class _Connections:
    """One thread's keep-alive connections, by (scheme, netloc), closed when they are
    dropped: when their thread ends (its ``threading.local`` goes) or the filesystem
    goes. (Left to the collector, each socket would be closed without being told.)"""

    def __init__(self) -> None:
        self.by_origin: dict[tuple[str, str], http.client.HTTPConnection] = {}

    def close(self) -> None:
        while self.by_origin:
            _, conn = self.by_origin.popitem()
            conn.close()

    def __del__(self) -> None:
        self.close()


class HTTPFS:
    def __init__(self, connect_timeout: float, read_timeout: float) -> None:
        self.connect_timeout = connect_timeout
        self.read_timeout = read_timeout
        self._local = threading.local()
        self._copies: dict[str, _Copy] = {}
        self._copies_lock = threading.Lock()

    # -- connections ---------------------------------------------------------------
    def _connection(
        self, scheme: str, netloc: str, deadline: float | None
    ) -> http.client.HTTPConnection:
        conns: _Connections | None = self._local.__dict__.get("conns")
        if conns is None:
            conns = self._local.conns = _Connections()
        conn = conns.by_origin.get((scheme, netloc))
        if conn is None:
            cls = http.client.HTTPSConnection if scheme == "https" else http.client.HTTPConnection
            conn = cls(netloc, timeout=self._timeout(self.connect_timeout, deadline))
            conn.connect()
            conns.by_origin[(scheme, netloc)] = conn
        if conn.sock is not None:
            conn.sock.settimeout(self._timeout(self.read_timeout, deadline))
        return conn

    @staticmethod
    def _timeout(limit: float, deadline: float | None) -> float:
        if deadline is None:
            return limit
        return max(min(limit, deadline - time.monotonic()), 0.001)

    def _drop(self, scheme: str, netloc: str) -> None:
        conns: _Connections | None = self._local.__dict__.get("conns")
        conn = conns.by_origin.pop((scheme, netloc), None) if conns is not None else None
        if conn is not None:
            conn.close()

    def _count(self, nbytes: int) -> None:
        self._local.wire = self._local.__dict__.get("wire", 0) + nbytes

    def take_wire_bytes(self) -> int:
        """Body bytes this thread received since the last call (failed attempts included)."""
        n: int = self._local.__dict__.get("wire", 0)
        self._local.wire = 0
        return n

    def _request(
        self,
        method: str,
        url: str,
        headers: dict[str, str],
        deadline: float | None,
        sink: Any = None,
    ) -> tuple[int, Any, bytes]:
        """Send a request; read the body (into ``sink(status)``'s file when it gives one)."""
        if deadline is not None and deadline <= time.monotonic():
            raise DeadlineExceeded(f"{url}: the deadline passed before the request was sent")
        parts = urlsplit(url)
        target = parts.path + (f"?{parts.query}" if parts.query else "")
        alarm: _Alarm | None = None
        try:
            conn = self._connection(parts.scheme, parts.netloc, deadline)
            if deadline is not None and conn.sock is not None:
                alarm = _process_state()[0].arm(deadline, conn.sock)
            conn.request(method, target, headers=headers)
            resp = conn.getresponse()
            out = sink(resp.status) if sink is not None else None
            body = self._read_body(resp, out)
        except BaseException as exc:
            self._drop(parts.scheme, parts.netloc)  # never reuse a connection in an unknown state
            if alarm is not None and alarm.fired:
                raise DeadlineExceeded(
                    f"{url}: no complete answer by the deadline (cut off; "
                    f"{type(exc).__name__}: {exc})"
                ) from exc
            raise
        finally:
            if alarm is not None:
                _process_state()[0].disarm(alarm)
        if resp.will_close or (alarm is not None and alarm.fired):
            self._drop(parts.scheme, parts.netloc)  # (the watchdog shut it down just now)
        return resp.status, resp, body

    def _read_body(self, resp: http.client.HTTPResponse, out: IO[bytes] | None) -> bytes:
        if out is None:
            chunks = []
            while chunk := resp.read(_CHUNK):
                self._count(len(chunk))
                chunks.append(chunk)
            body = b"".join(chunks)
            self._complete(resp, body)
            return body
        while chunk := resp.read(_CHUNK):
            self._count(len(chunk))
            out.write(chunk)
        self._complete(resp, b"")
        return b""

    @staticmethod
    def _complete(resp: http.client.HTTPResponse, partial: bytes) -> None:
        # read(amt) returns short data when the connection closes early; read() would raise
        if resp.length and getattr(resp, "_method", "GET") != "HEAD":
            raise http.client.IncompleteRead(partial, resp.length)

    # -- reads ---------------------------------------------------------------------
    def cat_file(
        self,
        path: str,
        start: int | None = None,
        end: int | None = None,
        deadline: float | None = None,
    ) -> bytes:
        ranged = start is not None or end is not None
        if ranged:
            copy = self._copies.get(path)
            if copy is not None and copy.file is not None:
                return copy.pread(start, end)
            origin = self._origin(path)
            if origin in _IGNORING:
                return self._copy(path, deadline).pread(start, end)
        headers: dict[str, str] = {}
        spool: list[IO[bytes]] = []

        def sink(status: int) -> IO[bytes] | None:
            if status != 200 or not ranged:
                return None
            spool.append(tempfile.TemporaryFile(prefix="stoker-http-"))  # noqa: SIM115
            return spool[0]

        if ranged:
            headers["Range"] = f"bytes={start or 0}-{'' if end is None else end - 1}"
        try:
            status, resp, body = self._request("GET", path, headers, deadline, sink)
            self._check(path, status, resp)
        except BaseException:
            for fh in spool:
                fh.close()
            raise
        if spool:  # the origin ignored the range and sent the whole file: keep it
            _note_ignored_range(self._origin(path), path)
            return self._install(path, spool[0]).pread(start, end)
        return body

    @staticmethod
    def _origin(url: str) -> str:
        parts = urlsplit(url)
        return f"{parts.scheme}://{parts.netloc}"

    @staticmethod
    def _check(path: str, status: int, resp: Any) -> None:
        if status == 404:
            raise FileNotFoundError(path)
        if status >= 400:
            raise HTTPStatusError(path, status, resp.reason)

    def _install(self, path: str, fh: IO[bytes]) -> _Copy:
        """Make ``fh`` (the whole file, just downloaded) the copy of ``path``."""
        fh.flush()
        with self._copies_lock:
            copy = self._copies.setdefault(path, _Copy())
        with copy.lock:
            if copy.file is None:
                copy.file, copy.size = fh, fh.tell()
                return copy
        fh.close()  # another thread's download got there first
        return copy

    def _copy(self, path: str, deadline: float | None) -> _Copy:
        """The local copy of ``path``, downloading it whole (once per process)."""
        with self._copies_lock:
            copy = self._copies.setdefault(path, _Copy())
        with copy.lock:  # one download per file; other readers of it wait for that one
            if copy.file is not None:
                return copy
            fh = tempfile.TemporaryFile(prefix="stoker-http-")  # noqa: SIM115 (kept open)
            try:

                def sink(status: int) -> IO[bytes] | None:
                    return fh if status == 200 else None

                status, resp, _ = self._request("GET", path, {}, deadline, sink)
                self._check(path, status, resp)
                if status != 200:
                    raise HTTPStatusError(path, status, resp.reason)
                fh.flush()
            except BaseException:
                fh.close()
                raise
            copy.file, copy.size = fh, fh.tell()
        return copy

    def exists(self, path: str, deadline: float | None = None) -> bool:
        status, resp, _ = self._request("HEAD", path, {}, deadline)
        if status == 404:
            return False
        if status >= 400:
            raise HTTPStatusError(path, status, resp.reason)
        return True

    def size(self, path: str, deadline: float | None = None) -> int:
        status, resp, _ = self._request("HEAD", path, {}, deadline)
        self._check(path, status, resp)
        return int(resp.headers["Content-Length"])

    def open(self, path: str, mode: str = "rb") -> Any:
        raise NotImplementedError(f"{path}: HTTP datasets are read-only; write to a path or s3://")

    def pipe_file(self, path: str, data: bytes, deadline: float | None = None) -> None:
        self.open(path, "wb")

    def rm_file(self, path: str, deadline: float | None = None) -> None:
        self.open(path, "wb")

    def __del__(self) -> None:
        for copy in self._copies.values():
            if copy.file is not None:
                copy.file.close()
