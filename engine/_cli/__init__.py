"""The `chatledger` command: `main` and its argument parser.

Every subcommand takes `--database-url` (or `CHATLEDGER_DATABASE_URL`; the
default is the SQLite file ./chatledger.db) and, where it reads or writes a
tenant's data, `--tenant` (default `default`). Output is a readable table for
people, or JSON with `--json`. Errors are one line on stderr and a non-zero
exit status, never a traceback.

The parser names each command's handler as `module:function` in this package
and imports that module only when the command runs (`_commands`, `_audit`,
`_tail`), so `chatledger --version` and `--help` load no SQLAlchemy, driver or
httpx.
"""

from __future__ import annotations

import argparse
import importlib
import os
import select
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn

from chatledger import __version__
from chatledger.engine._cli._common import (
    DEFAULT_TENANT,
    EXIT_ERROR,
    EXIT_PIPE,
    LEASE_SECONDS,
    cli_message,
)
from chatledger.store._errors import ChatledgerError
from chatledger.store.ids import canonical_id

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; return the exit status.

    A reader that went away (`chatledger ... | head -1`) ends every command
    quietly, as Python's documentation of SIGPIPE recommends: stdout is
    flushed here, so a failed write shows before the interpreter's own last
    flush, and is then pointed at the null device so that flush cannot fail.
    """
    try:
        try:
            return _run(argv)
        finally:
            sys.stdout.flush()
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_PIPE


def _stdout_gone() -> bool:
    """Whether stdout's reader went away: the write end of a pipe whose read end
    is closed polls as an error, and a broken pipe elsewhere leaves stdout as it was."""
    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
    except (OSError, ValueError):  # no file descriptor to ask: count it as gone
        return True
    return any(events & (select.POLLERR | select.POLLHUP) for _, events in poller.poll(0))


def _run(argv: Sequence[str] | None) -> int:
    parser = _parser()
    _complete(parser)
    args = parser.parse_args(argv)
    if not getattr(args, "command", None):
        parser.print_help()
        return 0
    try:
        return int(_handler(args.handler)(args))
    except BrokenPipeError as error:
        if _stdout_gone():
            raise  # the reader went away: `main` ends quietly
        # Another pipe or socket (a provider's connection, say): an error like any other.
        print(f"chatledger: error: {error}", file=sys.stderr)
        return EXIT_ERROR
    except ChatledgerError as error:
        # One line, whatever the driver's message looked like.
        print(f"chatledger: error: {cli_message(error)}", file=sys.stderr)
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


def _complete(parser: argparse.ArgumentParser) -> None:
    """Answer the shell's completion request and exit, when this run is one.

    The script `chatledger completion SHELL` prints runs the command with
    `_ARGCOMPLETE` set; any other run returns at once, importing nothing.
    """
    if "_ARGCOMPLETE" in os.environ:
        import argcomplete

        argcomplete.autocomplete(parser)


def _handler(name: str) -> Callable[[argparse.Namespace], int]:
    """The function that `name` (`module:function`, in this package) names, imported now."""
    module, _, function = name.partition(":")
    found: Callable[[argparse.Namespace], int] = getattr(
        importlib.import_module(f"{__name__}.{module}"), function
    )
    return found


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


class _Parser(argparse.ArgumentParser):
    """argparse's parser, with its errors one line as every other error of the command."""

    def error(self, message: str) -> NoReturn:
        # Its subcommands' parsers are of this class too (`add_subparsers`
        # makes them of the parent's), so `prog` names the command at fault.
        self.exit(2, f"chatledger: error: {' '.join(message.split())}; see '{self.prog} --help'\n")


