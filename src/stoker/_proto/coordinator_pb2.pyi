from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class RegisterRequest(_message.Message):
    __slots__ = ("rank", "worker", "node", "stream", "min_epoch")
    RANK_FIELD_NUMBER: _ClassVar[int]
    WORKER_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    STREAM_FIELD_NUMBER: _ClassVar[int]
    MIN_EPOCH_FIELD_NUMBER: _ClassVar[int]
    rank: int
    worker: int
    node: str
    stream: str
    min_epoch: int
    def __init__(self, rank: _Optional[int] = ..., worker: _Optional[int] = ..., node: _Optional[str] = ..., stream: _Optional[str] = ..., min_epoch: _Optional[int] = ...) -> None: ...

class RegisterReply(_message.Message):
    __slots__ = ("consumer", "epoch", "origin", "first_step")
    CONSUMER_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    ORIGIN_FIELD_NUMBER: _ClassVar[int]
    FIRST_STEP_FIELD_NUMBER: _ClassVar[int]
    consumer: int
    epoch: int
    origin: str
    first_step: int
    def __init__(self, consumer: _Optional[int] = ..., epoch: _Optional[int] = ..., origin: _Optional[str] = ..., first_step: _Optional[int] = ...) -> None: ...

class LeaseRequest(_message.Message):
    __slots__ = ("consumer", "epoch", "held", "ahead")
    CONSUMER_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    HELD_FIELD_NUMBER: _ClassVar[int]
    AHEAD_FIELD_NUMBER: _ClassVar[int]
    consumer: int
    epoch: int
    held: _containers.RepeatedScalarFieldContainer[int]
    ahead: bool
    def __init__(self, consumer: _Optional[int] = ..., epoch: _Optional[int] = ..., held: _Optional[_Iterable[int]] = ..., ahead: _Optional[bool] = ...) -> None: ...

