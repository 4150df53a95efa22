"""`python -m chatledger`: the `chatledger` command."""

import sys

from chatledger.engine._cli import main

sys.exit(main())