def _parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--database-url",
        default=os.environ.get("CHATLEDGER_DATABASE_URL"),
        help="SQLAlchemy URL (default: $CHATLEDGER_DATABASE_URL, else sqlite:///chatledger.db)",
    )
    tenant = argparse.ArgumentParser(add_help=False)
    tenant.add_argument(
        "--tenant", default=DEFAULT_TENANT, help=f"the tenant (default: {DEFAULT_TENANT})"
    )
    output = argparse.ArgumentParser(add_help=False)
    output.add_argument("--json", action="store_true", help="print JSON for programs")

    parser: argparse.ArgumentParser = _Parser(
        prog="chatledger", description="An event-sourced conversation store for LLM agents."
    )
    parser.add_argument("--version", action="version", version=f"chatledger {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    def command(
        name: str, run: str, help: str, *parents: argparse.ArgumentParser
    ) -> argparse.ArgumentParser:
        p = sub.add_parser(name, parents=list(parents), help=help)
        p.set_defaults(handler=run)
        return p

    p = command(
        "migrate", "_commands:migrate", "create or upgrade chatledger's tables", common, output
    )
    p.add_argument(
        "--partitions",
        type=_count(1, 1024),
        metavar="N",
        help="hash-partition the events and head views into N partitions (Postgres; "
        "see docs/scaling.md)",
    )
    p.add_argument(
        "--citus",
        action="store_true",
        help="distribute every table by tenant on a Citus coordinator (see docs/scaling.md)",
    )
    command("demo", "_commands:demo", "show the whole product offline in a few seconds", common)

    p = command(
        "conversations",
        "_commands:conversations",
        "list the tenant's conversations, newest first",
        common,
        tenant,
        output,
    )
    p.add_argument("--limit", type=_count(1, 10_000), default=50, help="how many (default 50)")
    p.add_argument(
        "--before",
        type=canonical_id,
        metavar="ID",
        help="only those older than this one (the next page)",
    )

    p = command(
        "history", "_commands:history", "print a conversation's history", common, tenant, output
    )
    p.description = (
        "Print a conversation's history, each message after its position. A position counts "
        "the events on the conversation's branch (its creation is 1, then each message, and "
        "a run's steps), not messages: pass the one printed beside a message to `fork --at` "
        "or `history --at` to keep the history up to that message. Without a conversation, "
        "the tenant's newest one is shown (`chatledger conversations` lists them all)."
    )
    p.add_argument(
        "conversation",
        type=canonical_id,
        nargs="?",
        help="the conversation id (default: the newest)",
    )
    p.add_argument("--at", help="a position on the head's lineage, or an ISO timestamp")
    p.add_argument("--raw", action="store_true", help="as recorded, without repair")

    p = command("runs", "_commands:runs", "list runs", common, tenant, output)
    p.add_argument("--status", choices=["running", "completed", "failed", "canceled"])
    p.add_argument("--attention", action="store_true", help="only runs that need a person")
    p.add_argument("--conversation", type=canonical_id, help="only runs of this conversation")
    p.add_argument("--limit", type=_count(1, 100_000), default=50)

    p = command("fork", "_commands:fork", "fork a conversation", common, tenant, output)
    p.add_argument("conversation", type=canonical_id, help="the conversation id")
    p.add_argument(
        "--at",
        type=_count(1, 2**31 - 1),
        help="a position on the head's lineage (default: head)",
    )

    p = command(
        "resume",
        "_commands:resume",
        "resume crashed runs with a worker, or one run now",
        common,
        output,
    )
    p.description = (
        "Without RUN_ID, a worker: it claims the runs of every tenant whose process died "
        "(still running once their lease ran out) and continues each exactly once. With "
        "RUN_ID, resume that run of --tenant now: a crashed one, a failed one or a canceled "
        "one (a client that disconnected); a run still running or completed is refused, "
        "saying why. See docs/operations.md."
    )
    p.add_argument(
        "run", type=canonical_id, nargs="?", metavar="RUN_ID", help="resume this run now, then exit"
    )
    p.add_argument(
        "--tenant",
        help=f"the tenant of RUN_ID (default: {DEFAULT_TENANT}); the worker serves every tenant",
    )
    p.add_argument("--agent", required=True, help="the agent, as module:attribute")
    p.add_argument("--once", action="store_true", help="one pass, then exit")
    p.add_argument("--concurrency", type=_count(1, 256), default=1, help="workers in this process")
    p.add_argument(
        "--lease-seconds",
        type=float,
        default=LEASE_SECONDS,
        help=f"how long a claim lasts unrenewed (default: {LEASE_SECONDS:g}, as a run's)",
    )
    p.add_argument("--max-attempts", type=_count(1, 1000), default=3)
    p.add_argument(
        "--protected-tool",
        action="append",
        default=[],
        metavar="NAME",
        help="a tool that must not run twice: a crashed run that started it without a result "
        "is marked for attention, not resumed (repeatable; besides the agent's rerun=False tools)",
    )

    p = command(
        "verify",
        "_commands:verify",
        "recompute the hash chains and name the first event that does not match",
        common,
        output,
    )
    p.add_argument("--conversation", type=canonical_id, help="only this conversation (of --tenant)")
    p.add_argument("--tenant", help="only this tenant's conversations")
    p.add_argument(
        "--recompute",
        choices=["auto", "database", "client"],
        default="auto",
        help="where hashes are computed: auto (in SQL on Postgres, here on SQLite), "
        "database, or client (here, independent of the server's functions)",
    )

    p = command(
        "rebuild", "_commands:rebuild", "recompute every view from the events", common, output
    )
    p.add_argument("--tenant", help="only this tenant's conversations (default: every tenant)")

    p = command(
        "erase",
        "_erasure:erase",
        "erase a subject: destroy the data key of its sealed conversations",
        common,
        tenant,
        output,
    )
    p.description = (
        "Erase an erasure subject (a sealed conversation's subject is its own id unless it "
        "was created with one): its data key is destroyed in one transaction, each of its "
        "conversations gets a `conversation.erased` event, and from then on every read shows "
        "an erased marker instead of their content. The log and its hashes stay whole: "
        "`chatledger verify` passes. Needs the store's key-encryption key (CHATLEDGER_KEK) "
        "only to have sealed them; erasing needs none. See docs/erasure.md."
    )
    p.add_argument("subject", help="the erasure subject (a conversation id by default)")
    p.add_argument("--reason", required=True, help="why (recorded in the log; no content)")

    _add_retention(sub, common, tenant, output)

    p = command(
        "rotate-kek",
        "_erasure:rotate_kek",
        "re-wrap every data key under a new key-encryption key",
        common,
        output,
    )
    p.description = (
        "Re-wrap every data key under the key-encryption key in $CHATLEDGER_NEW_KEK (base64 "
        "or hex; never on the command line), in one transaction. The store is opened with "
        "the current key, $CHATLEDGER_KEK. Afterwards run everything with the new key; a "
        "repeat changes nothing. See docs/erasure.md."
    )

    p = command(
        "tail",
        "_tail:tail",
        "print the tenant's events in commit order, and with --follow as they commit",
        common,
        tenant,
    )
    p.description = (
        "Print the tenant's events (or one conversation's) in commit order, one a line. "
        "With --json each line is the event as `audit events --json` shows it, plus "
        '"after": the cursor after the whole page the line came in, and "last", true on '
        "the page's last line. Cursors are per page, not per event: store an after once "
        "the line marked last is handled and pass it as --after to resume after that page; "
        "a page handled but not yet stored comes again, so skip events already handled by "
        "id. The table has no cursors. Without --follow, exit 0 once caught up; with it, "
        "wait for new commits until interrupted (exit 130)."
    )
    p.add_argument(
        "--after",
        metavar="CURSOR",
        help="resume after this cursor (the `after` a --json line printed)",
    )
    p.add_argument(
        "--conversation", type=canonical_id, metavar="ID", help="only this conversation's events"
    )
    p.add_argument("--follow", action="store_true", help="keep printing events as they commit")
    p.add_argument(
        "--json",
        action="store_true",
        help='one JSON object a line, with the page cursor "after" and "last"',
    )
    p.add_argument(
        "--limit",
        type=_count(1, 10_000),
        default=100,
        metavar="N",
        help="the most events read at a time, one page (default 100)",
    )

    p = command(
        "export",
        "_transfer:export",
        "write the tenant's log (or a conversation's) as JSON Lines, to import elsewhere",
        common,
        tenant,
        output,
    )
    p.description = (
        "Write the tenant's conversations, or one with the conversations it was forked from, "
        "as JSON Lines: every event as stored (sealed content stays sealed) with its hash, "
        "and the rows that rebuild it. `chatledger import` reads it into another database, "
        "SQLite or Postgres. See docs/export.md."
    )
    p.add_argument(
        "--conversation",
        type=canonical_id,
        metavar="ID",
        help="only this conversation (and its sources)",
    )
    p.add_argument("--output", "-o", metavar="FILE", help="write to FILE (default: stdout)")
    p.epilog = "--json prints the report on stdout, so it takes --output."

    p = command(
        "import",
        "_transfer:import_",
        "read a file of `chatledger export` into this database, for the tenant it names",
        common,
        output,
    )
    p.description = (
        "Read an export into this database, in one transaction, for the tenant its header "
        "names. Every line is checked (order, every hash, the end record's digest) before "
        "anything commits: a file refused names its line and writes nothing. Conversations "
        "already here, identical, are left as they are, so an import can be repeated."
    )
    p.add_argument("file", metavar="FILE", help="the export file")

    p = command("chat", "_commands:chat", "chat with an OpenAI-compatible model", common, tenant)
    p.add_argument("--model", default=os.environ.get("CHATLEDGER_MODEL", "gpt-4o-mini"))
    p.add_argument("--conversation", type=canonical_id, help="continue this conversation")

    p = command("serve", "_serve:serve", "serve /v1/ask and the read endpoints over HTTP", common)
    p.add_argument("--agent", required=True, help="the agent, as module:attribute")
    p.add_argument(
        "--keys",
        default=os.environ.get("CHATLEDGER_API_KEYS_FILE"),
        help="the API key file (default: $CHATLEDGER_API_KEYS_FILE, else $CHATLEDGER_API_KEYS "
        "holds its JSON)",
    )
    p.add_argument(
        "--replica",
        action="append",
        default=[],
        help="a read replica's URL, for audit reads and old positions (repeatable; Postgres)",
    )
    p.add_argument("--host", default="127.0.0.1", help="the address to listen on")
    p.add_argument("--port", type=_count(0, 65535), default=8000, help="the port (0: any free)")

    p = command("ui", "_serve:ui", "look at the ledger in a browser (read-only, /ui/)", common)
    p.add_argument(
        "--tenant", default=DEFAULT_TENANT, help=f"the tenant shown (default: {DEFAULT_TENANT})"
    )
    p.add_argument(
        "--keys",
        help="ask for an API key of this key file, and show its tenant (default: no key, --tenant)",
    )
    p.add_argument("--host", default="127.0.0.1", help="the address to listen on")
    p.add_argument("--port", type=_count(0, 65535), default=8001, help="the port (0: any free)")

    p = command("api-key", "_serve:api_key", "make an API key for a tenant of `serve`", output)
    p.add_argument("tenant", help="the tenant the key opens")
    p.add_argument("--keys", help="add the key's digest to this key file (created if missing)")

    p = command("completion", "_commands:completion", "print a shell completion script")
    p.description = (
        "Print the script that completes chatledger's commands and options in bash or zsh. "
        'Load it from your shell\'s start-up file: eval "$(chatledger completion bash)".'
    )
    p.add_argument("shell", choices=["bash", "zsh"])

    _add_audit(sub, common, tenant, output)
    return parser


