"""``python -m loadgen``: the command line."""

import sys

from loadgen.cli import main

if __name__ == "__main__":
    sys.exit(main())
