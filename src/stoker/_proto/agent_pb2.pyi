from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Request(_message.Message):
    __slots__ = ("id", "hello", "open", "get", "release", "plan", "stats", "holdings", "relay")
    ID_FIELD_NUMBER: _ClassVar[int]
    HELLO_FIELD_NUMBER: _ClassVar[int]
    OPEN_FIELD_NUMBER: _ClassVar[int]
    GET_FIELD_NUMBER: _ClassVar[int]
    RELEASE_FIELD_NUMBER: _ClassVar[int]
    PLAN_FIELD_NUMBER: _ClassVar[int]
    STATS_FIELD_NUMBER: _ClassVar[int]
    HOLDINGS_FIELD_NUMBER: _ClassVar[int]
    RELAY_FIELD_NUMBER: _ClassVar[int]
    id: int
    hello: Hello
    open: Open
    get: Get
    release: Release
    plan: Plan
    stats: StatsRequest
    holdings: Holdings
    relay: Relay
    def __init__(self, id: _Optional[int] = ..., hello: _Optional[_Union[Hello, _Mapping]] = ..., open: _Optional[_Union[Open, _Mapping]] = ..., get: _Optional[_Union[Get, _Mapping]] = ..., release: _Optional[_Union[Release, _Mapping]] = ..., plan: _Optional[_Union[Plan, _Mapping]] = ..., stats: _Optional[_Union[StatsRequest, _Mapping]] = ..., holdings: _Optional[_Union[Holdings, _Mapping]] = ..., relay: _Optional[_Union[Relay, _Mapping]] = ...) -> None: ...

class Hello(_message.Message):
    __slots__ = ("protocol", "pid")
    PROTOCOL_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    protocol: int
    pid: int
    def __init__(self, protocol: _Optional[int] = ..., pid: _Optional[int] = ...) -> None: ...

class Open(_message.Message):
    __slots__ = ("url", "storage_options_json", "dataset_id", "view_json")
    URL_FIELD_NUMBER: _ClassVar[int]
    STORAGE_OPTIONS_JSON_FIELD_NUMBER: _ClassVar[int]
    DATASET_ID_FIELD_NUMBER: _ClassVar[int]
    VIEW_JSON_FIELD_NUMBER: _ClassVar[int]
    url: str
    storage_options_json: str
    dataset_id: str
    view_json: str
    def __init__(self, url: _Optional[str] = ..., storage_options_json: _Optional[str] = ..., dataset_id: _Optional[str] = ..., view_json: _Optional[str] = ...) -> None: ...

class Get(_message.Message):
    __slots__ = ("dataset_id", "block", "release")
    DATASET_ID_FIELD_NUMBER: _ClassVar[int]
    BLOCK_FIELD_NUMBER: _ClassVar[int]
    RELEASE_FIELD_NUMBER: _ClassVar[int]
    dataset_id: str
    block: int
    release: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, dataset_id: _Optional[str] = ..., block: _Optional[int] = ..., release: _Optional[_Iterable[int]] = ...) -> None: ...

class Release(_message.Message):
    __slots__ = ("dataset_id", "blocks")
    DATASET_ID_FIELD_NUMBER: _ClassVar[int]
    BLOCKS_FIELD_NUMBER: _ClassVar[int]
    dataset_id: str
    blocks: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, dataset_id: _Optional[str] = ..., blocks: _Optional[_Iterable[int]] = ...) -> None: ...

class Plan(_message.Message):
    __slots__ = ("dataset_id", "blocks")
    DATASET_ID_FIELD_NUMBER: _ClassVar[int]
    BLOCKS_FIELD_NUMBER: _ClassVar[int]
    dataset_id: str
    blocks: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, dataset_id: _Optional[str] = ..., blocks: _Optional[_Iterable[int]] = ...) -> None: ...

class StatsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class Holdings(_message.Message):
    __slots__ = ("dataset_id",)
    DATASET_ID_FIELD_NUMBER: _ClassVar[int]
    dataset_id: str
    def __init__(self, dataset_id: _Optional[str] = ...) -> None: ...

class Relay(_message.Message):
    __slots__ = ("coordinator", "token", "calls", "timeout", "retry_for")
    COORDINATOR_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    CALLS_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_FIELD_NUMBER: _ClassVar[int]
    RETRY_FOR_FIELD_NUMBER: _ClassVar[int]
    coordinator: str
    token: str
    calls: _containers.RepeatedScalarFieldContainer[bytes]
    timeout: float
    retry_for: float
    def __init__(self, coordinator: _Optional[str] = ..., token: _Optional[str] = ..., calls: _Optional[_Iterable[bytes]] = ..., timeout: _Optional[float] = ..., retry_for: _Optional[float] = ...) -> None: ...

class Response(_message.Message):
    __slots__ = ("id", "error", "error_kind", "ack", "opened", "block", "stats", "held", "relayed")
    ID_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    ERROR_KIND_FIELD_NUMBER: _ClassVar[int]
    ACK_FIELD_NUMBER: _ClassVar[int]
    OPENED_FIELD_NUMBER: _ClassVar[int]
    BLOCK_FIELD_NUMBER: _ClassVar[int]
    STATS_FIELD_NUMBER: _ClassVar[int]
    HELD_FIELD_NUMBER: _ClassVar[int]
    RELAYED_FIELD_NUMBER: _ClassVar[int]
    id: int
    error: str
    error_kind: str
    ack: Ack
    opened: Opened
    block: Block
    stats: Stats
    held: Held
    relayed: Relayed
    def __init__(self, id: _Optional[int] = ..., error: _Optional[str] = ..., error_kind: _Optional[str] = ..., ack: _Optional[_Union[Ack, _Mapping]] = ..., opened: _Optional[_Union[Opened, _Mapping]] = ..., block: _Optional[_Union[Block, _Mapping]] = ..., stats: _Optional[_Union[Stats, _Mapping]] = ..., held: _Optional[_Union[Held, _Mapping]] = ..., relayed: _Optional[_Union[Relayed, _Mapping]] = ...) -> None: ...

class Relayed(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedScalarFieldContainer[bytes]
    def __init__(self, results: _Optional[_Iterable[bytes]] = ...) -> None: ...

class Held(_message.Message):
    __slots__ = ("blocks",)
    BLOCKS_FIELD_NUMBER: _ClassVar[int]
    blocks: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, blocks: _Optional[_Iterable[int]] = ...) -> None: ...

class Ack(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class Opened(_message.Message):
    __slots__ = ("dataset_id",)
    DATASET_ID_FIELD_NUMBER: _ClassVar[int]
    dataset_id: str
    def __init__(self, dataset_id: _Optional[str] = ...) -> None: ...

class Block(_message.Message):
    __slots__ = ("path", "tokens", "record", "pinned")
    PATH_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    RECORD_FIELD_NUMBER: _ClassVar[int]
    PINNED_FIELD_NUMBER: _ClassVar[int]
    path: str
    tokens: int
    record: bytes
    pinned: bool
    def __init__(self, path: _Optional[str] = ..., tokens: _Optional[int] = ..., record: _Optional[bytes] = ..., pinned: _Optional[bool] = ...) -> None: ...

class Stats(_message.Message):
    __slots__ = ("json",)
    JSON_FIELD_NUMBER: _ClassVar[int]
    json: str
    def __init__(self, json: _Optional[str] = ...) -> None: ...
