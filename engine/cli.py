"""The `chatledger` command."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from store import __version__


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; return the exit status."""
    parser = argparse.ArgumentParser(
        prog="chatledger", description="An event-sourced conversation store for LLM agents."
    )
    parser.add_argument("--version", action="version", version=f"chatledger {__version__}")
    parser.parse_args(argv)
    parser.print_help()
    return 0


if __name__ == "__main__":
    sys.exit(main())