def _add_retention(
    subparsers: argparse._SubParsersAction[argparse.ArgumentParser],
    common: argparse.ArgumentParser,
    tenant: argparse.ArgumentParser,
    output: argparse.ArgumentParser,
) -> None:
    """`retention` and its actions (run by `engine._cli._retention`)."""
    retention = subparsers.add_parser(
        "retention",
        help="retention policies, and the pass a scheduler runs",
        description="A tenant's retention policy erases (or exports, then erases) the "
        "erasure subjects whose conversations have all been idle for its number of days. "
        "`retention run` applies it: call it from a scheduler. See docs/erasure.md.",
    )
    sub = retention.add_subparsers(dest="retention_command", metavar="ACTION", required=True)
    p = sub.add_parser("set", parents=[common, tenant, output], help="set the tenant's policy")
    p.set_defaults(handler="_retention:set_policy")
    p.add_argument("--idle-days", type=_count(1, 365_000), required=True, metavar="N")
    p.add_argument("--action", choices=["erase", "export-erase"], required=True)
    p = sub.add_parser("show", parents=[common, tenant, output], help="show the tenant's policy")
    p.set_defaults(handler="_retention:show")
    p = sub.add_parser("clear", parents=[common, tenant], help="remove the tenant's policy")
    p.set_defaults(handler="_retention:clear")
    p = sub.add_parser(
        "run",
        parents=[common, output],
        help="apply the policies: erase (or export, then erase) what is due",
        description="Apply the retention policy of --tenant, or of every tenant that has "
        "one. Each due subject is exported first under --export-dir/<tenant>/ (for "
        "export-erase) and then erased. A pass killed halfway finishes when run again. "
        "Exit 1 when a subject failed (the others are done).",
    )
    p.set_defaults(handler="_retention:run")
    p.add_argument("--tenant", help="only this tenant (default: every tenant with a policy)")
    p.add_argument("--export-dir", help="where export-erase writes its exports")
    p.add_argument("--dry-run", action="store_true", help="say what is due; change nothing")


