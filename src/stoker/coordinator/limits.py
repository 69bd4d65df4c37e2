"""What one connection may make the coordinator hold (the gRPC server's bounds)."""

#: The largest request the server reads (a Batch of thousands of calls is well below).
MAX_MESSAGE = 4 << 20
#: Connections the server accepts at once (every worker of every rank holds one).
MAX_CONNECTIONS = 1024
#: Seconds a new connection has to complete its HTTP/2 handshake.
HANDSHAKE_TIMEOUT = 10.0
#: Calls in flight at once (past it a caller is told RESOURCE_EXHAUSTED and retries).
MAX_CALLS = 512
#: Concurrent calls on one connection.
MAX_STREAMS = 64
