"""Storage: byte-range reads from any fsspec URL, with retries and accounting.

This is the seam between stoker and remote storage: everything above it asks
for ``read_range(path, start, stop)``. The fsspec filesystem behind it is made
lazily in each process and remade after ``fork``, so a DataLoader worker never
shares its parent's connections or event loop.

Time: every read has an overall deadline (:attr:`RetryPolicy.deadline`, 120 s by
default) that covers all its attempts and the waits between them, on top of the
connect and per-socket-read timeouts. stoker's own HTTP client cuts a request off
at the deadline (a watchdog shuts its socket down); fsspec's asynchronous
filesystems (HTTP through aiohttp, S3 through aiobotocore, GCS, ...) run each call
under ``asyncio.wait_for`` with the time left. Local files and fsspec's
synchronous filesystems have no deadline (a hung mount hangs the read).

Errors: a missing file raises ``FileNotFoundError``; a host that cannot be
reached raises :class:`UnreachableError` after a couple of quick tries; missing
S3 credentials and a 4xx answer other than 408 and 429 raise
:class:`StorageError` at once; other failures are retried with capped,
jittered exponential backoff until the attempts or the deadline run out, and
then raise :class:`StorageError` naming the URL.
"""

from __future__ import annotations

import os
import posixpath
import random
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar
from urllib.parse import quote

from stoker.errors import ConfigError, StokerError, StorageError, UnreachableError
from stoker.observe.registry import registry
from stoker.storage._backend import Backend
from stoker.storage._http import HTTPFS, DeadlineExceeded
from stoker.storage._local import LocalFS

T = TypeVar("T")

_UNREACHABLE_HINTS = (
    "connection refused",
    "cannot connect",
    "name or service not known",
    "nodename nor servname",
    "no route to host",
    "temporary failure in name resolution",
    "could not connect",
    "connect timeout",
    "network is unreachable",
)


_CREDENTIAL_ERRORS = ("NoCredentialsError", "PartialCredentialsError")

_CREDENTIAL_HINT = (
    "no AWS credentials were found: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY "
    "(or AWS_PROFILE, with AWS_SHARED_CREDENTIALS_FILE / AWS_CONFIG_FILE), or pass "
    "storage_options={'key': ..., 'secret': ...}; storage_options={'anon': True} reads a "
    "public bucket"
)


@dataclass(frozen=True)
class RetryPolicy:
    """How storage retries, and how long one read may take. Times are seconds.

    ``deadline`` bounds one read as a whole: every attempt, however slowly the
    origin sends, and the waits between them. Transient failures (5xx, 408, 429,
    resets, truncated or trickling bodies cut off) are retried until
    ``attempts`` attempts were made or the deadline would pass; the wait before
    retry ``k`` is ``min(max_backoff, backoff * 2**(k-1))`` times a random factor
    in ``[0.5, 1)``. A host that refuses connections is tried
    ``unreachable_attempts`` times. ``connect_timeout`` and ``read_timeout``
    bound connecting and each socket read. Every value must be positive
    (:class:`~stoker.errors.ConfigError` otherwise).
    """

    attempts: int = 20
    backoff: float = 0.1
    max_backoff: float = 5.0
    unreachable_attempts: int = 2
    connect_timeout: float = 5.0
    read_timeout: float = 60.0
    deadline: float = 120.0

    def __post_init__(self) -> None:
        for name in ("attempts", "unreachable_attempts"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"RetryPolicy.{name} must be an integer >= 1, got {value!r}")
        for name in ("backoff", "max_backoff", "connect_timeout", "read_timeout", "deadline"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise ConfigError(f"RetryPolicy.{name} must be > 0 seconds, got {value!r}")

    def wait(self, attempt: int) -> float:
        """Seconds to wait before retry number ``attempt`` (1 for the first retry)."""
        cap = min(self.max_backoff, self.backoff * 2 ** min(attempt - 1, 60))
        return cap * (0.5 + random.random() / 2)


class _Fatal(StorageError):
    """A failure that retrying cannot fix (the message says why)."""


@dataclass
class StorageStats:
    """Counters of one process's storage traffic."""

    requests: int = 0
    bytes_read: int = 0
    retries: int = 0
    errors: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, nbytes: int) -> None:
        with self._lock:
            self.requests += 1
            self.bytes_read += nbytes


def split_url(url: str) -> tuple[str, str]:
    """``(protocol, root)`` of a URL; a plain path is ``file``."""
    if "://" not in url:
        return "file", os.path.abspath(url)
    protocol, rest = url.split("://", 1)
    if protocol == "file":
        return "file", os.path.abspath(rest) if not rest.startswith("/") else rest
    return protocol, url if protocol in ("http", "https") else rest


