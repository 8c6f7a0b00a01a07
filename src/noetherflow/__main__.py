"""``python -m noetherflow``: the same command line as the ``noetherflow`` console script."""

import sys

from noetherflow.cli import main

if __name__ == "__main__":
    sys.exit(main())
