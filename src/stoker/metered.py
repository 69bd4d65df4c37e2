"""Deprecated: :mod:`stoker.observe.metered`; this name goes in 0.3."""

import sys

from stoker.observe import metered as _module

sys.modules[__name__] = _module  # the same module object: its state, its patches
