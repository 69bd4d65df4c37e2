"""Real servers on loopback for stoker's integration tests.

* :class:`NginxOrigin` serves a directory with the system nginx binary (static
  files, byte ranges, autoindex listings) and records every request in a
  tab-separated access log that tests can read back with :meth:`NginxOrigin.access_log`.
* :class:`MotoS3Server` runs ``python -m moto.server`` as a separate process, so that
  forked or spawned clients talk to a real HTTP endpoint.

Both bind 127.0.0.1 and pick a free port themselves. Nothing here talks to any other
address, except that :class:`NginxOrigin` can be told to listen on another address
(``host=``) and to run under a command prefix (``command_prefix=["ip", "netns",
"exec", NAME]``): a test's network namespace.

Failure injection in :class:`NginxOrigin` (every location serves the same root):

=================  ==========================================================
``/<path>``         the file or an autoindex listing (ranges supported)
``/down/<path>``    always ``503 Service Unavailable``
``/drop/<path>``    the connection is closed without any response (nginx ``444``)
``/slow/<path>``    the file, throttled to ``slow_rate`` bytes per second
``/flaky/<path>``   only with ``flaky_every=N``: the file, except that every N-th
                    request to ``/flaky/`` (any method, HEAD included, counted
                    across all files, starting with the N-th since start-up)
                    gets ``503``
=================  ==========================================================

``/flaky/`` is deterministic: nginx proxies it to a round-robin upstream of N unix
sockets, N-1 of which serve the root and the last of which returns 503. The single
worker process keeps the round-robin position, so the pattern is exact as long as
nothing else sends requests to ``/flaky/``.
"""

from __future__ import annotations

import contextlib
import http.client
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

LOOPBACK = "127.0.0.1"
_FIXTURE_PREFIX = "/__fixture__/"
_UNIX_PATH_MAX = 100  # sun_path is 108 bytes; keep a margin


def find_nginx() -> str | None:
    """Path of the nginx binary, or None when it is not installed."""
    found = shutil.which("nginx")
    if found:
        return found
    for candidate in ("/usr/sbin/nginx", "/usr/local/sbin/nginx", "/usr/local/nginx/sbin/nginx"):
        if os.access(candidate, os.X_OK):
            return candidate
    return None


def free_port(host: str = LOOPBACK) -> int:
    """A port that was free a moment ago (callers retry if someone else takes it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _tail(path: Path, lines: int = 40) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError as exc:
        return f"<cannot read {path}: {exc}>"
    return "\n".join(text.splitlines()[-lines:])


def _http_get(port: int, path: str, timeout: float, host: str = LOOPBACK) -> int:
    """Status of GET http://host:port/path, without any proxy settings."""
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        resp.read()
        return resp.status
    finally:
        conn.close()


def _terminate(proc: subprocess.Popen[bytes], sig: int, timeout: float) -> None:
    """Stop a child started with start_new_session=True, and reap it."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(sig)
        try:
            proc.wait(timeout=timeout)
            return
        except subprocess.TimeoutExpired:
            pass
        # The child leads its own process group: kill the group so no worker survives.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=timeout)


# --------------------------------------------------------------------------- nginx


@dataclass(frozen=True)
class AccessRecord:
    """One line of :class:`NginxOrigin`'s access log."""

    method: str
    path: str  # request path as sent, without the query string (still %-encoded)
    status: int
    range: str | None  # the Range request header, None when absent
    bytes_sent: int  # body bytes sent ($body_bytes_sent)
    query: str | None = None
    total_bytes_sent: int = 0  # including headers ($bytes_sent)
    connection: int = 0  # nginx connection serial number
    connection_requests: int = 0  # 1 for the first request on a connection
    msec: float = 0.0  # time of the log write, seconds since the epoch
    request_time: float = 0.0  # seconds
    client: str = ""  # the address the request came from ($remote_addr)


_LOG_FORMAT = "\\t".join(
    [
        "$msec",
        "$request_method",
        "$request_uri",
        "$status",
        "$http_range",
        "$body_bytes_sent",
        "$bytes_sent",
        "$connection",
        "$connection_requests",
        "$request_time",
        "$remote_addr",
    ]
)


