"""``python -m stoker.cli ...`` (how stoker starts its own services)."""

import sys

from stoker.cli import main

if __name__ == "__main__":
    sys.exit(main())
