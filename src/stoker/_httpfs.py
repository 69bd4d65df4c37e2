"""Range reads over HTTP(S) with the standard library.

Plain ``http(s)://`` datasets skip fsspec and aiohttp (their imports alone cost
about 0.3 s, which a cold start pays before its first batch). One keep-alive
connection per thread and host; timeouts on connect and on every read.
Read-only, like fsspec's HTTP filesystem.
"""

from __future__ import annotations

import http.client
import threading
from typing import Any
from urllib.parse import urlsplit


class HTTPStatusError(OSError):
    """The server answered with an error status."""

    def __init__(self, url: str, status: int, reason: str) -> None:
        super().__init__(f"HTTP {status} {reason} for {url}")
        self.status = status


class HTTPFS:
    def __init__(self, connect_timeout: float, read_timeout: float) -> None:
        self.connect_timeout = connect_timeout
        self.read_timeout = read_timeout
        self._local = threading.local()

    def _connection(self, scheme: str, netloc: str) -> http.client.HTTPConnection:
        conns: dict[tuple[str, str], http.client.HTTPConnection] = self._local.__dict__.setdefault(
            "conns", {}
        )
        conn = conns.get((scheme, netloc))
        if conn is None:
            cls = http.client.HTTPSConnection if scheme == "https" else http.client.HTTPConnection
            conn = cls(netloc, timeout=self.connect_timeout)
            conn.connect()
            if conn.sock is not None:
                conn.sock.settimeout(self.read_timeout)
            conns[(scheme, netloc)] = conn
        return conn

    def _drop(self, scheme: str, netloc: str) -> None:
        conn = self._local.__dict__.get("conns", {}).pop((scheme, netloc), None)
        if conn is not None:
            conn.close()

    def _request(self, method: str, url: str, headers: dict[str, str]) -> tuple[int, Any, bytes]:
        parts = urlsplit(url)
        target = parts.path + (f"?{parts.query}" if parts.query else "")
        try:
            conn = self._connection(parts.scheme, parts.netloc)
            conn.request(method, target, headers=headers)
            resp = conn.getresponse()
            body = resp.read()
        except BaseException:
            self._drop(parts.scheme, parts.netloc)  # never reuse a connection in an unknown state
            raise
        if resp.will_close:
            self._drop(parts.scheme, parts.netloc)
        return resp.status, resp, body

    def cat_file(self, path: str, start: int | None = None, end: int | None = None) -> bytes:
        headers = {}
        if start is not None or end is not None:
            headers["Range"] = f"bytes={start or 0}-{'' if end is None else end - 1}"
        status, resp, body = self._request("GET", path, headers)
        if status == 404:
            raise FileNotFoundError(path)
        if status >= 400:
            raise HTTPStatusError(path, status, resp.reason)
        if status == 200 and headers:  # the server ignored the range
            body = body[start or 0 : end]
        return body

    def exists(self, path: str) -> bool:
        status, resp, _ = self._request("HEAD", path, {})
        if status == 404:
            return False
        if status >= 400:
            raise HTTPStatusError(path, status, resp.reason)
        return True

    def size(self, path: str) -> int:
        status, resp, _ = self._request("HEAD", path, {})
        if status == 404:
            raise FileNotFoundError(path)
        if status >= 400:
            raise HTTPStatusError(path, status, resp.reason)
        return int(resp.headers["Content-Length"])

    def open(self, path: str, mode: str = "rb") -> Any:
        raise NotImplementedError(f"{path}: HTTP datasets are read-only; write to a path or s3://")

    def pipe_file(self, path: str, data: bytes) -> None:
        self.open(path, "wb")

    def rm_file(self, path: str) -> None:
        self.open(path, "wb")
