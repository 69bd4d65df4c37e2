"""Optional dependencies: which extra of the package installs what, and the error naming it.

The core package (``pip install stoker``) reads local paths and plain http(s)
URLs, runs the node agent, the coordinator, ``doctor`` and ``top``. The rest is
imported only where it is first used:

    stoker[s3]       s3fs (s3:// URLs; brings aiobotocore and aiohttp)
    stoker[http]     aiohttp (fsspec's HTTP filesystem: http(s) with storage_options,
                     build-tokens inputs over http)
    stoker[build]    tokenizers, tqdm (build-tokens, inspect's decoded sample, the demo)
    stoker[parquet]  pyarrow (.parquet inputs of build-tokens)
    stoker[all]      all of the above
"""

from __future__ import annotations

import importlib
from types import ModuleType

from stoker.errors import ConfigError, StokerError
from stoker.errors import MissingBackendError as MissingBackendError  # imported from here too

#: The extra whose packages an fsspec protocol needs.
PROTOCOL_EXTRAS = {"s3": "s3", "s3a": "s3", "http": "http", "https": "http"}


def install_hint(extra: str) -> str:
    return f"pip install 'stoker[{extra}]'"


def backend_error(protocol: str, url: str, exc: ImportError) -> MissingBackendError:
    """The error for a URL whose fsspec filesystem cannot be imported."""
    extra = PROTOCOL_EXTRAS.get(protocol)
    fix = install_hint(extra) if extra else "install the fsspec backend for it"
    return MissingBackendError(
        f"{url}: reading {protocol}:// URLs needs a package that is not installed ({exc}); {fix}"
    )


def require(
    module: str, extra: str, what: str, error: type[StokerError] = ConfigError
) -> ModuleType:
    """``import module``, or ``error`` saying that ``what`` needs ``stoker[extra]``."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise error(
            f"{what} needs the {module.split('.')[0]} package, which is not installed "
            f"({exc}); {install_hint(extra)}"
        ) from exc