class LeaseReply(_message.Message):
    __slots__ = ("status", "lease", "start", "end", "horizon")
    class Status(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        GRANTED: _ClassVar[LeaseReply.Status]
        WAIT: _ClassVar[LeaseReply.Status]
        DONE: _ClassVar[LeaseReply.Status]
    GRANTED: LeaseReply.Status
    WAIT: LeaseReply.Status
    DONE: LeaseReply.Status
    STATUS_FIELD_NUMBER: _ClassVar[int]
    LEASE_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    HORIZON_FIELD_NUMBER: _ClassVar[int]
    status: LeaseReply.Status
    lease: int
    start: int
    end: int
    horizon: int
    def __init__(self, status: _Optional[_Union[LeaseReply.Status, str]] = ..., lease: _Optional[int] = ..., start: _Optional[int] = ..., end: _Optional[int] = ..., horizon: _Optional[int] = ...) -> None: ...

class HeartbeatRequest(_message.Message):
    __slots__ = ("consumer", "epoch", "lease", "read")
    CONSUMER_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    LEASE_FIELD_NUMBER: _ClassVar[int]
    READ_FIELD_NUMBER: _ClassVar[int]
    consumer: int
    epoch: int
    lease: int
    read: int
    def __init__(self, consumer: _Optional[int] = ..., epoch: _Optional[int] = ..., lease: _Optional[int] = ..., read: _Optional[int] = ...) -> None: ...

class LeaseLimits(_message.Message):
    __slots__ = ("lease", "end", "horizon")
    LEASE_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    HORIZON_FIELD_NUMBER: _ClassVar[int]
    lease: int
    end: int
    horizon: int
    def __init__(self, lease: _Optional[int] = ..., end: _Optional[int] = ..., horizon: _Optional[int] = ...) -> None: ...

class HeartbeatReply(_message.Message):
    __slots__ = ("leases",)
    LEASES_FIELD_NUMBER: _ClassVar[int]
    leases: _containers.RepeatedCompositeFieldContainer[LeaseLimits]
    def __init__(self, leases: _Optional[_Iterable[_Union[LeaseLimits, _Mapping]]] = ...) -> None: ...

class ConfirmRequest(_message.Message):
    __slots__ = ("consumer", "epoch", "lease", "upto")
    CONSUMER_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    LEASE_FIELD_NUMBER: _ClassVar[int]
    UPTO_FIELD_NUMBER: _ClassVar[int]
    consumer: int
    epoch: int
    lease: int
    upto: int
    def __init__(self, consumer: _Optional[int] = ..., epoch: _Optional[int] = ..., lease: _Optional[int] = ..., upto: _Optional[int] = ...) -> None: ...

class ConfirmReply(_message.Message):
    __slots__ = ("lease_done",)
    LEASE_DONE_FIELD_NUMBER: _ClassVar[int]
    lease_done: bool
    def __init__(self, lease_done: _Optional[bool] = ...) -> None: ...

class Segment(_message.Message):
    __slots__ = ("lease", "upto", "rows")
    LEASE_FIELD_NUMBER: _ClassVar[int]
    UPTO_FIELD_NUMBER: _ClassVar[int]
    ROWS_FIELD_NUMBER: _ClassVar[int]
    lease: int
    upto: int
    rows: int
    def __init__(self, lease: _Optional[int] = ..., upto: _Optional[int] = ..., rows: _Optional[int] = ...) -> None: ...

class ConfirmBatchRequest(_message.Message):
    __slots__ = ("consumer", "epoch", "seq", "segments", "batch_size", "count")
    CONSUMER_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    SEGMENTS_FIELD_NUMBER: _ClassVar[int]
    BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    consumer: int
    epoch: int
    seq: int
    segments: _containers.RepeatedCompositeFieldContainer[Segment]
    batch_size: int
    count: int
    def __init__(self, consumer: _Optional[int] = ..., epoch: _Optional[int] = ..., seq: _Optional[int] = ..., segments: _Optional[_Iterable[_Union[Segment, _Mapping]]] = ..., batch_size: _Optional[int] = ..., count: _Optional[int] = ...) -> None: ...

class ConfirmBatchReply(_message.Message):
    __slots__ = ("answers",)
    class Answer(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        CONFIRMED: _ClassVar[ConfirmBatchReply.Answer]
        LEASE_DONE: _ClassVar[ConfirmBatchReply.Answer]
        REFUSED: _ClassVar[ConfirmBatchReply.Answer]
    CONFIRMED: ConfirmBatchReply.Answer
    LEASE_DONE: ConfirmBatchReply.Answer
    REFUSED: ConfirmBatchReply.Answer
    ANSWERS_FIELD_NUMBER: _ClassVar[int]
    answers: _containers.RepeatedScalarFieldContainer[ConfirmBatchReply.Answer]
    def __init__(self, answers: _Optional[_Iterable[_Union[ConfirmBatchReply.Answer, str]]] = ...) -> None: ...

class CheckpointRequest(_message.Message):
    __slots__ = ("epoch", "batches")
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    BATCHES_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    batches: int
    def __init__(self, epoch: _Optional[int] = ..., batches: _Optional[int] = ...) -> None: ...

class CheckpointReply(_message.Message):
    __slots__ = ("snapshot_json", "name")
    SNAPSHOT_JSON_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    snapshot_json: str
    name: str
    def __init__(self, snapshot_json: _Optional[str] = ..., name: _Optional[str] = ...) -> None: ...

class DatasetRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class DatasetReply(_message.Message):
    __slots__ = ("manifest_json", "index", "url")
    MANIFEST_JSON_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    URL_FIELD_NUMBER: _ClassVar[int]
    manifest_json: bytes
    index: bytes
    url: str
    def __init__(self, manifest_json: _Optional[bytes] = ..., index: _Optional[bytes] = ..., url: _Optional[str] = ...) -> None: ...

class StatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class StatusReply(_message.Message):
    __slots__ = ("epoch", "world", "num_samples", "origin", "stream", "quota", "consumed", "live_consumers", "steals", "requeued")
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    WORLD_FIELD_NUMBER: _ClassVar[int]
    NUM_SAMPLES_FIELD_NUMBER: _ClassVar[int]
    ORIGIN_FIELD_NUMBER: _ClassVar[int]
    STREAM_FIELD_NUMBER: _ClassVar[int]
    QUOTA_FIELD_NUMBER: _ClassVar[int]
    CONSUMED_FIELD_NUMBER: _ClassVar[int]
    LIVE_CONSUMERS_FIELD_NUMBER: _ClassVar[int]
    STEALS_FIELD_NUMBER: _ClassVar[int]
    REQUEUED_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    world: int
    num_samples: int
    origin: str
    stream: str
    quota: int
    consumed: int
    live_consumers: int
    steals: int
    requeued: int
    def __init__(self, epoch: _Optional[int] = ..., world: _Optional[int] = ..., num_samples: _Optional[int] = ..., origin: _Optional[str] = ..., stream: _Optional[str] = ..., quota: _Optional[int] = ..., consumed: _Optional[int] = ..., live_consumers: _Optional[int] = ..., steals: _Optional[int] = ..., requeued: _Optional[int] = ...) -> None: ...

class Range(_message.Message):
    __slots__ = ("start", "end")
    START_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    start: int
    end: int
    def __init__(self, start: _Optional[int] = ..., end: _Optional[int] = ...) -> None: ...

class LocalRequest(_message.Message):
    __slots__ = ("consumer", "epoch", "ranges")
    CONSUMER_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    RANGES_FIELD_NUMBER: _ClassVar[int]
    consumer: int
    epoch: int
    ranges: _containers.RepeatedCompositeFieldContainer[Range]
    def __init__(self, consumer: _Optional[int] = ..., epoch: _Optional[int] = ..., ranges: _Optional[_Iterable[_Union[Range, _Mapping]]] = ...) -> None: ...

class LocalReply(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class Call(_message.Message):
    __slots__ = ("lease", "heartbeat", "confirm", "confirm_batch")
    LEASE_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_FIELD_NUMBER: _ClassVar[int]
    CONFIRM_FIELD_NUMBER: _ClassVar[int]
    CONFIRM_BATCH_FIELD_NUMBER: _ClassVar[int]
    lease: LeaseRequest
    heartbeat: HeartbeatRequest
    confirm: ConfirmRequest
    confirm_batch: ConfirmBatchRequest
    def __init__(self, lease: _Optional[_Union[LeaseRequest, _Mapping]] = ..., heartbeat: _Optional[_Union[HeartbeatRequest, _Mapping]] = ..., confirm: _Optional[_Union[ConfirmRequest, _Mapping]] = ..., confirm_batch: _Optional[_Union[ConfirmBatchRequest, _Mapping]] = ...) -> None: ...

class CallError(_message.Message):
    __slots__ = ("code", "message", "reason")
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    code: str
    message: str
    reason: str
    def __init__(self, code: _Optional[str] = ..., message: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class Result(_message.Message):
    __slots__ = ("lease", "heartbeat", "confirm", "confirm_batch", "error")
    LEASE_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_FIELD_NUMBER: _ClassVar[int]
    CONFIRM_FIELD_NUMBER: _ClassVar[int]
    CONFIRM_BATCH_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    lease: LeaseReply
    heartbeat: HeartbeatReply
    confirm: ConfirmReply
    confirm_batch: ConfirmBatchReply
    error: CallError
    def __init__(self, lease: _Optional[_Union[LeaseReply, _Mapping]] = ..., heartbeat: _Optional[_Union[HeartbeatReply, _Mapping]] = ..., confirm: _Optional[_Union[ConfirmReply, _Mapping]] = ..., confirm_batch: _Optional[_Union[ConfirmBatchReply, _Mapping]] = ..., error: _Optional[_Union[CallError, _Mapping]] = ...) -> None: ...

class BatchRequest(_message.Message):
    __slots__ = ("calls", "sender")
    CALLS_FIELD_NUMBER: _ClassVar[int]
    SENDER_FIELD_NUMBER: _ClassVar[int]
    calls: _containers.RepeatedCompositeFieldContainer[Call]
    sender: str
    def __init__(self, calls: _Optional[_Iterable[_Union[Call, _Mapping]]] = ..., sender: _Optional[str] = ...) -> None: ...

class BatchReply(_message.Message):
    __slots__ = ("results", "pace")
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    PACE_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[Result]
    pace: float
    def __init__(self, results: _Optional[_Iterable[_Union[Result, _Mapping]]] = ..., pace: _Optional[float] = ...) -> None: ...

class OfferRequest(_message.Message):
    __slots__ = ("address", "rows_per_second", "leaving")
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    ROWS_PER_SECOND_FIELD_NUMBER: _ClassVar[int]
    LEAVING_FIELD_NUMBER: _ClassVar[int]
    address: str
    rows_per_second: float
    leaving: bool
    def __init__(self, address: _Optional[str] = ..., rows_per_second: _Optional[float] = ..., leaving: _Optional[bool] = ...) -> None: ...

class OfferReply(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class PoolRequest(_message.Message):
    __slots__ = ("reader", "rows_per_second")
    READER_FIELD_NUMBER: _ClassVar[int]
    ROWS_PER_SECOND_FIELD_NUMBER: _ClassVar[int]
    reader: int
    rows_per_second: float
    def __init__(self, reader: _Optional[int] = ..., rows_per_second: _Optional[float] = ...) -> None: ...

class PoolReply(_message.Message):
    __slots__ = ("addresses",)
    ADDRESSES_FIELD_NUMBER: _ClassVar[int]
    addresses: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, addresses: _Optional[_Iterable[str]] = ...) -> None: ...