def _add_audit(
    subparsers: argparse._SubParsersAction[argparse.ArgumentParser],
    *parents: argparse.ArgumentParser,
) -> None:
    """`audit` and its questions (answered by `engine._cli._audit`); `parents` are the
    options every question takes."""
    audit = subparsers.add_parser("audit", help="answer audit questions from the log")
    sub = audit.add_subparsers(dest="audit_command", metavar="QUESTION", required=True)

    def leaf(name: str, help: str) -> Any:
        p = sub.add_parser(name, parents=list(parents), help=help, description=help)
        p.set_defaults(handler=f"_audit:{name}")
        return p

    def paged(p: argparse.ArgumentParser) -> None:
        p.add_argument("--limit", type=int, default=100, help="items per page (default 100)")
        p.add_argument("--after", help="the cursor a previous page printed")
        p.add_argument("--all", action="store_true", help="follow every page")

    def window(p: argparse.ArgumentParser) -> None:
        p.add_argument("--since", help="from this ISO time (inclusive; UTC unless it says)")
        p.add_argument("--until", help="up to this ISO time (exclusive)")

    p = leaf("timeline", "every event of a run, in order, with stage and timing")
    p.add_argument("run", type=canonical_id, help="the run id")
    p.add_argument("--kind", action="append", help="only this event kind (repeatable)")
    paged(p)

    p = leaf("request", "what the model saw: request N of a run, rebuilt from the log")
    p.add_argument("run", type=canonical_id, help="the run id")
    p.add_argument("number", type=int, help="the request number (from 1)")
    p.add_argument("--agent", help="the run's agent, as module:attribute, to check the digest")
    source = p.add_mutually_exclusive_group()
    source.add_argument("--instructions", help="the instructions the run resolved")
    source.add_argument("--instructions-file", type=Path, help="... read from a file")
    p.add_argument("--body", action="store_true", help="print the rebuilt wire body (--agent)")

    p = leaf("tools", "tool executions: finished, failed, running, uncertain")
    p.add_argument("--conversation", type=canonical_id, help="only this conversation's calls")
    p.add_argument("--run", type=canonical_id, help="only this run's calls")
    p.add_argument("--tool", help="only calls of this tool")
    p.add_argument(
        "--status",
        action="append",
        choices=["finished", "failed", "running", "uncertain"],
        help="only calls that ended so (repeatable); uncertain: started, never finished",
    )
    window(p)
    paged(p)

    p = leaf("messages", "messages a caller supplied (client) or repair synthesized")
    p.add_argument("--conversation", type=canonical_id, help="only this conversation's messages")
    p.add_argument("--run", type=canonical_id, help="only this run's messages")
    p.add_argument("--origin", choices=["client", "repair"], help="only this origin")
    window(p)
    paged(p)

    p = leaf("lineage", "a conversation's branches, forks in and out, and resumes")
    p.add_argument("conversation", type=canonical_id, help="the conversation id")

    p = leaf("events", "the raw log, filtered")
    p.add_argument("--conversation", type=canonical_id, help="only this conversation's events")
    p.add_argument("--run", type=canonical_id, help="only this run's events")
    p.add_argument("--kind", action="append", help="only this event kind (repeatable)")
    p.add_argument("--tool", help="only tool.started events and tool results of this tool")
    p.add_argument("--origin", choices=["run", "client", "repair"], help="only this origin")
    failed = p.add_mutually_exclusive_group()
    failed.add_argument("--failed", action="store_true", help="only events recording a failure")
    failed.add_argument("--not-failed", action="store_true", help="only the others")
    window(p)
    paged(p)
