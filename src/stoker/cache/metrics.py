"""Deprecated: :mod:`stoker.observe.agent`; this name goes in 0.3."""

import sys

from stoker.observe import agent as _module

sys.modules[__name__] = _module  # the same module object