def _parse_access_line(line: str) -> AccessRecord | None:
    parts = line.rstrip("\n").split("\t")
    if len(parts) != 11:
        return None
    msec, method, uri, status, rng, body, total, conn, conn_req, rtime, client = parts
    path, _, query = uri.partition("?")
    return AccessRecord(
        method=method,
        path=path,
        status=int(status),
        range=None if rng == "-" else rng,
        bytes_sent=int(body),
        query=query or None,
        total_bytes_sent=int(total),
        connection=int(conn),
        connection_requests=int(conn_req),
        msec=float(msec),
        request_time=float(rtime),
        client=client,
    )


def _nginx_str(value: str | Path) -> str:
    """Quote a path for nginx.conf; refuse what nginx would interpret."""
    s = str(value)
    if any(c in s for c in '"\\$\n{};'):
        raise ValueError(f"path not usable in nginx.conf: {s!r}")
    return f'"{s}"'


class NginxOrigin:
    """A static HTTP origin on 127.0.0.1 (or ``host``) backed by the system nginx.

    ``with NginxOrigin(root) as origin: ...`` or ``start()``/``stop()``.

    ``command_prefix`` goes before the nginx command line, e.g. ``["ip", "netns",
    "exec", NAME]`` to serve from a network namespace (then ``host`` is an address
    of that namespace, reachable from this process for the readiness probe). The
    prefix must exec nginx (not fork it) so that :attr:`pid` is nginx's master.
    """

    def __init__(
        self,
        root: str | Path,
        *,
        flaky_every: int | None = None,
        slow_rate: int = 64 * 1024,
        nginx: str | None = None,
        prefix: str | Path | None = None,
        startup_timeout: float = 15.0,
        host: str = LOOPBACK,
        command_prefix: Sequence[str] = (),
    ) -> None:
        self.root = Path(root).resolve()
        if not self.root.is_dir():
            raise NotADirectoryError(self.root)
        if flaky_every is not None and flaky_every < 1:
            raise ValueError("flaky_every must be >= 1")
        self.flaky_every = flaky_every
        self.slow_rate = int(slow_rate)
        self.nginx = nginx or find_nginx()
        if self.nginx is None:
            raise FileNotFoundError("nginx binary not found (apt-get install nginx-light)")
        self._given_prefix = Path(prefix) if prefix is not None else None
        self.startup_timeout = startup_timeout
        self.host = host
        self.command_prefix = list(command_prefix)
        self.prefix: Path | None = None
        self._sock_dir: Path | None = None
        self._own_sock_dir = False
        self._proc: subprocess.Popen[bytes] | None = None
        self.port: int | None = None

    # -- paths --------------------------------------------------------------------

    @property
    def url(self) -> str:
        if self.port is None:
            raise RuntimeError("NginxOrigin is not started")
        return f"http://{self.host}:{self.port}"

    def url_for(self, relpath: str | Path, via: str = "") -> str:
        """URL of ``root/relpath``; ``via`` is ``""``, ``"slow"``, ``"flaky"``, ``"down"``, ``"drop"``."""
        rel = str(relpath).lstrip("/")
        mid = f"/{via.strip('/')}" if via else ""
        return f"{self.url}{mid}/{rel}"

    @property
    def error_log_path(self) -> Path:
        assert self.prefix is not None
        return self.prefix / "logs" / "error.log"

    @property
    def access_log_path(self) -> Path:
        assert self.prefix is not None
        return self.prefix / "logs" / "access.log"

    @property
    def conf_path(self) -> Path:
        assert self.prefix is not None
        return self.prefix / "nginx.conf"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    # -- configuration ------------------------------------------------------------

    def _config(self, port: int) -> str:
        assert self.prefix is not None and self._sock_dir is not None
        p = self.prefix
        root = _nginx_str(self.root)
        alias = _nginx_str(f"{self.root}/")
        lines = []
        if os.geteuid() == 0:
            # Without this the worker would drop to "nobody" and could not read
            # files in root-owned (0700) temp directories.
            lines.append("user root root;")
        lines += [
            "worker_processes 1;",
            f"pid {_nginx_str(p / 'nginx.pid')};",
            f"lock_file {_nginx_str(p / 'nginx.lock')};",
            f"error_log {_nginx_str(self.error_log_path)} notice;",
            "events { worker_connections 1024; }",
            "http {",
            "  default_type application/octet-stream;",
            f"  log_format stoker_tsv '{_LOG_FORMAT}';",
            # No buffer= / flush=: every line is written when its request finishes.
            f"  access_log {_nginx_str(self.access_log_path)} stoker_tsv;",
            f"  client_body_temp_path {_nginx_str(p / 'tmp' / 'body')};",
            f"  proxy_temp_path {_nginx_str(p / 'tmp' / 'proxy')};",
            f"  fastcgi_temp_path {_nginx_str(p / 'tmp' / 'fastcgi')};",
            f"  uwsgi_temp_path {_nginx_str(p / 'tmp' / 'uwsgi')};",
            f"  scgi_temp_path {_nginx_str(p / 'tmp' / 'scgi')};",
            "  server_tokens off;",
            "  absolute_redirect off;",
            "  sendfile on;",
            "  tcp_nodelay on;",
            "  keepalive_timeout 75s;",
            "  keepalive_requests 100000;",
            "  autoindex on;",
        ]
        if self.flaky_every is not None:
            ok = _nginx_str(f"unix:{self._sock_dir / 'ok.sock'}")
            down = _nginx_str(f"unix:{self._sock_dir / 'down.sock'}")
            lines.append("  upstream stoker_flaky {")
            # Equal weights: smooth round robin visits the servers in order.
            lines += [f"    server {ok} max_fails=0;"] * (self.flaky_every - 1)
            lines.append(f"    server {down} max_fails=0;")
            lines.append("  }")
            lines += [
                "  server {",
                f"    listen {ok};",
                "    access_log off;",
                f"    root {root};",
                "  }",
                "  server {",
                f"    listen {down};",
                "    access_log off;",
                "    return 503;",
                "  }",
            ]
        lines += [
            "  server {",
            f"    listen {self.host}:{port};",
            "    server_name _;",
            f"    root {root};",
            "    location / { }",
            f"    location ^~ {_FIXTURE_PREFIX} {{ return 204; }}",
            "    location ^~ /down/ { return 503; }",
            "    location ^~ /drop/ { return 444; }",
            "    location ^~ /slow/ {",
            f"      alias {alias};",
            f"      limit_rate {self.slow_rate};",
            "    }",
        ]
        if self.flaky_every is not None:
            lines += [
                "    location ^~ /flaky/ {",
                "      proxy_pass http://stoker_flaky/;",
                "      proxy_next_upstream off;",
                "    }",
            ]
        lines += ["  }", "}", ""]
        return "\n".join(lines)

    # -- lifecycle ----------------------------------------------------------------

    def start(self) -> NginxOrigin:
        if self._proc is not None:
            return self
        if self._given_prefix is not None:
            self.prefix = self._given_prefix.resolve()
            self.prefix.mkdir(parents=True, exist_ok=True)
        else:
            self.prefix = Path(tempfile.mkdtemp(prefix="stoker-nginx-"))
        for sub in ("logs", "tmp"):
            (self.prefix / sub).mkdir(exist_ok=True)
        if len(str(self.prefix / "down.sock")) < _UNIX_PATH_MAX:
            self._sock_dir, self._own_sock_dir = self.prefix, False
        else:
            self._sock_dir, self._own_sock_dir = Path(tempfile.mkdtemp(prefix="ngx-")), True

        last_error = ""
        for _attempt in range(5):
            # Under a command prefix nginx binds in another network namespace, where
            # ``host`` may not exist here: a port free on loopback is a good guess
            # (the loop retries when it is taken).
            port = free_port(LOOPBACK if self.command_prefix else self.host)
            for sock in ("ok.sock", "down.sock"):
                with contextlib.suppress(FileNotFoundError):
                    (self._sock_dir / sock).unlink()
            self.conf_path.write_text(self._config(port))
            self.error_log_path.write_text("")
            self.access_log_path.write_text("")
            stderr = open(self.prefix / "logs" / "stderr.log", "ab")  # noqa: SIM115
            try:
                self._proc = subprocess.Popen(
                    [
                        *self.command_prefix,
                        self.nginx,
                        "-p",
                        f"{self.prefix}/",
                        "-e",
                        str(self.error_log_path),
                        "-c",
                        str(self.conf_path),
                        "-g",
                        "daemon off;",
                    ],
                    stdin=subprocess.DEVNULL,
                    stdout=stderr,
                    stderr=stderr,
                    start_new_session=True,
                )
            finally:
                stderr.close()
            self.port = port
            outcome = self._wait_ready()
            if outcome == "ready":
                return self
            self._proc = None
            self.port = None
            last_error = outcome
            if "Address already in use" not in outcome:
                break
        self._cleanup_dirs(failed=True)
        raise RuntimeError(f"nginx did not start (conf {self.conf_path}):\n{last_error}")

    def _wait_ready(self) -> str:
        """'ready', or the reason it failed (nginx output tail)."""
        assert self._proc is not None and self.port is not None
        deadline = time.monotonic() + self.startup_timeout
        while True:
            rc = self._proc.poll()
            if rc is not None:
                return f"nginx exited with {rc}; error log tail:\n{self._logs_tail()}"
            try:
                status = _http_get(
                    self.port, f"{_FIXTURE_PREFIX}ready", timeout=2.0, host=self.host
                )
            except OSError:
                status = None
            if status == 204:
                return "ready"
            if time.monotonic() > deadline:
                _terminate(self._proc, signal.SIGTERM, 5.0)
                return (
                    f"nginx not ready after {self.startup_timeout}s "
                    f"(last status {status}); error log tail:\n{self._logs_tail()}"
                )
            time.sleep(0.02)

    def _logs_tail(self) -> str:
        assert self.prefix is not None
        return (
            _tail(self.error_log_path)
            + "\n--- stderr ---\n"
            + _tail(self.prefix / "logs" / "stderr.log")
        )

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            # SIGTERM = fast shutdown: the master stops its worker and exits.
            _terminate(proc, signal.SIGTERM, 10.0)
        self.port = None
        self._cleanup_dirs(failed=False)

    def _cleanup_dirs(self, failed: bool) -> None:
        if self._own_sock_dir and self._sock_dir is not None:
            shutil.rmtree(self._sock_dir, ignore_errors=True)
        self._sock_dir = None
        # A prefix we created ourselves goes away unless start-up failed (keep it
        # for the error message); a prefix given by the caller stays.
        if self._given_prefix is None and self.prefix is not None and not failed:
            shutil.rmtree(self.prefix, ignore_errors=True)
            self.prefix = None

    def __enter__(self) -> NginxOrigin:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- access log ---------------------------------------------------------------

    def sync_access_log(self, timeout: float = 5.0) -> None:
        """Wait until every request answered so far is in the access log.

        nginx writes a line after the response is sent, so a client can see the
        last byte before the line exists. This sends a marker request and waits for
        its line: the single worker finishes (and logs) requests in order of
        completion, so everything completed before the marker is in the file.
        (A request the client aborted mid-response may be logged later.)
        """
        if self.port is None:
            raise RuntimeError("NginxOrigin is not started")
        token = uuid.uuid4().hex
        _http_get(self.port, f"{_FIXTURE_PREFIX}sync/{token}", timeout=timeout, host=self.host)
        deadline = time.monotonic() + timeout
        while token not in self.access_log_path.read_text(errors="replace"):
            if time.monotonic() > deadline:
                raise TimeoutError(f"access log marker {token} not written in {timeout}s")
            time.sleep(0.01)

    def access_log(self, sync: bool = True) -> list[AccessRecord]:
        """All requests so far (oldest first), without the fixture's own probes."""
        if sync and self._proc is not None:
            self.sync_access_log()
        records = []
        with open(self.access_log_path, errors="replace") as f:
            for line in f:
                rec = _parse_access_line(line)
                if rec is not None and not rec.path.startswith(_FIXTURE_PREFIX):
                    records.append(rec)
        return records

    def clear_access_log(self) -> None:
        """Forget all requests so far (nginx appends with O_APPEND, so truncating is safe)."""
        if self._proc is not None:
            self.sync_access_log()
        with open(self.access_log_path, "w"):
            pass


