"""stoker's exceptions.

Every error names what is at fault (URL, file, block, field) and, where there
is one, the fix. Each class also subclasses the matching built-in so callers
can catch either::

    StokerError
    ├── DatasetError (ValueError)           a dataset on storage is not usable
    │   ├── ManifestError                   missing, malformed or inconsistent manifest
    │   │   └── UnsupportedFormatError      format version this stoker cannot read
    │   ├── ChecksumError                   a block's bytes do not match the manifest
    │   └── ImageError                      an image of a records dataset does not decode
    ├── StorageError (OSError)              the storage backend failed
    │   └── UnreachableError                the URL cannot be reached at all
    ├── StateError (ValueError)             a resume state does not fit this dataset
    ├── InputError (ValueError)             bad input to a writer or the CLI
    ├── ConfigError (ValueError)            bad arguments (seq_len too long, ...)
    │   └── MissingBackendError             a URL's optional package is not installed
    ├── AgentError (RuntimeError)           the node agent could not start, or refused
    │   └── AgentRunningError               another agent owns the cache directory
    ├── ProtocolError (ConnectionError)     a peer sent something that is not a valid frame
    ├── CoordinatorRefused (RuntimeError)   the coordinator refused a request
    │   └── ConsumerExpired                 the consumer was silent past its timeout
    ├── CoordinatorUnavailable (ConnectionError)  the coordinator did not answer in time
    ├── WorkerError (RuntimeError)          a loader worker failed, died or stopped answering
    └── PreprocessError (RuntimeError)      a preprocessing worker refused or failed a request

Context travels as attributes: a :class:`StorageError` has the ``url`` and ``path`` of
the file and, for a range read, its ``start`` and ``stop``; a :class:`ChecksumError`
its ``file`` and ``block``; a :class:`WorkerError` its ``worker`` and ``pid``; a
:class:`CoordinatorRefused` the gRPC ``code`` and the coordinator's ``reason``
(``expired_consumer``, ``wrong_epoch``, ...; ``""`` when it gave none).

Between processes (a loader's worker pipes, the node agent's answers, a
preprocessing worker's errors) an error
travels as its kind: :func:`encode` gives ``(kind, message, fields)`` and
:func:`decode` makes the same class again, its message followed by where it came
from. Only the classes of this module are kinds (a subclass defined elsewhere
travels as the nearest of them it derives from), so a peer can never name
another class to be made; anything else is the caller's generic error.
"""

from __future__ import annotations

import operator
from typing import Any

#: A field's value on the way between processes.
Field = str | int | None


class StokerError(Exception):
    """Base class of every error stoker raises on purpose."""

    #: Attributes that travel with the error between processes (:func:`encode`).
    _fields: tuple[str, ...] = ()

    @classmethod
    def _rebuilt(cls, message: str, fields: dict[str, Any]) -> StokerError:
        """The error again, from :func:`encode`'s message and (checked) fields."""
        return cls(message, **fields)


class DatasetError(StokerError, ValueError):
    """A dataset on storage is not usable."""


class ManifestError(DatasetError):
    """The manifest is missing, malformed or inconsistent."""


class UnsupportedFormatError(ManifestError):
    """The dataset was written in a format version this stoker cannot read."""


class ChecksumError(DatasetError):
    """A block's bytes do not match the checksum in the manifest."""

    _fields = ("file", "block")

    def __init__(self, message: str, *, file: str = "", block: int = -1) -> None:
        super().__init__(message)
        self.file = file
        self.block = block


class ImageError(DatasetError):
    """An image in a records dataset cannot be decoded (or will not be: too large, a mode
    that is not converted to RGB)."""


class StorageError(StokerError, OSError):
    """The storage backend failed (after retries). ``url`` and ``path`` name the file
    (its URL, and its path under the dataset's root); ``start`` and ``stop`` are the
    byte range of a range read, None for any other call."""

    _fields = ("url", "path", "start", "stop")

    def __init__(
        self,
        message: str,
        *,
        url: str | None = None,
        path: str | None = None,
        start: int | None = None,
        stop: int | None = None,
    ) -> None:
        super().__init__(message)
        self.url = url
        self.path = path
        self.start = start
        self.stop = stop


class UnreachableError(StorageError):
    """The URL cannot be reached at all (no such host, connection refused)."""


class StateError(StokerError, ValueError):
    """A resume state does not fit this dataset or configuration."""


class InputError(StokerError, ValueError):
    """Bad input to a writer or to the command line."""


class ConfigError(StokerError, ValueError):
    """Bad arguments."""


