"""The lease table's value types (pure): leases, consumers, events, grants, settings.

A room of their own, so the rules that read them (:mod:`stoker.coordinator.stealing`,
:mod:`stoker.coordinator.locality`) and the table that owns them
(:mod:`stoker.coordinator.leases`) import them without importing each other.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


class LeaseError(Exception):
    """A request the table refuses; ``code`` says why (the service maps it to a gRPC status)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass
class Lease:
    id: int
    consumer: int
    rank: int
    start: int
    end: int
    horizon: int
    read: int
    confirmed: int

    @property
    def unread_beyond_horizon(self) -> int:
        return self.end - max(self.horizon, self.read)


@dataclass
class Consumer:
    id: int
    rank: int
    worker: int
    last_seen: float
    node: str = ""  # its machine: consumers of one node share its cache
    rate: float = 0.0  # positions consumed per second since it registered, 0 = unknown
    since: float = 0.0  # when it registered
    read_total: int = 0  # positions of its leases confirmed
    alive: bool = True
    leases: list[int] = field(default_factory=list)


@dataclass(frozen=True)
class Event:
    """One change to the table, with every input it needs (``now`` included)."""

    kind: str  # register | request | heartbeat | confirm | expire
    now: float
    args: dict[str, Any]

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "now": self.now, "args": self.args}

    @staticmethod
    def from_json(obj: dict[str, Any]) -> Event:
        return Event(str(obj["kind"]), float(obj["now"]), dict(obj["args"]))


@dataclass(frozen=True)
class Grant:
    lease: int
    start: int
    end: int
    horizon: int
    stolen_from: int | None = None  # the consumer whose lease was split


#: What :meth:`LeaseTable.request` answers when nothing can be granted right now but the
#: rank still has positions to come (they are in other consumers' leases): ask again.
WAIT = Grant(0, 0, 0, 0)


@dataclass
class Config:
    lease_size: int = 4096  # positions per fresh lease
    timeout: float = 30.0  # seconds of silence before a consumer's leases are requeued
    readahead_seconds: float = 5.0  # horizon = read + rate * this
    min_readahead: int = 64  # positions a consumer may always read ahead
    min_steal: int = 2  # do not split leases with fewer stealable positions
    locality: bool = True  # grant a node the positions its cache holds first
