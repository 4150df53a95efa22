"""`chatledger audit ...`: the audit queries on the command line.

```
chatledger audit timeline RUN                    every event of a run, with stage and timing
chatledger audit request RUN N [--agent M:A]     what the model saw in request N (and its digest check)
chatledger audit tools [--tool NAME] [--status uncertain] [--since ISO --until ISO]
chatledger audit messages [--origin client|repair] [--conversation ID]
chatledger audit lineage CONVERSATION            branches, forks in and out, resumes
chatledger audit events [--run ID] [--kind K ...] [--failed] ...
```

Lists are pages: `--limit` (default 100), `--after CURSOR` to read on (the
command prints the cursor), `--all` to follow every page. Output is a table,
or JSON with `--json`. Errors are one line, as for every command. The options
are declared with the other commands' in `engine._cli`; this module is
imported when an `audit` command runs.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any, TypeVar

from chatledger.engine._cli._common import (
    UsageError,
    load_agent,
    message_line,
    open_store,
    parse_time,
    print_json,
    print_table,
)
from chatledger.store import (
    Audit,
    Event,
    Ledger,
    Lineage,
    Page,
    RecordedRequest,
    TimelineEntry,
    ToolExecution,
)
from chatledger.store._json import to_json
from chatledger.store.messages import load_message

T = TypeVar("T")

# The event listings (and `chatledger tail`'s lines) have always left out the
# idempotency key and the chain hash (`chatledger verify` answers for the chain).
EVENT_EXCLUDE = {"idempotency_key", "hash"}


def timeline(args: argparse.Namespace) -> int:
    page = _pages(
        args,
        lambda a, after: a.run_timeline(args.run, kinds=args.kind, after=after, limit=args.limit),
    )
    out = to_json(
        page, Page[TimelineEntry], exclude={"items": {"__all__": {"event": EVENT_EXCLUDE}}}
    )
    # A timeline row is the event's own keys, then its stage and time since the run started.
    out["items"] = [
        {**t["event"], "stage": t["stage"], "elapsedSeconds": t["elapsed"]} for t in out["items"]
    ]
    return _print_page(args, out, _TIMELINE_COLUMNS, "No events.")


def request(args: argparse.Namespace) -> int:
    instructions = args.instructions
    if args.instructions_file is not None:
        try:
            instructions = args.instructions_file.read_text(encoding="utf-8")
        except OSError as error:
            raise UsageError(f"Cannot read --instructions-file: {error}.") from error
    out: dict[str, Any]
    with open_store(args) as store:
        ledger = store.tenant(args.tenant)
        if args.agent is None and instructions is None:
            _refuse_without_instructions(ledger, args.run)
        if args.agent is None:
            recorded = ledger.audit.model_request(
                args.run, args.number, instructions=instructions or ""
            )
            out = to_json(recorded, RecordedRequest)
        else:
            from chatledger.engine.audit import rebuild_request

            agent = load_agent(args.agent)
            check = rebuild_request(ledger, args.run, args.number, agent, instructions=instructions)
            recorded = check.recorded
            out = to_json(recorded, RecordedRequest) | {
                "rebuiltDigest": check.prepared.digest,
                "matches": check.matches,
                "stream": check.prepared.stream,
                "body": check.body.decode("utf-8"),
            }
    if args.json:
        print_json(out)
    else:
        for message in recorded.messages:
            print(message_line(message, cut=100))
        print(f"recorded digest: {recorded.digest}")
        if "matches" in out:
            verdict = "matches" if out["matches"] else "DOES NOT MATCH"
            print(f"rebuilt digest:  {out['rebuiltDigest']} ({verdict})")
            if args.body:
                print(out["body"])
    return 1 if out.get("matches") is False else 0


def _refuse_without_instructions(ledger: Ledger, run_id: str) -> None:
    """A run that recorded the digest of its instructions can be rebuilt only with them:
    say so, rather than let the check compare the digest of no instructions."""
    from chatledger.store.history import instructions_digest

    started = ledger.events(run_id=run_id, limit=1)
    recorded = started[0].payload.get("instructionsDigest") if started else None
    if recorded is not None and recorded != instructions_digest(""):
        raise UsageError(
            f"Run '{run_id}' was given instructions, and the log keeps only their sha256: pass "
            f"--agent module:attribute (the run's agent, which resolves them) or "
            f"--instructions / --instructions-file (the text it resolved) to rebuild the request."
        )


def tools(args: argparse.Namespace) -> int:
    page = _listing(args, Audit.tool_executions, tool_name=args.tool, status=args.status)
    out = to_json(page, Page[ToolExecution])
    return _print_page(args, out, _TOOL_COLUMNS, "No tool executions.")


def messages(args: argparse.Namespace) -> int:
    page = _listing(args, Audit.supplied_and_repaired, origin=args.origin)
    out = to_json(page, Page[Event], exclude={"items": {"__all__": EVENT_EXCLUDE}})
    return _print_page(args, out, _MESSAGE_COLUMNS, "No client or repair messages.")


def lineage(args: argparse.Namespace) -> int:
    with open_store(args) as store:
        tree = store.tenant(args.tenant).audit.lineage(args.conversation)
    full = to_json(tree, Lineage)
    conversation = full["conversation"]
    # The lineage names conversations, it does not list them: this one by its
    # id, head and fork point, each fork out by its id and fork point.
    out = {
        "conversation": conversation["id"],
        "head": conversation["head"],
        "forkedFrom": conversation["forkedFrom"],
        "branches": full["branches"],
        "forks": [{"id": f["id"], "forkedFrom": f["forkedFrom"]} for f in full["forks"]],
        "resumes": full["resumes"],
    }
    if args.json:
        print_json(out)
        return 0
    fork = out["forkedFrom"]
    came = (
        f" (forked from {fork['conversationId']} at {fork['branchId']}:{fork['position']})"
        if fork
        else ""
    )
    print(f"Conversation {tree.conversation.id}{came}")
    print()
    print_table(
        [
            {
                "branch": b["id"],
                "reason": b["reason"],
                "parent": f"{b['parent']['branchId']}:{b['parent']['position']}"
                if b["parent"]
                else "",
                "positions": f"{b['firstPosition']}-{b['tip']}",
                "run": b["runId"],
                "resumes": b["resumesRunId"],
                "head": "head" if b["holdsHead"] else "",
            }
            for b in out["branches"]
        ],
        ["branch", "reason", "parent", "positions", "run", "resumes", "head"],
        empty="No branches.",
    )
    for f in out["forks"]:
        at = f["forkedFrom"]
        print(f"fork out: {f['id']} at {at['branchId']}:{at['position']}")
    for r in out["resumes"]:
        print(f"resume: run {r['runId']} resumes {r['resumes']} ({r['status']})")
    return 0


def events(args: argparse.Namespace) -> int:
    failed = True if args.failed else False if args.not_failed else None
    page = _listing(
        args,
        Audit.events,
        kinds=args.kind,
        tool_name=args.tool,
        origin=args.origin,
        failed=failed,
    )
    out = to_json(page, Page[Event], exclude={"items": {"__all__": EVENT_EXCLUDE}})
    return _print_page(args, out, _EVENT_COLUMNS, "No events.")


# -- plumbing ---------------------------------------------------------------------------


def _window(args: argparse.Namespace) -> tuple[datetime | None, datetime | None]:
    """`--since` and `--until`, parsed."""
    return (
        None if args.since is None else parse_time(args.since, "--since"),
        None if args.until is None else parse_time(args.until, "--until"),
    )


def _listing(args: argparse.Namespace, read: Callable[..., Page[T]], **filters: Any) -> Page[T]:
    """The page(s) of an audit listing narrowed by `--conversation`, `--run`,
    `--since`, `--until` and `filters`."""
    since, until = _window(args)
    return _pages(
        args,
        lambda a, after: read(
            a,
            conversation_id=args.conversation,
            run_id=args.run,
            since=since,
            until=until,
            after=after,
            limit=args.limit,
            **filters,
        ),
    )


def _pages(args: argparse.Namespace, read: Callable[[Audit, str | None], Page[T]]) -> Page[T]:
    """One page, or with --all every page that is ready, as one."""
    with open_store(args) as store:
        audit = store.tenant(args.tenant).audit
        page = read(audit, args.after)
        items = list(page.items)
        while args.all and page.has_more:
            page = read(audit, page.next_after)
            items += page.items
    return Page(items, page.next_after, page.has_more, page.pending)


def _print_page(
    args: argparse.Namespace,
    out: dict[str, Any],
    columns: Sequence[str],
    empty: str,
) -> int:
    """`out`, a page as JSON data, as JSON or as a table of the items' `columns`."""
    if args.json:
        print_json(out)
        return 0
    print_table([_row(columns, r) for r in out["items"]], list(columns), empty=empty)
    if out["hasMore"]:
        print(f"More: --after {out['nextAfter']}")
    if out["pending"]:
        print(
            "Newer events are committed but held back until an older open transaction ends; "
            f"run again with --after {out['nextAfter']}."
        )
    return 0


