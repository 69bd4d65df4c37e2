"""The ``/metrics`` endpoint: :func:`serve` (this process's
:class:`~stoker.observe.exposition.Collector`), :func:`serve_once` (once per rank) and
:func:`serve_registry` (any collector registry, its address announced in the runtime
directory for ``stoker doctor`` and ``stoker top``), on an HTTP server no client can hold."""

from __future__ import annotations

import logging
import threading
from typing import Any

from stoker.observe.exposition import Collector
from stoker.observe.registry import registry

log = logging.getLogger("stoker.metrics")


_served: dict[int, int | None] = {}


def rank_port(port: int, local_rank: int) -> int:
    """The port a rank serves on: ``port`` plus its local rank (``0``: any free port)."""
    return 0 if port == 0 else port + local_rank


def serve_once(port: int, local_rank: int = 0, addr: str = "127.0.0.1") -> int | None:
    """:func:`serve` on :func:`rank_port` unless this process already serves for it."""
    key = rank_port(port, local_rank)
    with registry().lock:
        if _served.get(key) is not None:
            return _served[key]
    got = serve(key, addr, role=f"rank {local_rank}")
    with registry().lock:
        _served[key] = got
    return got


def serve(
    port: int, addr: str = "127.0.0.1", extra: list[Any] | None = None, role: str = "rank"
) -> int | None:
    """Serve this process's metrics (and ``extra`` collectors) at ``http://addr:port/metrics``;
    returns the port bound (see :func:`serve_registry`)."""
    from prometheus_client import CollectorRegistry

    registry = CollectorRegistry(auto_describe=False)
    registry.register(Collector())
    for c in extra or []:
        registry.register(c)
    return serve_registry(registry, port, addr, role)


#: Seconds a /metrics client may take to send its request (and to read the answer).
HTTP_TIMEOUT = 10.0
#: Scrapes served at once; one more is closed unanswered.
HTTP_CONNECTIONS = 32


def _http_server(registry: Any, addr: str, port: int) -> Any:
    """A ``/metrics`` server (prometheus_client's WSGI app) that no client can hold: each
    connection gets :data:`HTTP_TIMEOUT` and a thread, at most :data:`HTTP_CONNECTIONS`."""
    import socketserver
    from wsgiref.simple_server import WSGIRequestHandler, WSGIServer

    from prometheus_client import make_wsgi_app

    class Handler(WSGIRequestHandler):
        timeout = HTTP_TIMEOUT  # a request sent in part and then silence is dropped

        def log_message(self, format: str, *args: Any) -> None:
            pass

    class Server(socketserver.ThreadingMixIn, WSGIServer):
        daemon_threads = True
        slots = threading.BoundedSemaphore(HTTP_CONNECTIONS)

        def process_request(self, request: Any, client_address: Any) -> None:
            if not self.slots.acquire(blocking=False):
                self.shutdown_request(request)
                return
            super().process_request(request, client_address)

        def process_request_thread(self, request: Any, client_address: Any) -> None:
            try:
                super().process_request_thread(request, client_address)
            finally:
                self.slots.release()

        def handle_error(self, request: Any, client_address: Any) -> None:
            # a client that stalled (timed out) or went away is dropped without a
            # traceback in the training job's log; anything else is still printed
            import sys

            if not isinstance(sys.exc_info()[1], (TimeoutError, ConnectionError)):
                super().handle_error(request, client_address)

    server = Server((addr, port), Handler)
    server.set_app(make_wsgi_app(registry))
    threading.Thread(target=server.serve_forever, daemon=True, name="stoker-metrics").start()
    return server


def serve_registry(registry: Any, port: int, addr: str = "127.0.0.1", role: str = "") -> int | None:
    """Serve ``registry`` on ``addr:port`` and record the address in the runtime directory
    (:func:`stoker.runtime.announce`), where ``stoker doctor`` and ``stoker top`` find it.

    ``port=0`` picks a free port. A port that is taken (another job, a second agent) is a
    warning, never an error: the endpoint moves to a free port, and None comes back only
    when no port can be bound at all. Metrics never stop training."""
    from stoker import runtime

    try:
        server = _http_server(registry, addr, port)
    except OSError as exc:
        if port == 0:
            log.warning("no metrics endpoint on %s: %s", addr, exc)
            return None
        try:
            server = _http_server(registry, addr, 0)
        except OSError as exc2:
            log.warning("no metrics endpoint: port %d: %s; no free port: %s", port, exc, exc2)
            return None
        log.warning(
            "metrics port %d is taken (%s); /metrics moved to %s:%d (stoker top finds it)",
            port,
            exc,
            addr,
            server.server_port,
        )
    got = int(server.server_port)
    runtime.announce(role or "metrics", addr, got)
    return got
