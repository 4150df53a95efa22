"""The `chatledger` commands other than `audit`: migrate, conversations,
history, runs, fork, resume, verify, rebuild, chat, demo and completion.
`engine._cli.main` imports this module when one of them runs."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from datetime import datetime
from typing import TYPE_CHECKING, Any

from chatledger.engine._cli._common import (
    DEFAULT_TENANT,
    EXIT_ERROR,
    UsageError,
    counted,
    load_agent,
    message_line,
    open_store,
    parse_time,
    print_json,
    print_table,
    progress,
    where,
)
from chatledger.store import Conversation, Ledger, Message, Run, Store, Verification
from chatledger.store._json import to_json

if TYPE_CHECKING:
    from chatledger.engine.resume import ResumeWorker

# `runs --json` prints a summary under these short keys, which scripts read; a
# `Run` keeps its own camelCase field names (the values) like every other value.
_RUN_KEYS = {
    "id": "id",
    "conversation": "conversationId",
    "status": "status",
    "stage": "stage",
    "attention": "attention",
    "resumes": "resumes",
    "requests": "requestCount",
    "tools": "toolCount",
    "started": "startedAt",
}


def migrate(args: argparse.Namespace) -> int:
    from chatledger.store._sql.migrate import HEAD, current_revision
    from chatledger.store._sql.ops import Op

    with open_store(args, check=False) as store:
        if args.partitions is not None and store.engine.dialect.name == "sqlite":
            raise UsageError(
                "--partitions is for Postgres: a SQLite database is one file and is never "
                "partitioned. Run `chatledger migrate` without it."
            )
        if args.partitions is not None and args.citus:
            raise UsageError(
                "--partitions and --citus are two layouts: on Citus the log is split into "
                "shards, not partitions. Pass one of them."
            )
        before = store.execute(Op("reading the schema version", write=False, fn=current_revision))
        with progress("migrating", unit=" revisions") as shown:
            store.migrate(partitions=args.partitions, citus=args.citus, progress=shown.at)
        revision = HEAD
        if args.json:
            print_json(
                {"created": before is None, "from": before, "revision": revision}
                | ({"partitions": args.partitions} if args.partitions else {})
                | ({"citus": True} if args.citus else {})
            )
        elif before is None:
            shape = f", hash-partitioned {args.partitions} ways," if args.partitions else ""
            shape = ", distributed by tenant on Citus," if args.citus else shape
            print(f"Created chatledger's tables{shape} in {where(store)} (revision {revision}).")
        elif before == revision:
            print(f"chatledger's tables are already at the newest revision in {where(store)}.")
        else:
            print(f"Upgraded chatledger's tables in {where(store)} from {before} to {revision}.")
    return 0


def conversations(args: argparse.Namespace) -> int:
    with open_store(args) as store:
        found = store.tenant(args.tenant).conversations(limit=args.limit, before=args.before)
    rows = [_conversation_row(c) for c in found]
    if args.json:
        print_json(rows)
    else:
        print_table(
            [r | {"created": r["createdAt"][:19]} for r in rows],
            ["id", "key", "subject", "head", "created"],
            empty=f"Tenant '{args.tenant}' has no conversations.",
        )
    return 0


def _conversation_row(c: Conversation) -> dict[str, Any]:
    return {
        "id": c.id,
        "key": c.key,
        "subject": c.subject,
        "head": c.head.position,
        "createdAt": c.created_at.isoformat(),
    }


def demo(args: argparse.Namespace) -> int:
    from chatledger.engine._cli._demo import demo as run_demo

    # The follow-up commands the demo prints name the database only when a
    # command without --database-url would look elsewhere.
    given = args.database_url
    default = os.environ.get("CHATLEDGER_DATABASE_URL")
    return run_demo(given, shown_url=None if given == default else given)


def history(args: argparse.Namespace) -> int:
    at: int | datetime | None = None
    if args.at is not None:
        at = (
            int(args.at)
            if args.at.isdigit()
            else parse_time(args.at, "--at", "a position (a whole number) or an ISO timestamp")
        )
    with open_store(args) as store:
        ledger = store.tenant(args.tenant)
        conversation = args.conversation or _newest(ledger, store)
        messages = _positioned(ledger, conversation, at, repaired=not args.raw)
    if args.json:
        print_json(
            [
                {**m.model_dump(mode="json", exclude_defaults=True), "position": position}
                for position, m in messages
            ]
        )
        return 0
    if args.conversation is None:
        print(f"Conversation {conversation}, the newest (`chatledger conversations` lists all):")
    for position, message in messages:
        print(f"{'-' if position is None else position:>5}  {message_line(message, align=9)}")
    return 0


def _newest(ledger: Ledger, store: Store) -> str:
    """The tenant's newest conversation, for `history` given none."""
    newest = ledger.conversations(limit=1)
    if not newest:
        raise UsageError(
            f"Tenant '{ledger.tenant}' has no conversations in {where(store)}. Pass --tenant "
            f"(and --database-url) for the one that holds them."
        )
    return newest[0].id


