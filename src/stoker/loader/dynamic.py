"""Deprecated: :mod:`stoker.loader.coordinated` and :mod:`stoker.coordinator.consumer`;
this name goes in 0.3."""

from stoker.coordinator.consumer import CONFIRM_BYTES as CONFIRM_BYTES
from stoker.coordinator.consumer import CONFIRM_WINDOW as CONFIRM_WINDOW
from stoker.coordinator.consumer import confirm_window as confirm_window
from stoker.loader.coordinated import CoordinatedEpoch as CoordinatedEpoch
from stoker.loader.coordinated import DynamicEpoch as DynamicEpoch

__all__ = ["CONFIRM_BYTES", "CONFIRM_WINDOW", "CoordinatedEpoch", "DynamicEpoch", "confirm_window"]
