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
or JSON with `--json`. Errors are one line, as for every command.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

from store import (
    Event,
    ForkPoint,
    InvalidInputError,
    Lineage,
    Message,
    Page,
    Position,
    RecordedRequest,
    Store,
    ToolExecution,
)
from store.messages import dump_message, load_message

__all__ = ["add_audit_parser"]

T = TypeVar("T")


def add_audit_parser(
    subparsers: argparse._SubParsersAction[argparse.ArgumentParser],
    *parents: argparse.ArgumentParser,
) -> argparse.ArgumentParser:
    """Add `audit` and its subcommands; `parents` are the options every leaf takes."""
    audit = subparsers.add_parser("audit", help="answer audit questions from the log")
    sub = audit.add_subparsers(dest="audit_command", metavar="QUESTION", required=True)

    def leaf(name: str, help: str, handler: Callable[[argparse.Namespace], int]) -> Any:
        p = sub.add_parser(name, parents=list(parents), help=help, description=help)
        p.set_defaults(handler=handler)
        return p

    def paged(p: argparse.ArgumentParser) -> None:
        p.add_argument("--limit", type=int, default=100, help="items per page (default 100)")
        p.add_argument("--after", help="the cursor a previous page printed")
        p.add_argument("--all", action="store_true", help="follow every page")

    def window(p: argparse.ArgumentParser) -> None:
        p.add_argument("--since", help="from this ISO time (inclusive; UTC unless it says)")
        p.add_argument("--until", help="up to this ISO time (exclusive)")

    p = leaf("timeline", "every event of a run, in order, with stage and timing", _timeline)
    p.add_argument("run", help="the run id")
    p.add_argument("--kind", action="append", help="only this event kind (repeatable)")
    paged(p)

    p = leaf("request", "what the model saw: request N of a run, rebuilt from the log", _request)
    p.add_argument("run", help="the run id")
    p.add_argument("number", type=int, help="the request number (from 1)")
    p.add_argument("--agent", help="the run's agent, as module:attribute, to check the digest")
    source = p.add_mutually_exclusive_group()
    source.add_argument("--instructions", help="the instructions the run resolved")
    source.add_argument("--instructions-file", type=Path, help="... read from a file")
    p.add_argument("--body", action="store_true", help="print the rebuilt wire body (--agent)")

    p = leaf("tools", "tool executions: finished, failed, running, uncertain", _tools)
    p.add_argument("--conversation", help="only this conversation's calls")
    p.add_argument("--run", help="only this run's calls")
    p.add_argument("--tool", help="only calls of this tool")
    p.add_argument(
        "--status",
        action="append",
        choices=["finished", "failed", "running", "uncertain"],
        help="only calls that ended so (repeatable); uncertain: started, never finished",
    )
    window(p)
    paged(p)

    p = leaf("messages", "messages a caller supplied (client) or repair synthesized", _messages)
    p.add_argument("--conversation", help="only this conversation's messages")
    p.add_argument("--run", help="only this run's messages")
    p.add_argument("--origin", choices=["client", "repair"], help="only this origin")
    window(p)
    paged(p)

    p = leaf("lineage", "a conversation's branches, forks in and out, and resumes", _lineage)
    p.add_argument("conversation", help="the conversation id")

    p = leaf("events", "the raw log, filtered", _events)
    p.add_argument("--conversation", help="only this conversation's events")
    p.add_argument("--run", help="only this run's events")
    p.add_argument("--kind", action="append", help="only this event kind (repeatable)")
    p.add_argument("--tool", help="only tool.started events and tool results of this tool")
    p.add_argument("--origin", choices=["run", "client", "repair"], help="only this origin")
    failed = p.add_mutually_exclusive_group()
    failed.add_argument("--failed", action="store_true", help="only events recording a failure")
    failed.add_argument("--not-failed", action="store_true", help="only the others")
    window(p)
    paged(p)
    return audit


# -- handlers ---------------------------------------------------------------------------


def _timeline(args: argparse.Namespace) -> int:
    page = _pages(
        args,
        lambda a, after: a.run_timeline(args.run, kinds=args.kind, after=after, limit=args.limit),
    )
    rows = [
        {
            **_event_json(t.event),
            "stage": t.stage,
            "elapsedSeconds": round(t.elapsed.total_seconds(), 6),
        }
        for t in page.items
    ]
    return _print_page(args, page, rows, _timeline_row, "No events.")


