"""stoker: keeps the GPUs of a large training job fed.

Public API; everything else is internal and may change.
"""

from stoker.cache import BlockCache, DiskCache, NullCache
from stoker.device import DevicePrefetcher
from stoker.errors import (
    AgentError,
    AgentRunningError,
    ChecksumError,
    ConfigError,
    DatasetError,
    InputError,
    ManifestError,
    StateError,
    StokerError,
    StorageError,
    UnreachableError,
    UnsupportedFormatError,
)
from stoker.formats.token_writer import TokenWriter, WriteOptions, write_tokens
from stoker.formats.tokens import TokenSource
from stoker.loader.dataset import TokenDataset
from stoker.loader.fast import TokenLoader, WorkerError
from stoker.loader.masks import cu_seqlens, doc_starts
from stoker.manifest import Manifest
from stoker.metered import Metered
from stoker.storage import RetryPolicy, Storage

__version__ = "0.1.0"


def __getattr__(name: str) -> object:
    # the agent's and the coordinator's clients pull in protobuf / grpc: import them only
    # when asked for, so that `import stoker` stays quick
    if name == "AgentClient":
        from stoker.cache.client import AgentClient

        return AgentClient
    if name in ("CoordinatorClient", "LeaseRejected", "CoordinatorUnavailable"):
        from stoker.coordinator import client

        return getattr(client, name)
    if name == "LeaseConfig":
        from stoker.coordinator.leases import Config

        return Config
    raise AttributeError(f"module 'stoker' has no attribute {name!r}")


__all__ = [
    "AgentClient",
    "AgentError",
    "AgentRunningError",
    "BlockCache",
    "ChecksumError",
    "ConfigError",
    "CoordinatorClient",
    "CoordinatorUnavailable",
    "DatasetError",
    "DevicePrefetcher",
    "DiskCache",
    "InputError",
    "LeaseConfig",
    "LeaseRejected",
    "Manifest",
    "ManifestError",
    "Metered",
    "NullCache",
    "RetryPolicy",
    "StateError",
    "StokerError",
    "Storage",
    "StorageError",
    "TokenDataset",
    "TokenLoader",
    "TokenSource",
    "TokenWriter",
    "UnreachableError",
    "UnsupportedFormatError",
    "WorkerError",
    "WriteOptions",
    "__version__",
    "cu_seqlens",
    "doc_starts",
    "write_tokens",
]
