"""Where batches go and how narrow tokens cross: :func:`resolve_device` (a CUDA device
asked for without CUDA: a warning, or with ``STOKER_STRICT_DEVICE=1`` an error) and
:func:`narrow_dtype` (the transfer dtype a vocabulary fits)."""

from __future__ import annotations

import warnings

import torch

from stoker import env
from stoker.errors import ConfigError

#: Set to 1 to make a CUDA device asked for on a machine without CUDA an error.
STRICT_ENV = "STOKER_STRICT_DEVICE"
_warned_devices: set[str] = set()  # CUDA devices asked for without CUDA, warned about once


def _strict_from_env() -> bool:
    raw = (env.get(STRICT_ENV) or "").strip().lower()
    if raw in ("", "0", "false", "no"):
        return False
    if raw in ("1", "true", "yes"):
        return True
    raise ConfigError(f"environment variable {STRICT_ENV}={raw!r} must be 1 or 0")


def resolve_device(device: torch.device | str | None, strict: bool | None = None) -> torch.device:
    """The device batches go to: ``device``, or CUDA when present and none is given.

    A CUDA device asked for on a machine without CUDA leaves batches on the CPU
    (the same script runs on a laptop) with one ``RuntimeWarning`` per device and
    process; with ``strict`` (default: the ``STOKER_STRICT_DEVICE`` environment
    variable, ``1`` or ``0``) it is a :class:`~stoker.errors.ConfigError` instead.
    """
    cuda = torch.cuda.is_available()
    dev = torch.device(device if device is not None else ("cuda" if cuda else "cpu"))
    if dev.type == "cuda" and not cuda:
        if _strict_from_env() if strict is None else strict:
            raise ConfigError(
                f"device {str(dev)!r} was asked for but CUDA is not available "
                f"(torch {torch.__version__}, CUDA build: {torch.version.cuda or 'no'}); "
                'install a CUDA build of torch, or pass device="cpu"'
            )
        if str(dev) not in _warned_devices:
            _warned_devices.add(str(dev))
            warnings.warn(
                f"device {str(dev)!r} was asked for but CUDA is not available: batches stay "
                f"on the CPU (set {STRICT_ENV}=1 to make this an error)",
                RuntimeWarning,
                stacklevel=3,
            )
        return torch.device("cpu")
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    if dev.type not in ("cuda", "cpu"):
        raise ConfigError(f"device must be a CUDA device or cpu, got {dev}")
    return dev


def narrow_dtype(vocab_size: int) -> torch.dtype | None:
    """The narrowest dtype holding token ids ``[0, vocab_size)``; None if int64 is needed."""
    if vocab_size <= 1 << 8:
        return torch.uint8
    if vocab_size <= 1 << 16:
        return torch.uint16
    if vocab_size <= 1 << 31:
        return torch.int32
    return None
