"""`chatledger tail`: a tenant's events (or one conversation's) in commit order, as they commit.

```
chatledger tail [--after CURSOR] [--conversation ID] [--follow] [--json] [--limit N]
```

It prints `Ledger.tail`'s pages, one event a line: a table row under one
header, or with `--json` the event as `chatledger audit events --json` shows
it, plus `"after"`, the cursor after the whole page the event came in
(`Page.next_after`), and `"last"`, true on the page's last line. The cursor
belongs to the page, not to the event: the lines of a page come together
and carry the same `after`, so a program stores it once it has handled the
line marked `last` and passes it back as `--after` to resume right after
that page (docs/tail.md). Without `--follow`, events held back behind a
transaction still open on the server are named on stderr. stdout is flushed after each
page. Without `--follow` the command exits 0 once caught up; with it, it
waits for new commits until interrupted (Ctrl-C: exit status 130, as for
every command).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from chatledger.engine._cli._audit import EVENT_EXCLUDE, event_row
from chatledger.engine._cli._common import open_store, print_json
from chatledger.store import Event, Page
from chatledger.store._json import to_json

# Fixed widths: a followed tail prints rows long before it has seen them all.
_WIDTHS = {
    "seq": 6,
    "kind": 20,
    "origin": 6,
    "conversation": 36,
    "run": 36,
    "pos": 4,
    "recorded": 32,
    "what": 0,
}


def tail(args: argparse.Namespace) -> int:
    printed = False
    with open_store(args) as store:
        pages = store.tenant(args.tenant).tail(
            args.after,
            conversation_id=args.conversation,
            follow=args.follow,
            limit=args.limit,
        )
        held_back = False
        for page in pages:
            held_back = page.pending
            out = to_json(page, Page[Event], exclude={"items": {"__all__": EVENT_EXCLUDE}})
            last = len(out["items"]) - 1
            for i, item in enumerate(out["items"]):
                if args.json:
                    print_json({**item, "after": out["nextAfter"], "last": i == last})
                else:
                    if not printed:
                        print(_line({c: c.upper() for c in _WIDTHS}))
                    print(_line(event_row(item)))
                printed = True
            sys.stdout.flush()
    if not printed and not args.json:
        print("No events.")
    if held_back:
        print(
            "chatledger: newer events are committed but held back behind a transaction still "
            "open on the server; run again later (or with --follow) to get them",
            file=sys.stderr,
        )
    return 0


def _line(row: dict[str, Any]) -> str:
    cells = ("" if row[c] is None else str(row[c]) for c in _WIDTHS)
    return "  ".join(v.ljust(w) for v, w in zip(cells, _WIDTHS.values(), strict=True)).rstrip()
