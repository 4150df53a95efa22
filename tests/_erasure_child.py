"""The process a kill -9 test stops in the middle of an erasure (tests/store/test_erasure_files.py).

Run as `python -m tests._erasure_child URL TENANT SUBJECT KEK_HEX`. It erases
SUBJECT, and just before the statement that destroys the key, with every
`conversation.erased` event and the erased marks written but nothing
committed, prints `deleting` and blocks reading stdin: the test kills it
there, so the kill lands inside the erasure's transaction, by construction.
"""

from __future__ import annotations

import sys

import sqlalchemy as sa

from chatledger.store import Store


def main() -> None:
    url, tenant, subject, kek = sys.argv[1:5]
    with Store.open(url, kek=bytes.fromhex(kek), fast_paths=False) as store:

        @sa.event.listens_for(store.engine, "before_cursor_execute")
        def pause(conn: object, cursor: object, statement: str, *args: object) -> None:
            if statement.lstrip().upper().startswith("DELETE FROM CHATLEDGER_SUBJECT_KEYS"):
                print("deleting", flush=True)
                sys.stdin.readline()  # the test kills this process here

        store.tenant(tenant).erase(subject, reason="killed halfway")
        print("done", flush=True)


if __name__ == "__main__":
    main()
