"""The `chatledger` command's entry point: the console script and `python -m chatledger`.

The command itself is the private package `engine._cli`.
"""

import sys

from chatledger.engine._cli import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())