def _request(args: argparse.Namespace) -> int:
    instructions = args.instructions
    if args.instructions_file is not None:
        try:
            instructions = args.instructions_file.read_text(encoding="utf-8")
        except OSError as error:
            raise InvalidInputError(f"Cannot read --instructions-file: {error}.") from error
    out: dict[str, Any]
    with _open(args) as store:
        ledger = store.tenant(args.tenant)
        if args.agent is None:
            recorded = ledger.audit.model_request(
                args.run, args.number, instructions=instructions or ""
            )
            out = _recorded_json(recorded)
        else:
            from engine.agent import Agent
            from engine.audit import rebuild_request
            from engine.cli import _load

            agent = _load(args.agent)
            if not isinstance(agent, Agent):
                raise InvalidInputError(
                    f"{args.agent} is a {type(agent).__name__}, not an engine.Agent."
                )
            check = rebuild_request(ledger, args.run, args.number, agent, instructions=instructions)
            recorded = check.recorded
            out = _recorded_json(recorded) | {
                "rebuiltDigest": check.prepared.digest,
                "matches": check.matches,
                "stream": check.prepared.stream,
                "body": check.body.decode("utf-8"),
            }
    if args.json:
        print(json.dumps(out))
    else:
        for message in recorded.messages:
            print(_message_line(message))
        print(f"recorded digest: {recorded.digest}")
        if "matches" in out:
            verdict = "matches" if out["matches"] else "DOES NOT MATCH"
            print(f"rebuilt digest:  {out['rebuiltDigest']} ({verdict})")
            if args.body:
                print(out["body"])
    return 1 if out.get("matches") is False else 0


def _tools(args: argparse.Namespace) -> int:
    since, until = _time(args.since, "--since"), _time(args.until, "--until")
    page = _pages(
        args,
        lambda a, after: a.tool_executions(
            conversation_id=args.conversation,
            run_id=args.run,
            tool_name=args.tool,
            status=args.status,
            since=since,
            until=until,
            after=after,
            limit=args.limit,
        ),
    )
    rows = [_execution_json(x) for x in page.items]
    return _print_page(args, page, rows, _tool_row, "No tool executions.")


def _messages(args: argparse.Namespace) -> int:
    since, until = _time(args.since, "--since"), _time(args.until, "--until")
    page = _pages(
        args,
        lambda a, after: a.supplied_and_repaired(
            conversation_id=args.conversation,
            run_id=args.run,
            origin=args.origin,
            since=since,
            until=until,
            after=after,
            limit=args.limit,
        ),
    )
    rows = [_event_json(e) for e in page.items]
    return _print_page(args, page, rows, _message_row, "No client or repair messages.")


def _lineage(args: argparse.Namespace) -> int:
    with _open(args) as store:
        tree = store.tenant(args.tenant).audit.lineage(args.conversation)
    out = _lineage_json(tree)
    if args.json:
        print(json.dumps(out))
        return 0
    fork = out["forkedFrom"]
    came = (
        f" (forked from {fork['conversationId']} at {fork['branchId']}:{fork['position']})"
        if fork
        else ""
    )
    print(f"Conversation {tree.conversation.id}{came}")
    print()
    _table(
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
    )
    for f in out["forks"]:
        at = f["forkedFrom"]
        print(f"fork out: {f['id']} at {at['branchId']}:{at['position']}")
    for r in out["resumes"]:
        print(f"resume: run {r['runId']} resumes {r['resumes']} ({r['status']})")
    return 0


def _events(args: argparse.Namespace) -> int:
    since, until = _time(args.since, "--since"), _time(args.until, "--until")
    failed = True if args.failed else False if args.not_failed else None
    page = _pages(
        args,
        lambda a, after: a.events(
            conversation_id=args.conversation,
            run_id=args.run,
            kinds=args.kind,
            tool_name=args.tool,
            origin=args.origin,
            failed=failed,
            since=since,
            until=until,
            after=after,
            limit=args.limit,
        ),
    )
    rows = [_event_json(e) for e in page.items]
    return _print_page(args, page, rows, _event_row, "No events.")


# -- plumbing ---------------------------------------------------------------------------


def _open(args: argparse.Namespace) -> Store:
    store = Store.open(args.database_url)
    store.check_schema()
    return store


def _pages(args: argparse.Namespace, read: Callable[[Any, str | None], Page[T]]) -> Page[T]:
    """One page, or with --all every page that is ready, as one."""
    with _open(args) as store:
        audit = store.tenant(args.tenant).audit
        page = read(audit, args.after)
        items = list(page.items)
        while args.all and page.has_more:
            page = read(audit, page.next_after)
            items += page.items
    return Page(items, page.next_after, page.has_more, page.pending)


def _print_page(
    args: argparse.Namespace,
    page: Page[Any],
    rows: list[dict[str, Any]],
    line: Callable[[dict[str, Any]], dict[str, Any]],
    empty: str,
) -> int:
    if args.json:
        out = {
            "items": rows,
            "nextAfter": page.next_after,
            "hasMore": page.has_more,
            "pending": page.pending,
        }
        print(json.dumps(out))
        return 0
    table = [line(r) for r in rows]
    if table:
        _table(table, list(table[0]))
    else:
        print(empty)
    if page.has_more:
        print(f"More: --after {page.next_after}")
    if page.pending:
        print(
            "Newer events are committed but held back until an older open transaction ends; "
            f"run again with --after {page.next_after}."
        )
    return 0