# -- table rows -------------------------------------------------------------------------


def _summary(kind: str, payload: dict[str, Any]) -> str:
    if kind == "message.recorded":
        return message_line(load_message(payload), cut=100)
    if kind == "tool.started":
        return f"{payload.get('name')} ({payload.get('callId')})"
    if kind == "tool.finished":
        return f"{payload.get('callId')}{' failed' if payload.get('failed') else ''}"
    if kind in ("model.requested", "model.responded"):
        digest = payload.get("digest")
        return f"#{payload.get('request')}" + (f" sha256 {digest[:16]}..." if digest else "")
    if kind in ("run.failed", "run.canceled"):
        return f"{payload.get('stage') or ''} {payload.get('error') or ''}".strip()[:80]
    return ""


# A table row's columns, each under its heading: the item's field of that name
# (its camelCase JSON name), or a value computed from the item.
_FIELDS = {
    "conversation": "conversationId",
    "run": "runId",
    "call": "callId",
    "pos": "position",
    "recorded": "recordedAt",
    "started": "startedAt",
    "finished": "finishedAt",
}
_COMPUTED: dict[str, Callable[[dict[str, Any]], Any]] = {
    "what": lambda r: _summary(r["kind"], r["payload"]),
    "message": lambda r: _summary(r["kind"], r["payload"]),
    "elapsed": lambda r: f"{r['elapsedSeconds']:.3f}s",
}
_EVENT_COLUMNS = ("seq", "kind", "origin", "conversation", "run", "pos", "recorded", "what")
_TIMELINE_COLUMNS = ("elapsed", "stage", "kind", "pos", "what")
_TOOL_COLUMNS = ("started", "name", "call", "status", "run", "finished")
_MESSAGE_COLUMNS = ("seq", "origin", "conversation", "run", "message")


def _row(columns: Sequence[str], r: dict[str, Any]) -> dict[str, Any]:
    return {c: _COMPUTED[c](r) if c in _COMPUTED else r[_FIELDS.get(c, c)] for c in columns}


def event_row(r: dict[str, Any]) -> dict[str, Any]:
    """An event's table row, for `audit events` and `chatledger tail`."""
    return _row(_EVENT_COLUMNS, r)