class MissingBackendError(ConfigError):
    """A URL's fsspec backend is not installed (storage calls raise it at once: retrying
    cannot help). :mod:`stoker.extras` says which extra installs it."""


class AgentError(StokerError, RuntimeError):
    """The node agent could not start, or refused a request."""


class AgentRunningError(AgentError):
    """Another agent already owns this cache directory."""


class ProtocolError(StokerError, ConnectionError):
    """The peer sent something that is not a valid frame (:mod:`stoker.cache.wire`)."""


class CoordinatorRefused(StokerError, RuntimeError):
    """The coordinator refused a request: ``code`` is the gRPC status name, ``reason``
    the coordinator's own (``expired_consumer``, ``wrong_epoch``, ``unknown_lease``,
    ...; ``""`` for a refusal not of its lease table, such as a wrong token)."""

    _fields = ("code", "reason")

    def __init__(self, code: str, message: str, reason: str = "") -> None:
        super().__init__(f"{message} ({code})")
        self.code = code
        self.reason = reason

    @classmethod
    def _rebuilt(cls, message: str, fields: dict[str, Any]) -> StokerError:
        exc = cls(str(fields.get("code") or ""), "", str(fields.get("reason") or ""))
        exc.args = (message,)  # the message already ends with the code
        return exc


class ConsumerExpired(CoordinatorRefused):
    """The consumer was silent past the coordinator's timeout: its leases went back to
    the queue, and it must register again."""


#: Its name before 0.2 (kept for one release).
LeaseRejected = CoordinatorRefused


def refused(code: str, message: str, reason: str = "") -> CoordinatorRefused:
    """The error for a refusal with ``reason``: its own class where it has one."""
    cls = ConsumerExpired if reason == "expired_consumer" else CoordinatorRefused
    return cls(code, message, reason)


class CoordinatorUnavailable(StokerError, ConnectionError):
    """The coordinator did not answer within the retry window."""


class WorkerError(StokerError, RuntimeError):
    """A loader worker process failed, died or stopped answering. The message names the
    worker (number and pid) and carries its traceback when it raised."""

    _fields = ("worker", "pid")

    def __init__(self, message: str, *, worker: int = -1, pid: int | None = None) -> None:
        super().__init__(message)
        self.worker = worker
        self.pid = pid


class PreprocessError(StokerError, RuntimeError):
    """A preprocessing worker refused a request or failed to make its rows for a reason
    other than the rows' own (which come as their own error, naming row and file)."""


# -- kinds: errors between processes ---------------------------------------------------

#: Every class of this module by name: the only kinds :func:`decode` makes.
KINDS: dict[str, type[StokerError]] = {
    name: value
    for name, value in list(globals().items())
    if isinstance(value, type) and issubclass(value, StokerError) and value.__module__ == __name__
}


def _plain(value: object) -> tuple[bool, Field]:
    """(True, the value) for a string, an integer (numpy's too, not a bool) or None."""
    if value is None:
        return True, None
    if isinstance(value, str):
        return True, str(value)
    if isinstance(value, bool) or not hasattr(type(value), "__index__"):
        return False, None
    return True, operator.index(value)  # type: ignore[arg-type]


def encode(exc: BaseException) -> tuple[str, str, dict[str, Field]]:
    """``(kind, message, fields)`` of an error, to send to another process.

    ``kind`` is the name of the error's class, or of the nearest class of this module
    it derives from; ``""`` for anything that is not a :class:`StokerError`, whose
    message then begins with its type's name. ``fields`` are the class's context
    attributes that are strings, integers or None."""
    if not isinstance(exc, StokerError):
        return "", f"{type(exc).__name__}: {exc}", {}
    cls = next(KINDS[c.__name__] for c in type(exc).__mro__ if KINDS.get(c.__name__) is c)
    fields: dict[str, Field] = {}
    for name in cls._fields:
        ok, value = _plain(getattr(exc, name, None))
        if ok:
            fields[name] = value
    return cls.__name__, str(exc), fields


def decode(
    kind: str, message: str, where: str = "", fields: dict[str, Any] | None = None
) -> StokerError | None:
    """The error :func:`encode` described, its message followed by ``(where)`` when
    given; None when ``kind`` is not a class of this module (the caller raises its own
    generic error then). Only the class's own fields are kept, and only plain values."""
    cls = KINDS.get(kind) if isinstance(kind, str) else None
    if cls is None:
        return None
    kept: dict[str, Field] = {}
    for name, value in (fields or {}).items():
        ok, plain = _plain(value)
        if ok and name in cls._fields:
            kept[name] = plain
    text = f"{message} ({where})" if where else message
    return cls._rebuilt(text, kept)