def _positioned(
    ledger: Ledger, conversation: str, at: int | datetime | None, *, repaired: bool
) -> list[tuple[int | None, Message]]:
    """The history with each message's position; None for what the repair synthesized,
    and for every message of a history at a moment (its positions are not looked up)."""
    if isinstance(at, datetime):
        return [(None, m) for m in ledger.history(conversation, at=at, repaired=repaired)]
    from chatledger.store import normalize_history

    entries = ledger.entries(conversation, at=at)
    # The repair reuses the stored messages themselves (only what it synthesizes is
    # new), so each keeps its entry's position.
    positions = {id(e.message): e.position.position for e in entries}
    stored: list[Message] = [e.message for e in entries]
    history = normalize_history(stored)[0] if repaired else stored
    return [(positions.get(id(m)), m) for m in history]


def runs(args: argparse.Namespace) -> int:
    with open_store(args) as store:
        found = store.tenant(args.tenant).runs.recent(
            conversation_id=args.conversation,
            status=args.status,
            attention=True if args.attention else None,
            limit=args.limit,
        )
    rows = [
        {short: row[key] for short, key in _RUN_KEYS.items()} for row in to_json(found, list[Run])
    ]
    if args.json:
        print_json(rows)
        return 0
    columns = ["id", "conversation", "status", "stage", "requests", "tools", "attention"]
    print_table(rows, columns, empty="No runs.")
    return 0


def fork(args: argparse.Namespace) -> int:
    with open_store(args) as store:
        forked = store.tenant(args.tenant).fork(args.conversation, at=args.at)
    if args.json:
        print_json({"id": forked.id, "forkedFrom": args.conversation})
    else:
        print(f"Forked {args.conversation} into {forked.id}.")
    return 0


def resume(args: argparse.Namespace) -> int:
    from chatledger.engine.resume import ResumeWorker

    if args.run is not None and (args.once or args.concurrency != 1):
        raise UsageError(
            "resume RUN_ID resumes that one run and exits: leave out --once and --concurrency, "
            "which are for the worker."
        )
    if args.run is None and args.tenant is not None:
        raise UsageError(
            "The resume worker serves every tenant: leave out --tenant, or pass the RUN_ID "
            "of that tenant's run to resume."
        )
    agent = load_agent(args.agent)
    with open_store(args) as store:
        workers = [
            ResumeWorker(
                agent,
                store,
                lease_seconds=args.lease_seconds,
                max_attempts=args.max_attempts,
                protected_tools=set(args.protected_tool),
            )
            for _ in range(max(1, args.concurrency))
        ]
        if args.run is not None:
            return _resume_one(args, workers[0], store.tenant(args.tenant or DEFAULT_TENANT))
        if args.once:
            outcomes = asyncio.run(workers[0].run_once(limit=1000))
            for outcome in outcomes:
                if args.json:
                    print_json(
                        {"run": outcome.run_id, "action": outcome.action, "detail": outcome.detail}
                    )
                else:
                    print(f"{outcome.run_id} {outcome.action} {outcome.detail}".rstrip())
            if not outcomes and not args.json:
                print(_nothing_to_resume(store))
            return 0

        async def serve() -> None:
            await asyncio.gather(*(w.serve() for w in workers))

        asyncio.run(serve())
    return 0


