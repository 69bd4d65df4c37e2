"""Deprecated: :mod:`stoker.observe.nvml`; this name goes in 0.3."""

import sys

from stoker.observe import nvml as _module

sys.modules[__name__] = _module  # the same module object: its state, its patches
