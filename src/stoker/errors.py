"""stoker's exceptions.

Every error names what is at fault (URL, file, block, field) and, where there
is one, the fix. Each class also subclasses the matching built-in so callers
can catch either::

    StokerError
    ├── DatasetError (ValueError)           a dataset on storage is not usable
    │   ├── ManifestError                   missing, malformed or inconsistent manifest
    │   │   └── UnsupportedFormatError      format version this stoker cannot read
    │   └── ChecksumError                   a block's bytes do not match the manifest
    ├── StorageError (OSError)              the storage backend failed
    │   └── UnreachableError                the URL cannot be reached at all
    ├── StateError (ValueError)             a resume state does not fit this dataset
    ├── InputError (ValueError)             bad input to a writer or the CLI
    ├── ConfigError (ValueError)            bad arguments (seq_len too long, ...)
    ├── AgentError (RuntimeError)           the node agent could not start, or refused
    │   └── AgentRunningError               another agent owns the cache directory
    └── WorkerError (RuntimeError)          a loader worker failed, died or stopped answering
"""

from __future__ import annotations


class StokerError(Exception):
    """Base class of every error stoker raises on purpose."""


class DatasetError(StokerError, ValueError):
    """A dataset on storage is not usable."""


class ManifestError(DatasetError):
    """The manifest is missing, malformed or inconsistent."""


class UnsupportedFormatError(ManifestError):
    """The dataset was written in a format version this stoker cannot read."""


class ChecksumError(DatasetError):
    """A block's bytes do not match the checksum in the manifest."""

    def __init__(self, message: str, *, file: str = "", block: int = -1) -> None:
        super().__init__(message)
        self.file = file
        self.block = block


class StorageError(StokerError, OSError):
    """The storage backend failed (after retries)."""


class UnreachableError(StorageError):
    """The URL cannot be reached at all (no such host, connection refused)."""


class StateError(StokerError, ValueError):
    """A resume state does not fit this dataset or configuration."""


class InputError(StokerError, ValueError):
    """Bad input to a writer or to the command line."""


class ConfigError(StokerError, ValueError):
    """Bad arguments."""


class AgentError(StokerError, RuntimeError):
    """The node agent could not start, or refused a request."""


class AgentRunningError(AgentError):
    """Another agent already owns this cache directory."""


class WorkerError(StokerError, RuntimeError):
    """A loader worker process failed, died or stopped answering. The message names the
    worker (number and pid) and carries its traceback when it raised."""

    def __init__(self, message: str, *, worker: int = -1, pid: int | None = None) -> None:
        super().__init__(message)
        self.worker = worker
        self.pid = pid
