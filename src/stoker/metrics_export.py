"""Deprecated: :mod:`stoker.observe.export`; this name goes in 0.3."""

import sys

from stoker.observe import export as _module

sys.modules[__name__] = _module  # the same module object: its state, its patches
