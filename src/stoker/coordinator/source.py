"""Deprecated: :mod:`stoker.coordinator.consumer`; this name goes in 0.3."""

from stoker.coordinator.consumer import LeaseStream as LeaseStream

__all__ = ["LeaseStream"]
