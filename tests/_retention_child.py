"""The process a kill -9 test stops in the middle of a retention pass (tests/store/test_retention.py).

Run as `python -m tests._retention_child URL TENANT EXPORT_DIR NOW KEK_HEX`. It runs
the tenant's retention pass as of NOW (ISO 8601) and, when the pass reaches
its second erasure, just before the statement that destroys that subject's
key (its export written, the first subject erased and committed), prints
`deleting` and blocks reading stdin: the test kills it there.
"""

from __future__ import annotations

import sys
from datetime import datetime

import sqlalchemy as sa

from chatledger.store import Store


def main() -> None:
    url, tenant, export_dir, now, kek = sys.argv[1:6]
    seen = 0
    with Store.open(url, kek=bytes.fromhex(kek), fast_paths=False) as store:

        @sa.event.listens_for(store.engine, "before_cursor_execute")
        def pause(conn: object, cursor: object, statement: str, *args: object) -> None:
            nonlocal seen
            if statement.lstrip().upper().startswith("DELETE FROM CHATLEDGER_SUBJECT_KEYS"):
                seen += 1
                if seen == 2:
                    print("deleting", flush=True)
                    sys.stdin.readline()  # the test kills this process here

        store.run_retention(tenant=tenant, export_dir=export_dir, now=datetime.fromisoformat(now))
        print("done", flush=True)


if __name__ == "__main__":
    main()
