"""stoker: keeps the GPUs of a large training job fed.

Public API; everything else is internal and may change.
"""

from typing import TYPE_CHECKING

from stoker.cache import BlockCache, DiskCache, NullCache
from stoker.cache.config import AgentConfig
from stoker.coordinator.model import Config as LeaseConfig
from stoker.errors import (
    AgentError,
    AgentRunningError,
    ChecksumError,
    ConfigError,
    ConsumerExpired,
    CoordinatorRefused,
    CoordinatorUnavailable,
    DatasetError,
    InputError,
    LeaseRejected,
    ManifestError,
    StateError,
    StokerError,
    StorageError,
    UnreachableError,
    UnsupportedFormatError,
    WorkerError,
)
from stoker.formats.token_writer import TokenWriter, WriteOptions, write_tokens
from stoker.formats.tokens import TokenSource
from stoker.manifest import Manifest
from stoker.observe.metered import Metered
from stoker.plan import ShuffleConfig
from stoker.storage import RetryPolicy, Storage

if TYPE_CHECKING:
    from stoker.cache.client import AgentClient
    from stoker.coordinator.client import CoordinatorClient
    from stoker.device import DevicePrefetcher
    from stoker.loader.dataset import TokenDataset
    from stoker.loader.loader import TokenLoader
    from stoker.loader.masks import cu_seqlens, doc_starts

#: Names imported when first asked for: torch (the loader, the device tier) takes seconds
#: to import, and the agent's and coordinator's processes (and clients) need none of it;
#: gRPC and protobuf likewise stay out of `import stoker`.
_LAZY = {
    "AgentClient": "stoker.cache.client",
    "CoordinatorClient": "stoker.coordinator.client",
    "DevicePrefetcher": "stoker.device",
    "TokenDataset": "stoker.loader.dataset",
    "TokenLoader": "stoker.loader.loader",
    "cu_seqlens": "stoker.loader.masks",
    "doc_starts": "stoker.loader.masks",
}

__version__ = "0.1.0"


def __getattr__(name: str) -> object:
    import importlib

    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value  # asked once
        return value
    raise AttributeError(f"module 'stoker' has no attribute {name!r}")


__all__ = [
    "AgentClient",
    "AgentConfig",
    "AgentError",
    "AgentRunningError",
    "BlockCache",
    "ChecksumError",
    "ConfigError",
    "ConsumerExpired",
    "CoordinatorClient",
    "CoordinatorRefused",
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
    "ShuffleConfig",
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
