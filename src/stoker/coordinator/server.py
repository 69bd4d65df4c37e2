"""A running coordinator: the gRPC server (loopback unless given a token), its token
check, its limits, and the expiry thread."""

from __future__ import annotations

import hmac
import ipaddress
import logging
import secrets
import threading
from concurrent import futures
from typing import Any

import grpc

from stoker._proto import coordinator_pb2_grpc as pb_grpc
from stoker.coordinator.limits import (
    HANDSHAKE_TIMEOUT,
    MAX_CALLS,
    MAX_CONNECTIONS,
    MAX_MESSAGE,
    MAX_STREAMS,
)
from stoker.coordinator.service import Coordinator
from stoker.errors import ConfigError

log = logging.getLogger("stoker.coordinator")


def is_loopback(bind: str) -> bool:
    host = bind.rsplit(":", 1)[0].strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class _Auth(grpc.ServerInterceptor):
    def __init__(self, token: str) -> None:
        self._expected = f"Bearer {token}".encode()

        def deny(request: Any, context: grpc.ServicerContext) -> None:
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong coordinator token")

        self._deny = grpc.unary_unary_rpc_method_handler(deny)

    def intercept_service(self, continuation: Any, details: Any) -> Any:
        got = dict(details.invocation_metadata).get("authorization", "")
        if hmac.compare_digest(got.encode(), self._expected):
            return continuation(details)
        return self._deny


class Server:
    """A running coordinator: gRPC server, expiry thread.

    ``token`` None: off loopback a :class:`ConfigError`; on loopback the server draws
    one (:attr:`token`, :attr:`generated`) for its caller to hand to the clients.
    """

    def __init__(
        self,
        coordinator: Coordinator,
        bind: str = "127.0.0.1:0",
        token: str | None = None,
        threads: int = 16,
        *,
        max_connections: int = MAX_CONNECTIONS,
        handshake_timeout: float = HANDSHAKE_TIMEOUT,
    ) -> None:
        if not is_loopback(bind) and not token:
            raise ConfigError(
                f"the coordinator binds {bind}, which is not loopback: give it a shared token "
                "(--token-file or STOKER_COORDINATOR_TOKEN)"
            )
        if max_connections < 1 or not handshake_timeout > 0:
            raise ConfigError(
                f"max_connections must be >= 1 and handshake_timeout > 0 (--max-connections, "
                f"--handshake-timeout), got {max_connections} and {handshake_timeout}"
            )
        self.coordinator = coordinator
        self.generated = not token
        self.token = token or secrets.token_urlsafe(32)
        options = [
            ("grpc.max_receive_message_length", MAX_MESSAGE),
            ("grpc.max_allowed_incoming_connections", max_connections),
            ("grpc.max_concurrent_streams", MAX_STREAMS),
            ("grpc.server_handshake_timeout_ms", max(1, int(handshake_timeout * 1000))),
            ("grpc.keepalive_time_ms", 60_000),
            ("grpc.keepalive_timeout_ms", 20_000),
            ("grpc.max_connection_idle_ms", 600_000),
            ("grpc.http2.max_pings_without_data", 0),
        ]
        self.server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=threads),
            interceptors=[_Auth(self.token)],
            options=options,
            maximum_concurrent_rpcs=MAX_CALLS,
        )
        pb_grpc.add_CoordinatorServicer_to_server(coordinator, self.server)
        self.port = self.server.add_insecure_port(bind)
        if self.port == 0:
            raise ConfigError(f"could not bind the coordinator to {bind}")
        self.address = f"{bind.rsplit(':', 1)[0]}:{self.port}"
        self._stop = threading.Event()
        self._expiry = threading.Thread(target=self._expire_loop, daemon=True, name="stoker-expiry")

    def _expire_loop(self) -> None:
        period = max(0.05, coordinator_timeout(self.coordinator) / 4)
        while not self._stop.wait(period):
            gone = self.coordinator.expire()
            if gone:
                log.info("consumers %s went silent; their leases are back in the queue", gone)

    def start(self) -> Server:
        self.server.start()
        self._expiry.start()
        self.coordinator.start_writer()
        return self

    def stop(self, grace: float | None = None) -> None:
        self._stop.set()
        self.server.stop(grace).wait()
        self.coordinator.close()


def coordinator_timeout(c: Coordinator) -> float:
    return c.config.timeout
