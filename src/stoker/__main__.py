"""``python -m stoker ...``: the ``stoker`` command."""

import sys

from stoker.cli import main

if __name__ == "__main__":
    sys.exit(main())