# --------------------------------------------------------------------------- moto


@dataclass(frozen=True)
class MotoRequest:
    """One request as logged by moto's (werkzeug's) server."""

    method: str
    path: str  # path without the query string, %-decoded by werkzeug (uri_to_iri)
    query: str | None
    status: int


_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_WERKZEUG_LINE = re.compile(
    r'\] "(?P<method>[A-Z]+) (?P<target>.*) HTTP/[0-9.]+" (?P<status>\d{3}) '
)

DUMMY_AWS_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_SECURITY_TOKEN": "testing",
    "AWS_SESSION_TOKEN": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_REGION": "us-east-1",
}


class MotoS3Server:
    """``python -m moto.server`` on a free loopback port, as a child process."""

    region = "us-east-1"

    def __init__(
        self,
        *,
        log_dir: str | Path | None = None,
        startup_timeout: float = 60.0,
        python: str = sys.executable,
    ) -> None:
        self._given_log_dir = Path(log_dir) if log_dir is not None else None
        self.log_dir: Path | None = None
        self.startup_timeout = startup_timeout
        self.python = python
        self._proc: subprocess.Popen[bytes] | None = None
        self.port: int | None = None

    @property
    def endpoint_url(self) -> str:
        if self.port is None:
            raise RuntimeError("MotoS3Server is not started")
        return f"http://{LOOPBACK}:{self.port}"

    @property
    def log_path(self) -> Path:
        assert self.log_dir is not None
        return self.log_dir / "moto.log"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    # -- lifecycle ----------------------------------------------------------------

    def _child_env(self) -> dict[str, str]:
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith("AWS_") and k.lower() not in ("http_proxy", "https_proxy")
        }
        env.update(DUMMY_AWS_ENV)
        env["PYTHONUNBUFFERED"] = "1"
        env["NO_PROXY"] = env["no_proxy"] = LOOPBACK
        return env

    def start(self) -> MotoS3Server:
        if self._proc is not None:
            return self
        if self._given_log_dir is not None:
            self.log_dir = self._given_log_dir.resolve()
            self.log_dir.mkdir(parents=True, exist_ok=True)
        else:
            self.log_dir = Path(tempfile.mkdtemp(prefix="stoker-moto-"))
        last_error = ""
        for _attempt in range(5):
            port = free_port()
            self.log_path.write_text("")
            log = open(self.log_path, "ab")  # noqa: SIM115
            try:
                self._proc = subprocess.Popen(
                    [self.python, "-m", "moto.server", "-H", LOOPBACK, "-p", str(port)],
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=log,
                    env=self._child_env(),
                    start_new_session=True,
                )
            finally:
                log.close()
            self.port = port
            outcome = self._wait_ready()
            if outcome == "ready":
                return self
            self._proc = None
            self.port = None
            last_error = outcome
            if "Address already in use" not in outcome:
                break
        raise RuntimeError(f"moto server did not start:\n{last_error}")

    def _wait_ready(self) -> str:
        assert self._proc is not None and self.port is not None
        deadline = time.monotonic() + self.startup_timeout
        while True:
            rc = self._proc.poll()
            if rc is not None:
                return f"moto.server exited with {rc}; log tail:\n{_tail(self.log_path)}"
            try:
                # Any HTTP answer means the server accepts requests.
                _http_get(self.port, "/moto-api/data.json", timeout=2.0)
                return "ready"
            except OSError:
                pass
            if time.monotonic() > deadline:
                _terminate(self._proc, signal.SIGTERM, 5.0)
                return (
                    f"moto.server not ready after {self.startup_timeout}s; "
                    f"log tail:\n{_tail(self.log_path)}"
                )
            time.sleep(0.05)

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            _terminate(proc, signal.SIGTERM, 10.0)
        self.port = None
        if self._given_log_dir is None and self.log_dir is not None:
            shutil.rmtree(self.log_dir, ignore_errors=True)
            self.log_dir = None

    def __enter__(self) -> MotoS3Server:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- clients ------------------------------------------------------------------

    def storage_options(self) -> dict[str, Any]:
        """What fsspec/s3fs need (``fsspec.filesystem("s3", **opts)``)."""
        return {
            "key": DUMMY_AWS_ENV["AWS_ACCESS_KEY_ID"],
            "secret": DUMMY_AWS_ENV["AWS_SECRET_ACCESS_KEY"],
            "client_kwargs": {"endpoint_url": self.endpoint_url, "region_name": self.region},
        }

    def filesystem(self, **kwargs: Any) -> Any:
        """A fresh (uncached) s3fs.S3FileSystem for this server."""
        import s3fs

        return s3fs.S3FileSystem(skip_instance_cache=True, **self.storage_options(), **kwargs)

    def client(self) -> Any:
        """A boto3 S3 client for this server (dummy credentials)."""
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint_url,
            region_name=self.region,
            aws_access_key_id=DUMMY_AWS_ENV["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=DUMMY_AWS_ENV["AWS_SECRET_ACCESS_KEY"],
        )

    def make_bucket(self, name: str) -> str:
        """Create ``name`` unless it exists; returns the name."""
        client = self.client()
        with contextlib.suppress(client.exceptions.BucketAlreadyOwnedByYou):
            client.create_bucket(Bucket=name)
        return name

    def put_object(self, bucket: str, key: str, data: bytes) -> None:
        self.client().put_object(Bucket=bucket, Key=key, Body=data)

    def upload_dir(self, local_dir: str | Path, bucket: str, prefix: str = "") -> list[str]:
        """Upload every file under ``local_dir`` to ``s3://bucket/prefix/<relpath>``.

        Creates the bucket if needed; returns the keys, sorted.
        """
        local_dir = Path(local_dir)
        self.make_bucket(bucket)
        client = self.client()
        prefix = prefix.strip("/")
        keys = []
        for path in sorted(p for p in local_dir.rglob("*") if p.is_file()):
            rel = path.relative_to(local_dir).as_posix()
            key = f"{prefix}/{rel}" if prefix else rel
            client.upload_file(str(path), bucket, key)
            keys.append(key)
        return keys

    def reset(self) -> None:
        """Drop all buckets and objects (moto's /moto-api/reset)."""
        conn = http.client.HTTPConnection(LOOPBACK, self.port, timeout=10)
        try:
            conn.request("POST", "/moto-api/reset")
            resp = conn.getresponse()
            resp.read()
            if resp.status != 200:
                raise RuntimeError(f"moto reset failed: {resp.status}")
        finally:
            conn.close()

    # -- request log --------------------------------------------------------------

    def request_log(self) -> list[MotoRequest]:
        """Requests the server has answered, oldest first.

        werkzeug logs a request when it starts sending the response, so every
        request whose response a client has received is already in the file.
        Path-style addressing is assumed (what botocore uses for an IP endpoint).
        """
        records = []
        with open(self.log_path, errors="replace") as f:
            for line in f:
                m = _WERKZEUG_LINE.search(_ANSI.sub("", line))
                if m is None:
                    continue
                path, _, query = m["target"].partition("?")
                if path.startswith("/moto-api/"):
                    continue
                records.append(MotoRequest(m["method"], path, query or None, int(m["status"])))
        return records

    def count_requests(self, bucket: str, key: str | None = None, method: str | None = None) -> int:
        """How many requests hit ``bucket`` (or ``bucket/key``), optionally of one method."""
        target = f"/{bucket}" + (f"/{key}" if key is not None else "")
        return sum(
            1
            for r in self.request_log()
            if (r.path == target or (key is None and r.path.startswith(target + "/")))
            and (method is None or r.method == method)
        )