def _chain(exc: BaseException) -> list[BaseException]:
    seen: list[BaseException] = []
    cur: BaseException | None = exc
    while cur is not None and cur not in seen and len(seen) < 8:
        seen.append(cur)
        cur = cur.__cause__ or cur.__context__
    return seen


def _classify(exc: BaseException) -> str:
    """'missing', 'unreachable', 'credentials', 'deadline', 'fatal' or 'transient'."""
    if isinstance(exc, FileNotFoundError):
        return "missing"
    if isinstance(exc, _Fatal):
        return "fatal"
    if any(type(e).__name__ in _CREDENTIAL_ERRORS for e in _chain(exc)):
        return "credentials"
    if isinstance(exc, DeadlineExceeded) or type(exc).__name__ == "FSTimeoutError":
        return "deadline"  # cut off at the read's deadline
    if isinstance(
        exc,
        (
            PermissionError,
            IsADirectoryError,
            NotADirectoryError,
            TypeError,
            AttributeError,
            NotImplementedError,
        ),
    ):
        return "fatal"  # retrying cannot help (the last three are programming errors)
    if isinstance(exc, (ConnectionRefusedError, socket.gaierror)):
        return "unreachable"
    text = f"{type(exc).__name__}: {exc}".lower()
    if any(h in text for h in _UNREACHABLE_HINTS) or "clientconnectorerror" in text:
        return "unreachable"
    status = getattr(exc, "status", None)
    if isinstance(status, int) and 400 <= status < 500 and status not in (408, 429):
        return "missing" if status == 404 else "fatal"
    return "transient"


class Observer(Protocol):
    """What :class:`Storage` reports: each read (bytes that crossed the wire, seconds) and
    each failed attempt (``"errors"``) or retry (``"retries"``).
    :class:`~stoker.observe.registry.Metrics` is one."""

    def storage_read(self, nbytes: int, seconds: float) -> None: ...

    def storage_event(self, name: str) -> None: ...

    def threads_opened(self, n: int) -> None: ...

    def threads_closed(self, n: int) -> None: ...

    def thread_busy(self, seconds: float) -> None: ...


