"""``python -m gantry.client.cli``: the same as the ``gantry`` console script."""

import sys

from gantry.client.cli import main

if __name__ == "__main__":
    sys.exit(main())
