"""stoker: keeps the GPUs of a large training job fed.

Public API; everything else is internal and may change.
"""

from typing import TYPE_CHECKING

from stoker.errors import (
    AgentError,
    AgentRunningError,
    ChecksumError,
    ConfigError,
    ConsumerExpired,
    CoordinatorRefused,
    CoordinatorUnavailable,
    DatasetError,
    ImageError,
    InputError,
    LeaseRejected,
    ManifestError,
    PreprocessError,
    StateError,
    StokerError,
    StorageError,
    UnreachableError,
    UnsupportedFormatError,
    WorkerError,
)

if TYPE_CHECKING:
    from stoker.cache import BlockCache, DiskCache, NullCache
    from stoker.cache.client import AgentClient
    from stoker.cache.config import AgentConfig
    from stoker.converters import convert
    from stoker.coordinator.client import CoordinatorClient
    from stoker.coordinator.model import Config as LeaseConfig
    from stoker.device import DevicePrefetcher
    from stoker.formats.records import RecordSource, RecordWriter, write_records
    from stoker.formats.token_writer import TokenWriter, WriteOptions, write_tokens
    from stoker.formats.tokens import TokenSource
    from stoker.formats.verify import verify
    from stoker.loader.dataset import TokenDataset
    from stoker.loader.loader import TokenLoader
    from stoker.loader.masks import cu_seqlens, doc_starts
    from stoker.manifest import Manifest
    from stoker.mixture.dataset import Mixture
    from stoker.mixture.schedule import WeightSchedule
    from stoker.observe.metered import Metered
    from stoker.plan import ShuffleConfig
    from stoker.record_manifest import RecordManifest
    from stoker.records.build import build_records
    from stoker.records.dataset import RecordDataset
    from stoker.storage import RetryPolicy, Storage
    from stoker.tokenizing import build_tokens

#: Names imported when first asked for (name -> module, or module and the name there):
#: torch (the loader, the device tier) takes seconds to import, numpy and the storage
#: layer a tenth of one, and a process that needs little of the package (the node agent
#: starting beside a reader, the coordinator, a client) pays only for what it uses;
#: gRPC and protobuf likewise stay out of `import stoker`.
_LAZY = {
    "AgentClient": "stoker.cache.client",
    "AgentConfig": "stoker.cache.config",
    "BlockCache": "stoker.cache",
    "CoordinatorClient": "stoker.coordinator.client",
    "DevicePrefetcher": "stoker.device",
    "DiskCache": "stoker.cache",
    "LeaseConfig": ("stoker.coordinator.model", "Config"),
    "Manifest": "stoker.manifest",
    "Metered": "stoker.observe.metered",
    "Mixture": "stoker.mixture.dataset",
    "NullCache": "stoker.cache",
    "RecordDataset": "stoker.records.dataset",
    "RecordManifest": "stoker.record_manifest",
    "RecordSource": "stoker.formats.records",
    "RecordWriter": "stoker.formats.records",
    "RetryPolicy": "stoker.storage",
    "ShuffleConfig": "stoker.plan",
    "Storage": "stoker.storage",
    "TokenDataset": "stoker.loader.dataset",
    "TokenLoader": "stoker.loader.loader",
    "TokenSource": "stoker.formats.tokens",
    "TokenWriter": "stoker.formats.token_writer",
    "WeightSchedule": "stoker.mixture.schedule",
    "WriteOptions": "stoker.formats.token_writer",
    "build_records": "stoker.records.build",
    "build_tokens": "stoker.tokenizing",
    "convert": "stoker.converters",
    "verify": "stoker.formats.verify",
    "cu_seqlens": "stoker.loader.masks",
    "doc_starts": "stoker.loader.masks",
    "write_records": "stoker.formats.records",
    "write_tokens": "stoker.formats.token_writer",
}

__version__ = "0.1.0"


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


def __getattr__(name: str) -> object:
    import importlib

    if name in _LAZY:
        where = _LAZY[name]
        module, attr = where if isinstance(where, tuple) else (where, name)
        value = getattr(importlib.import_module(module), attr)
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
    "ImageError",
    "InputError",
    "LeaseConfig",
    "LeaseRejected",
    "Manifest",
    "ManifestError",
    "Metered",
    "Mixture",
    "NullCache",
    "PreprocessError",
    "RecordDataset",
    "RecordManifest",
    "RecordSource",
    "RecordWriter",
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
    "WeightSchedule",
    "WorkerError",
    "WriteOptions",
    "__version__",
    "build_records",
    "build_tokens",
    "convert",
    "cu_seqlens",
    "doc_starts",
    "verify",
    "write_records",
    "write_tokens",
]