def _time(value: str | None, option: str) -> datetime | None:
    if value is None:
        return None
    try:
        return datetime.fromisoformat(value)
    except ValueError:
        raise InvalidInputError(
            f"{option} takes an ISO time such as 2026-11-29T12:00:00+00:00, not {value!r}."
        ) from None


def _table(rows: Sequence[dict[str, Any]], columns: list[str]) -> None:
    cells = [["" if r[c] is None else str(r[c]) for c in columns] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(columns)]
    print("  ".join(c.upper().ljust(w) for c, w in zip(columns, widths, strict=True)).rstrip())
    for row in cells:
        print("  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip())


# -- JSON and table rows ----------------------------------------------------------------


def _event_json(e: Event) -> dict[str, Any]:
    return {
        "seq": e.seq,
        "id": e.id,
        "conversationId": e.conversation_id,
        "branchId": e.branch_id,
        "position": e.position,
        "runId": e.run_id,
        "kind": e.kind,
        "origin": e.origin,
        "head": e.head,
        "recordedAt": e.recorded_at.isoformat(),
        "payload": e.payload,
    }


def _execution_json(x: ToolExecution) -> dict[str, Any]:
    return {
        "callId": x.call_id,
        "name": x.name,
        "status": x.status,
        "runId": x.run_id,
        "conversationId": x.conversation_id,
        "branchId": x.branch_id,
        "startedSeq": x.started_seq,
        "startedAt": x.started_at.isoformat(),
        "finishedAt": None if x.finished_at is None else x.finished_at.isoformat(),
    }


def _recorded_json(r: RecordedRequest) -> dict[str, Any]:
    return {
        "runId": r.run_id,
        "conversationId": r.conversation_id,
        "request": r.request,
        "digest": r.digest,
        "model": r.model,
        "recordedAt": r.recorded_at.isoformat(),
        "messages": [json.loads(dump_message(m)) for m in r.messages],
        "repair": {
            "synthesized": r.repair.synthesized,
            "dropped": r.repair.dropped,
            "moved": r.repair.moved,
            "truncated": r.repair.truncated,
        },
    }


def _point(p: Position | None) -> dict[str, Any] | None:
    return None if p is None else {"branchId": p.branch_id, "position": p.position}


def _fork_point(p: ForkPoint | None) -> dict[str, Any] | None:
    if p is None:
        return None
    return {"conversationId": p.conversation_id, "branchId": p.branch_id, "position": p.position}


def _lineage_json(tree: Lineage) -> dict[str, Any]:
    return {
        "conversation": tree.conversation.id,
        "head": _point(tree.conversation.head),
        "forkedFrom": _fork_point(tree.forked_from),
        "branches": [
            {
                "id": b.id,
                "reason": b.reason,
                "parent": _point(b.parent),
                "runId": b.run_id,
                "resumesRunId": b.resumes_run_id,
                "createdAt": b.created_at.isoformat(),
                "firstPosition": b.first_position,
                "tip": b.tip,
                "holdsHead": b.holds_head,
            }
            for b in tree.branches
        ],
        "forks": [{"id": f.id, "forkedFrom": _fork_point(f.forked_from)} for f in tree.forks],
        "resumes": [
            {"runId": r.run_id, "resumes": r.resumes, "branchId": r.branch_id, "status": r.status}
            for r in tree.resumes
        ],
    }


def _summary(kind: str, payload: dict[str, Any]) -> str:
    if kind == "message.recorded":
        return _message_line(load_message(payload))
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


def _message_line(message: Message) -> str:
    if message.tool_calls:
        calls = ", ".join(f"{c.name}({c.arguments})" for c in message.tool_calls)
        return f"{message.role}: calls {calls}"[:100]
    marker = " [failed]" if message.failed else ""
    return f"{message.role}: {' '.join(message.text.split())}"[:100] + marker


def _event_row(r: dict[str, Any]) -> dict[str, Any]:
    return {
        "seq": r["seq"],
        "kind": r["kind"],
        "origin": r["origin"],
        "conversation": r["conversationId"],
        "run": r["runId"],
        "pos": r["position"],
        "recorded": r["recordedAt"],
        "what": _summary(r["kind"], r["payload"]),
    }


def _timeline_row(r: dict[str, Any]) -> dict[str, Any]:
    return {
        "elapsed": f"{r['elapsedSeconds']:.3f}s",
        "stage": r["stage"],
        "kind": r["kind"],
        "pos": r["position"],
        "what": _summary(r["kind"], r["payload"]),
    }


def _tool_row(r: dict[str, Any]) -> dict[str, Any]:
    return {
        "started": r["startedAt"],
        "name": r["name"],
        "call": r["callId"],
        "status": r["status"],
        "run": r["runId"],
        "finished": r["finishedAt"],
    }


def _message_row(r: dict[str, Any]) -> dict[str, Any]:
    return {
        "seq": r["seq"],
        "origin": r["origin"],
        "conversation": r["conversationId"],
        "run": r["runId"],
        "message": _summary(r["kind"], r["payload"]),
    }