class Storage:
    """Reads and writes files under one dataset root URL."""

    def __init__(
        self,
        url: str,
        storage_options: dict[str, Any] | None = None,
        retry: RetryPolicy | None = None,
        max_inflight: int = 8,
        *,
        observer: Observer | None = None,
    ) -> None:
        self.url = url.rstrip("/")
        self._observer = observer
        self.protocol, self.root = split_url(self.url)
        self.storage_options = dict(storage_options or {})
        if retry is not None and not isinstance(retry, RetryPolicy):
            raise ConfigError(
                f"retry must be a stoker.RetryPolicy, got {type(retry).__name__} ({retry!r})"
            )
        self.retry = retry or RetryPolicy()
        self.max_inflight = max_inflight
        self.stats = StorageStats()
        self._pid: int | None = None
        self._fs: Any = None
        self._appending: dict[str, int] = {}  # local files being appended to: descriptors
        self._lock = threading.Lock()

    @property
    def observer(self) -> Observer:
        """What reads are reported to: the one given, else this process's registry (also
        in a process this storage was pickled into: an observer is not carried along)."""
        return self._observer if self._observer is not None else registry()

    # -- per-process clients --------------------------------------------
    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state.update(_pid=None, _fs=None, _appending={}, _lock=None, stats=None, _observer=None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()
        self.stats = StorageStats()

    def _check_pid(self) -> None:
        if self._pid != os.getpid():
            self._pid = os.getpid()
            self._fs = None
            self._appending = {}  # the parent's descriptors are not this process's to use
            self._lock = threading.Lock()
            self.stats = StorageStats()

    @property
    def fs(self) -> Backend:
        """The filesystem (an fsspec one, or stoker's LocalFS for local paths)."""
        self._check_pid()
        if self._fs is None:
            with self._lock:
                if self._fs is None and not self.storage_options:
                    if self.protocol == "file":
                        self._fs = LocalFS()
                    elif self.protocol in ("http", "https"):
                        self._fs = HTTPFS(self.retry.connect_timeout, self.retry.read_timeout)
                if self._fs is None:
                    import fsspec

                    try:
                        fs = fsspec.filesystem(
                            self.protocol, skip_instance_cache=True, **self._options()
                        )
                    except ImportError as exc:  # an optional backend (stoker[s3], ...)
                        from stoker.extras import backend_error

                        raise backend_error(self.protocol, self.url, exc) from exc
                    if self.protocol in ("s3", "s3a"):
                        fs.retries = 1  # stoker retries (with backoff) itself
                    self._fs = fs
        return self._fs

    def _options(self) -> dict[str, Any]:
        opts = dict(self.storage_options)
        r = self.retry
        if self.protocol in ("http", "https") and "client_kwargs" not in opts:
            import aiohttp

            opts["client_kwargs"] = {
                "timeout": aiohttp.ClientTimeout(
                    total=r.deadline, connect=r.connect_timeout, sock_read=r.read_timeout
                )
            }
        if self.protocol in ("s3", "s3a"):
            config = dict(opts.get("config_kwargs") or {})
            config.setdefault("connect_timeout", r.connect_timeout)
            config.setdefault("read_timeout", r.read_timeout)
            config.setdefault("retries", {"max_attempts": 1})
            opts["config_kwargs"] = config
        return opts

    # -- paths ---------------------------------------------------------------
    def full(self, path: str) -> str:
        if self.protocol in ("http", "https"):
            # Quoted, so that the origin's %-decoding gives back this very path: a
            # "%2e%2e" in a manifest path names a file called that, never "..".
            return f"{self.root}/{quote(path, safe='/')}"
        return posixpath.join(self.root, path)

    def url_of(self, path: str) -> str:
        return f"{self.url}/{path}"

    # -- calls ---------------------------------------------------------------
    def _call(self, name: str, deadline: float, *args: Any, **kwargs: Any) -> Any:
        """``fs.<name>(*args, **kwargs)``, cut off at ``deadline`` where the filesystem allows."""
        fs: Any = self.fs  # fsspec's async filesystems have more than the Backend protocol
        if isinstance(fs, HTTPFS):
            return getattr(fs, name)(*args, deadline=deadline, **kwargs)
        if getattr(fs, "async_impl", False) and hasattr(fs, f"_{name}"):
            from fsspec.asyn import sync

            left = deadline - time.monotonic()
            if left <= 0:
                raise DeadlineExceeded(f"{args[0]}: the deadline passed before the request")
            return sync(fs.loop, getattr(fs, f"_{name}"), *args, timeout=left, **kwargs)
        return getattr(fs, name)(*args, **kwargs)

    def _with_retries(
        self,
        path: str,
        fn: Callable[[float], T],
        start: int | None = None,
        stop: int | None = None,
    ) -> T:
        """``fn(deadline)`` until it succeeds, retrying as the policy says; a
        :class:`StorageError` names ``path`` (and the range ``[start, stop)`` when given)
        in its message and its attributes."""
        what = self.url_of(path)
        if start is not None:
            what = f"{what} bytes [{start}, {stop})"
        where: dict[str, Any] = {"url": self.url_of(path), "path": path}
        where.update(start=start, stop=stop)
        r = self.retry
        begin = time.monotonic()
        deadline = begin + r.deadline
        attempt = 0
        unreachable = 0
        while True:
            try:
                return fn(deadline)
            except Exception as exc:
                if isinstance(exc, StokerError) and not isinstance(exc, StorageError):
                    raise  # a configuration error (a missing backend, ...): retrying cannot help
                kind = _classify(exc)
                self.stats.errors += 1
                self.observer.storage_event("errors")
                cause = f"{type(exc).__name__}: {exc}"
                if kind == "missing":
                    raise FileNotFoundError(f"{what}: not found") from exc
                if kind == "credentials":
                    raise StorageError(f"{what}: {_CREDENTIAL_HINT} ({cause})", **where) from exc
                if isinstance(exc, _Fatal):
                    raise StorageError(str(exc), **where) from exc
                if kind == "fatal":
                    raise StorageError(f"{what}: {cause}", **where) from exc
                attempt += 1
                now = time.monotonic()
                if kind == "deadline" or now >= deadline:
                    raise StorageError(
                        f"{what}: no complete answer within the {r.deadline:g} s deadline "
                        f"(RetryPolicy.deadline; {attempt} attempt(s), the last: {cause})",
                        **where,
                    ) from exc
                if kind == "unreachable":
                    unreachable += 1
                    if unreachable >= r.unreachable_attempts:
                        raise UnreachableError(
                            f"{what}: cannot reach the storage at {self.url} ({cause})", **where
                        ) from exc
                if attempt >= r.attempts:
                    raise StorageError(
                        f"{what}: failed after {attempt} attempts ({cause})", **where
                    ) from exc
                wait = r.wait(attempt)
                if now + wait >= deadline:
                    raise StorageError(
                        f"{what}: failed after {attempt} attempts in {now - begin:.1f} s, and "
                        f"the {r.deadline:g} s deadline (RetryPolicy.deadline) leaves no time "
                        f"for another ({cause})",
                        **where,
                    ) from exc
                self.stats.retries += 1
                self.observer.storage_event("retries")
                time.sleep(wait)

    def _wire_start(self) -> None:
        fs = self.fs
        if isinstance(fs, HTTPFS):
            fs.take_wire_bytes()

    def _wire_bytes(self, returned: int) -> int:
        """Bytes that crossed the network for the read just done (``returned`` if unknown)."""
        fs = self.fs
        return fs.take_wire_bytes() if isinstance(fs, HTTPFS) else returned

    # -- reads ---------------------------------------------------------------
    def read(self, path: str) -> bytes:
        """A whole file."""
        full = self.full(path)
        t = time.perf_counter()
        self._wire_start()
        data = self._with_retries(path, lambda d: self._call("cat_file", d, full))
        wire = self._wire_bytes(len(data))
        self.stats.add(wire)
        self.observer.storage_read(wire, time.perf_counter() - t)
        return bytes(data)

    def read_range(self, path: str, start: int, stop: int) -> bytes:
        """Bytes ``[start, stop)`` of a file: one range request."""
        full = self.full(path)
        where = f"{self.url_of(path)} bytes [{start}, {stop})"
        ctx: dict[str, Any] = {"url": self.url_of(path), "path": path, "start": start, "stop": stop}

        def get(deadline: float) -> bytes:
            data = self._call("cat_file", deadline, full, start=start, end=stop)
            if len(data) > stop - start:
                raise _Fatal(
                    f"{where}: the origin ignored the Range header and sent {len(data)} bytes "
                    "(the whole file); serve the dataset with a server that supports byte "
                    "ranges, or read it without storage_options (stoker's own HTTP client "
                    "downloads each such file once and reads blocks from that copy)",
                    **ctx,
                )
            if len(data) != stop - start:
                if self.protocol == "file":  # a local file that ends early will not grow
                    raise _Fatal(f"{where}: the file ends after {len(data)} of these bytes", **ctx)
                raise StorageError(f"{where}: short read of {len(data)} bytes", **ctx)
            return bytes(data)

        t = time.perf_counter()
        self._wire_start()
        data = self._with_retries(path, get, start, stop)
        wire = self._wire_bytes(len(data))
        self.stats.add(wire)
        self.observer.storage_read(wire, time.perf_counter() - t)
        return data

    def exists(self, path: str) -> bool:
        full = self.full(path)
        return bool(self._with_retries(path, lambda d: self._call("exists", d, full)))

    def size(self, path: str) -> int:
        full = self.full(path)
        return int(self._with_retries(path, lambda d: self._call("size", d, full)))

    # -- writes --------------------------------------------------------------
    def open_write(self, path: str) -> Any:
        full = self.full(path)
        if self.protocol == "file":
            self.fs.makedirs(posixpath.dirname(full), exist_ok=True)
        return self.fs.open(full, "wb")

    def write_atomic(self, path: str, data: bytes) -> None:
        """Write a whole file so readers see the old one or the new one, never a part.

        Local files are written aside and renamed; object stores make a single
        PUT visible atomically.
        """
        full = self.full(path)
        if self.protocol == "file":
            tmp = f"{full}.tmp-{uuid.uuid4().hex}"
            os.makedirs(os.path.dirname(full), exist_ok=True)
            with open(tmp, "wb") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, full)
            return
        self._with_retries(path, lambda d: self._call("pipe_file", d, full, data))

    def list(self, path: str) -> list[str]:
        """The names of the entries of directory ``path`` (``[]`` when it does not exist),
        sorted; with retries."""
        full = self.full(path)

        def names(deadline: float) -> list[str]:
            try:
                entries = self._call("ls", deadline, full, detail=False)
            except FileNotFoundError:
                return []
            return sorted(str(e).rstrip("/").rsplit("/", 1)[-1] for e in entries)

        return list(self._with_retries(path, names))

    @property
    def appends(self) -> bool:
        """Whether :meth:`append` works here (local files; object stores cannot append)."""
        return self.protocol == "file"

    def append(self, path: str, data: bytes) -> None:
        """Append ``data`` to a local file durably (``fdatasync`` before it returns); the
        file and its directories are made on the first append. The descriptor stays
        open until :meth:`close_append`."""
        if not self.appends:
            raise ConfigError(f"{self.url}: {self.protocol}:// storage cannot append to a file")
        self._check_pid()
        full = self.full(path)
        fd = self._appending.get(full)
        if fd is None:
            os.makedirs(os.path.dirname(full), exist_ok=True)
            fd = self._appending[full] = os.open(
                full, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644
            )
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fdatasync(fd)  # the data and the size it needs to be read

    def close_append(self, path: str) -> None:
        """Close the descriptor :meth:`append` kept for ``path``."""
        fd = self._appending.pop(self.full(path), None)
        if fd is not None and self._pid == os.getpid():
            os.close(fd)

    def remove(self, path: str) -> None:
        try:
            self.fs.rm_file(self.full(path))
        except FileNotFoundError:
            pass
