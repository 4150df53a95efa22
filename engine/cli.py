"""The `chatledger` command.

Every subcommand takes `--database-url` (or `CHATLEDGER_DATABASE_URL`; the
default is the SQLite file ./chatledger.db) and, where it reads or writes a
tenant's data, `--tenant` (default `default`). Output is a readable table for
people, or JSON with `--json`. Errors are one line on stderr and a non-zero
exit status, never a traceback.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import os
import sys
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

from engine._audit_cli import add_audit_parser
from store import ChatledgerError, Message, Store, __version__

EXIT_ERROR = 1


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; return the exit status."""
    parser = _parser()
    args = parser.parse_args(argv)
    if not getattr(args, "command", None):
        parser.print_help()
        return 0
    try:
        return int(args.handler(args))
    except ChatledgerError as error:
        # One line, whatever the driver's message looked like.
        print(f"chatledger: error: {' '.join(str(error).split())}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        print("chatledger: interrupted", file=sys.stderr)
        return 130
    except Exception as error:
        # A command line prints sentences, never a traceback; one that reaches
        # here is a defect of ours, and CHATLEDGER_DEBUG=1 shows where it is.
        if os.environ.get("CHATLEDGER_DEBUG"):
            raise
        print(
            f"chatledger: internal error: {type(error).__name__}: {' '.join(str(error).split())}. "
            f"This is a defect in chatledger; rerun with CHATLEDGER_DEBUG=1 for the traceback "
            f"and report it.",
            file=sys.stderr,
        )
        return EXIT_ERROR


def _count(low: int, high: int) -> Callable[[str], int]:
    """An argparse type: a whole number from `low` to `high`."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{value} is not from {low} to {high:,}")
        return value

    return parse


def _parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--database-url",
        default=os.environ.get("CHATLEDGER_DATABASE_URL"),
        help="SQLAlchemy URL (default: $CHATLEDGER_DATABASE_URL, else sqlite:///chatledger.db)",
    )
    tenant = argparse.ArgumentParser(add_help=False)
    tenant.add_argument("--tenant", default="default", help="the tenant (default: default)")
    output = argparse.ArgumentParser(add_help=False)
    output.add_argument("--json", action="store_true", help="print JSON for programs")

    parser = argparse.ArgumentParser(
        prog="chatledger", description="An event-sourced conversation store for LLM agents."
    )
    parser.add_argument("--version", action="version", version=f"chatledger {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser("migrate", parents=[common], help="create or upgrade chatledger's tables")
    p.set_defaults(handler=_migrate)

    p = sub.add_parser(
        "demo", parents=[common], help="show the whole product offline in a few seconds"
    )
    p.set_defaults(handler=_demo)

    p = sub.add_parser(
        "history", parents=[common, tenant, output], help="print a conversation's history"
    )
    p.add_argument("conversation", help="the conversation id")
    p.add_argument("--at", help="a position on the head's lineage, or an ISO timestamp")
    p.add_argument("--raw", action="store_true", help="as recorded, without repair")
    p.set_defaults(handler=_history)

    p = sub.add_parser("runs", parents=[common, tenant, output], help="list runs")
    p.add_argument("--status", choices=["running", "completed", "failed", "canceled"])
    p.add_argument("--attention", action="store_true", help="only runs that need a person")
    p.add_argument("--conversation", help="only runs of this conversation")
    p.add_argument("--limit", type=_count(1, 100_000), default=50)
    p.set_defaults(handler=_runs)

    p = sub.add_parser("fork", parents=[common, tenant, output], help="fork a conversation")
    p.add_argument("conversation", help="the conversation id")
    p.add_argument(
        "--at",
        type=_count(1, 2**31 - 1),
        help="a position on the head's lineage (default: head)",
    )
    p.set_defaults(handler=_fork)

    p = sub.add_parser("resume", parents=[common, output], help="resume crashed runs with a worker")
    p.add_argument("--agent", required=True, help="the agent, as module:attribute")
    p.add_argument("--once", action="store_true", help="one pass, then exit")
    p.add_argument("--concurrency", type=_count(1, 256), default=1, help="workers in this process")
    p.add_argument("--lease-seconds", type=float, default=30.0)
    p.add_argument("--max-attempts", type=_count(1, 1000), default=3)
    p.set_defaults(handler=_resume)

    p = sub.add_parser(
        "verify",
        parents=[common, output],
        help="recompute the hash chains and name the first event that does not match",
    )
    p.add_argument("--conversation", help="only this conversation (of --tenant)")
    p.add_argument("--tenant", help="only this tenant's conversations")
    p.add_argument(
        "--recompute",
        choices=["auto", "database", "client"],
        default="auto",
        help="where hashes are computed: auto (in SQL on Postgres, here on SQLite), "
        "database, or client (here, independent of the server's functions)",
    )
    p.set_defaults(handler=_verify)

    p = sub.add_parser("rebuild", parents=[common], help="recompute every view from the events")
    p.set_defaults(handler=_rebuild)

    p = sub.add_parser(
        "chat", parents=[common, tenant], help="chat with an OpenAI-compatible model"
    )
    p.add_argument("--model", default=os.environ.get("CHATLEDGER_MODEL", "gpt-4o-mini"))
    p.add_argument("--conversation", help="continue this conversation")
    p.set_defaults(handler=_chat)

    add_audit_parser(sub, common, tenant, output)
    return parser


def _open(args: argparse.Namespace, *, check: bool = True) -> Store:
    store = Store.open(args.database_url)
    if check:
        store.check_schema()
    return store


def _migrate(args: argparse.Namespace) -> int:
    with _open(args, check=False) as store:
        store.migrate()
        print(f"chatledger tables are at the newest revision in {_where(store)}.")
    return 0


def _demo(args: argparse.Namespace) -> int:
    from engine._demo import demo

    return demo(args.database_url)


def _history(args: argparse.Namespace) -> int:
    at: int | datetime | None = None
    if args.at is not None:
        at = _parse_at(args.at)
    with _open(args) as store:
        messages = store.tenant(args.tenant).history(
            args.conversation, at=at, repaired=not args.raw
        )
    if args.json:
        print(json.dumps([m.model_dump(mode="json", exclude_defaults=True) for m in messages]))
    else:
        for message in messages:
            print(_message_line(message))
    return 0


def _runs(args: argparse.Namespace) -> int:
    with _open(args) as store:
        runs = store.tenant(args.tenant).runs(
            conversation_id=args.conversation,
            status=args.status,
            attention=True if args.attention else None,
            limit=args.limit,
        )
    rows = [
        {
            "id": r.id,
            "conversation": r.conversation_id,
            "status": r.status,
            "stage": r.stage,
            "attention": r.attention,
            "resumes": r.resumes,
            "requests": r.request_count,
            "tools": r.tool_count,
            "started": r.started_at.isoformat(),
        }
        for r in runs
    ]
    if args.json:
        print(json.dumps(rows))
        return 0
    _table(rows, ["id", "conversation", "status", "stage", "requests", "tools", "attention"])
    return 0


def _fork(args: argparse.Namespace) -> int:
    with _open(args) as store:
        fork = store.tenant(args.tenant).fork(args.conversation, at=args.at)
    if args.json:
        print(json.dumps({"id": fork.id, "forkedFrom": args.conversation}))
    else:
        print(f"Forked {args.conversation} into {fork.id}.")
    return 0


def _resume(args: argparse.Namespace) -> int:
    from engine.agent import Agent
    from engine.resume import ResumeWorker

    agent = _load(args.agent)
    if not isinstance(agent, Agent):
        raise _usage(f"{args.agent} is a {type(agent).__name__}, not an engine.Agent.")
    with _open(args) as store:
        workers = [
            ResumeWorker(
                agent,
                store,
                lease_seconds=args.lease_seconds,
                max_attempts=args.max_attempts,
            )
            for _ in range(max(1, args.concurrency))
        ]
        if args.once:
            outcomes = asyncio.run(workers[0].run_once(limit=1000))
            for outcome in outcomes:
                line = {"run": outcome.run_id, "action": outcome.action, "detail": outcome.detail}
                print(
                    json.dumps(line)
                    if args.json
                    else f"{outcome.run_id} {outcome.action} {outcome.detail}".rstrip()
                )
            if not outcomes and not args.json:
                print("No crashed runs to resume.")
            return 0

        async def serve() -> None:
            await asyncio.gather(*(w.serve() for w in workers))

        asyncio.run(serve())
    return 0


def _verify(args: argparse.Namespace) -> int:
    with _open(args) as store:
        # An empty --tenant is a tenant name to check (and refuse), never "all".
        if args.conversation is not None:
            ledger = store.tenant("default" if args.tenant is None else args.tenant)
            results = [ledger.verify(args.conversation, recompute=args.recompute)]
        elif args.tenant is not None:
            results = store.tenant(args.tenant).verify_all(recompute=args.recompute)
        else:
            results = store.verify(recompute=args.recompute)
    broken = [r for r in results if not r.ok]
    if args.json:
        print(
            json.dumps(
                [
                    {
                        "conversation": r.conversation_id,
                        "ok": r.ok,
                        "checked": r.checked,
                        "headDigest": r.head_digest,
                        "problem": r.problem,
                        "eventSeq": r.event_seq,
                        "eventId": r.event_id,
                    }
                    for r in results
                ]
            )
        )
    else:
        for r in broken:
            print(f"conversation {r.conversation_id}: {r.problem}")
        checked = sum(r.checked for r in results)
        if not broken:
            print(
                f"Verified {len(results)} conversations, {checked} events: every chain is intact."
            )
            if len(results) == 1:
                print(f"Chain head: {results[0].head_digest}")
    return EXIT_ERROR if broken else 0


def _rebuild(args: argparse.Namespace) -> int:
    with _open(args) as store:

        def progress(done: int, total: int) -> None:
            width = 30
            filled = width * done // max(total, 1)
            print(
                f"\r[{'#' * filled}{'.' * (width - filled)}] {done}/{total} views",
                end="",
                file=sys.stderr,
            )

        count = store.rebuild(progress=progress)
        print(file=sys.stderr)
        print(f"Rebuilt {count} views from the events.")
    return 0


def _chat(args: argparse.Namespace) -> int:
    if not os.environ.get("OPENAI_API_KEY") and not os.environ.get("OPENAI_BASE_URL"):
        raise _usage(
            "chat needs an OpenAI-compatible endpoint: set OPENAI_API_KEY (and optionally "
            "OPENAI_BASE_URL for a compatible server such as vLLM or Ollama), then run it again."
        )
    from engine.agent import Agent
    from engine.providers.openai import OpenAIChatModel

    agent = Agent(OpenAIChatModel(args.model))
    conversation = args.conversation
    with _open(args) as store:
        ledger = store.tenant(args.tenant)
        print("Type a message; an empty line or Ctrl-D ends the chat.")
        for line in sys.stdin:
            prompt = line.strip()
            if not prompt:
                break
            result = agent.run(ledger, prompt, conversation)
            conversation = result.conversation_id
            print(f"assistant: {result.output}")
        if conversation:
            print(f"Conversation {conversation}.")
    return 0


class _UsageError(ChatledgerError):
    pass


def _usage(message: str) -> _UsageError:
    return _UsageError(message)


def _load(spec: str) -> Any:
    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        raise _usage(f"--agent takes module:attribute (e.g. myapp.agents:support), not {spec!r}.")
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise _usage(f"Cannot import {module_name!r} for --agent: {error}.") from error
    try:
        return getattr(module, attribute)
    except AttributeError:
        raise _usage(f"Module {module_name!r} has no attribute {attribute!r}.") from None


def _parse_at(value: str) -> int | datetime:
    if value.isdigit():
        return int(value)
    try:
        return datetime.fromisoformat(value)
    except ValueError:
        raise _usage(
            f"--at takes a position (a whole number) or an ISO timestamp, not {value!r}."
        ) from None


def _where(store: Store) -> str:
    return store.engine.url.render_as_string(hide_password=True)


def _message_line(message: Message) -> str:
    if message.tool_calls:
        calls = ", ".join(f"{c.name}({c.arguments})" for c in message.tool_calls)
        return f"{message.role:>9}: calls {calls}"
    marker = " [failed]" if message.failed else ""
    return f"{message.role:>9}: {message.text}{marker}"


def _table(rows: list[dict[str, Any]], columns: list[str]) -> None:
    if not rows:
        print("No runs.")
        return
    cells = [[str(r[c]) if r[c] is not None else "" for c in columns] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(columns)]
    print("  ".join(c.upper().ljust(w) for c, w in zip(columns, widths, strict=True)))
    for row in cells:
        print("  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)))


if __name__ == "__main__":
    sys.exit(main())
