"""Deprecated: :mod:`stoker.cli.coordinator`; this name goes in 0.3."""

import sys

from stoker.cli import coordinator as _module

sys.modules[__name__] = _module  # the same module object
