"""The `chatledger` commands other than `audit`: migrate, history, runs, fork,
resume, verify, rebuild, chat and demo. `engine._cli.main` imports this module
when one of them runs."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from datetime import datetime

from chatledger.engine._cli._common import (
    DEFAULT_TENANT,
    EXIT_ERROR,
    UsageError,
    load_agent,
    message_line,
    open_store,
    parse_time,
    print_json,
    print_table,
    to_json,
    where,
)
from chatledger.store import Run, Verification

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
    with open_store(args, check=False) as store:
        store.migrate()
        print(f"chatledger tables are at the newest revision in {where(store)}.")
    return 0


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
        messages = store.tenant(args.tenant).history(
            args.conversation, at=at, repaired=not args.raw
        )
    if args.json:
        print_json([m.model_dump(mode="json", exclude_defaults=True) for m in messages])
    else:
        for message in messages:
            print(message_line(message, align=9))
    return 0


def runs(args: argparse.Namespace) -> int:
    with open_store(args) as store:
        found = store.tenant(args.tenant).runs(
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

    agent = load_agent(args.agent)
    with open_store(args) as store:
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
                if args.json:
                    print_json(
                        {"run": outcome.run_id, "action": outcome.action, "detail": outcome.detail}
                    )
                else:
                    print(f"{outcome.run_id} {outcome.action} {outcome.detail}".rstrip())
            if not outcomes and not args.json:
                print("No crashed runs to resume.")
            return 0

        async def serve() -> None:
            await asyncio.gather(*(w.serve() for w in workers))

        asyncio.run(serve())
    return 0


def verify(args: argparse.Namespace) -> int:
    with open_store(args) as store:
        # An empty --tenant is a tenant name to check (and refuse), never "all".
        if args.conversation is not None:
            ledger = store.tenant(DEFAULT_TENANT if args.tenant is None else args.tenant)
            results = [ledger.verify(args.conversation, recompute=args.recompute)]
        elif args.tenant is not None:
            results = store.tenant(args.tenant).verify_all(recompute=args.recompute)
        else:
            results = store.verify(recompute=args.recompute)
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
                f"Verified {len(results)} conversations, {checked} events: every chain is intact."
            )
            if len(results) == 1:
                print(f"Chain head: {results[0].head_digest}")
    return EXIT_ERROR if broken else 0


def rebuild(args: argparse.Namespace) -> int:
    with open_store(args) as store:

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