def _resume_one(args: argparse.Namespace, worker: ResumeWorker, ledger: Ledger) -> int:
    """`resume RUN_ID`: that run now, or a sentence saying why it cannot be."""
    run = ledger.runs.get(args.run)
    if run.status == "completed":
        raise UsageError(
            f"Run '{run.id}' completed: there is nothing to resume. Ask the conversation "
            f"again, or `chatledger fork` it to answer from an earlier position."
        )
    resumed_by = [
        r for r in ledger.runs.recent(conversation_id=run.conversation_id) if r.resumes == run.id
    ]
    if resumed_by:
        raise UsageError(
            f"Run '{run.id}' was resumed already by run {resumed_by[0].id} "
            f"({resumed_by[0].status}); a run is resumed once: resume that one if it failed."
        )
    outcome = asyncio.run(worker.resume_run(ledger, run.id))
    if outcome is None:
        now = ledger.runs.get(run.id)
        raise UsageError(
            f"Run '{run.id}' is still running: its lease, held by '{now.lease_owner}', runs "
            f"out at {_time(now.lease_expires_at)}. A live process is renewing it; if that "
            f"process is gone, run this again once the lease has run out."
        )
    data = {
        "run": outcome.run_id,
        "action": outcome.action,
        "detail": outcome.detail,
        "resumedAs": outcome.result.run_id if outcome.result else None,
    }
    if args.json:
        print_json(data)
    elif outcome.result is not None:
        print(f"Resumed run {run.id} as run {outcome.result.run_id}: {outcome.result.output}")
    else:
        print(f"Run {run.id}: {outcome.action}: {outcome.detail}")
    return 0 if outcome.action == "resumed" else EXIT_ERROR


def _nothing_to_resume(store: Store) -> str:
    """What `resume --once` says when it claimed nothing: the runs still running, if any."""
    from chatledger.engine._cli._common import LEASE_SECONDS
    from chatledger.store._sql.ops import Op
    from chatledger.store._sql.runs import live_leases

    count, earliest = store.execute(Op("counting live leases", write=False, fn=live_leases))
    if not count:
        return "No crashed runs to resume: no run is running."
    return (
        f"No crashed runs to resume: {counted(count, 'run')} "
        f"{'is' if count == 1 else 'are'} still running under a live lease; the earliest "
        f"runs out at {_time(earliest)}. A run whose process died is resumable once its "
        f"lease has run out ({LEASE_SECONDS:g} s unrenewed by default); to resume a "
        f"canceled or failed run, use `chatledger resume RUN_ID`."
    )


def _time(value: datetime | None) -> str:
    return "an unknown time" if value is None else value.isoformat(timespec="seconds")


def verify(args: argparse.Namespace) -> int:
    with open_store(args) as store, progress("verifying", unit=" conversations") as shown:
        # An empty --tenant is a tenant name to check (and refuse), never "all".
        if args.conversation is not None:
            ledger = store.tenant(DEFAULT_TENANT if args.tenant is None else args.tenant)
            results = [ledger.verify(args.conversation, recompute=args.recompute)]
        elif args.tenant is not None:
            results = store.tenant(args.tenant).verify_all(shown.step, recompute=args.recompute)
        else:
            results = store.verify(shown.step, recompute=args.recompute)
    broken = [r for r in results if not r.ok]
    if args.json:
        # `conversation`, not `conversationId`: the key `verify --json` has always printed.
        print_json(
            [
                {"conversation": row.pop("conversationId"), **row}
                for row in to_json(results, list[Verification])
            ]
        )
    else:
        for r in broken:
            print(f"conversation {r.conversation_id}: {r.problem}")
        checked = sum(r.checked for r in results)
        if not broken:
            print(
                f"Verified {counted(len(results), 'conversation')}, {counted(checked, 'event')}: "
                f"every chain is intact."
            )
            if len(results) == 1:
                print(f"Chain head: {results[0].head_digest}")
    return EXIT_ERROR if broken else 0


def rebuild(args: argparse.Namespace) -> int:
    with open_store(args) as store, progress("rebuilding", unit=" views") as shown:
        count = store.rebuild(shown.at, tenant=args.tenant)
    if args.json:
        print_json({"tenant": args.tenant, "conversations": count})
    else:
        whose = "" if args.tenant is None else f" of tenant '{args.tenant}'"
        print(f"Rebuilt the views of {counted(count, 'conversation')}{whose} from the events.")
    return 0


def completion(args: argparse.Namespace) -> int:
    from argcomplete.shell_integration import shellcode

    print(shellcode(["chatledger"], shell=args.shell), end="")
    return 0


def chat(args: argparse.Namespace) -> int:
    if not os.environ.get("OPENAI_API_KEY") and not os.environ.get("OPENAI_BASE_URL"):
        raise UsageError(
            "chat needs an OpenAI-compatible endpoint: set OPENAI_API_KEY (and optionally "
            "OPENAI_BASE_URL for a compatible server such as vLLM or Ollama), then run it again."
        )
    from chatledger.engine.agent import Agent
    from chatledger.engine.providers.openai import OpenAIChatModel

    agent = Agent(OpenAIChatModel(args.model))
    conversation = args.conversation
    with open_store(args) as store:
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
