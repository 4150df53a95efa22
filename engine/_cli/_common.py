"""What every `chatledger` command shares.

Opening the store, loading an agent named `module:attribute`, one table
printer, one message line, ISO times, counted nouns, the usage error, the
store's errors in the command's own words, one progress bar, and JSON through
pydantic. It loads no database code itself: `open_store` does, once a
command runs.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import datetime
from typing import TYPE_CHECKING, Any

from chatledger.store._errors import ChatledgerError, NotFoundError

if TYPE_CHECKING:
    from chatledger.engine.agent import Agent
    from chatledger.store import Message, Store

__all__ = [
    "DEFAULT_TENANT",
    "EXIT_ERROR",
    "EXIT_PIPE",
    "LEASE_SECONDS",
    "Progress",
    "UsageError",
    "cli_message",
    "counted",
    "load_agent",
    "message_line",
    "open_store",
    "parse_time",
    "print_json",
    "print_table",
    "progress",
    "where",
]

DEFAULT_TENANT = "default"
"""The tenant of every command given no `--tenant`, and the one the demo writes to."""

LEASE_SECONDS = 60.0
"""How long a run's lease (and a worker's claim) lasts unrenewed by default: the
agent's `lease_seconds`, so a crashed run waits as long as a live one renews."""

EXIT_ERROR = 1
"""The exit status of a command that failed with a sentence on stderr."""

EXIT_PIPE = 141
"""The exit status of a command whose reader went away (`| head`): a SIGPIPE death's."""


class UsageError(ChatledgerError):
    """A command was called in a way it cannot honour; the message says how to call it.

    Printed as one line on stderr, exit status 1 (argparse's own errors exit 2).
    """


def cli_message(error: ChatledgerError) -> str:
    """What the store's `error` says to a user of the command line, on one line.

    The store's advice names its Python calls (`store.tenant(...)`); a user of
    the command can act only on its options, so those errors are worded again
    here, and every other one is the store's sentence, whitespace squeezed.
    """
    if isinstance(error, NotFoundError):
        return (
            f"There is no {error.kind} '{error.ident}' in tenant '{error.tenant}'. Check the id, "
            f"and pass --tenant with the tenant that created it (and --database-url if it "
            f"lives in another database)."
        )
    return " ".join(str(error).split())


def counted(count: int, noun: str, plural: str | None = None) -> str:
    """`count` and `noun` in agreement: "1 conversation", "2,000 conversations"."""
    return f"{count:,} {noun if count == 1 else plural or noun + 's'}"


class Progress:
    """A tqdm bar, fed by the store's progress hooks: `at` for one that says how far
    it is (`done`, and `total` when known), `step` for one called once per item."""

    def __init__(self, bar: Any) -> None:
        self.bar = bar

    def at(self, done: int, total: int | None = None) -> None:
        if total is not None:
            self.bar.total = total
        self.bar.update(done - self.bar.n)

    def step(self, _item: object = None) -> None:
        self.bar.update()


@contextmanager
def progress(what: str, *, unit: str, show: bool = True) -> Iterator[Progress]:
    """A progress bar on stderr while the block runs, when stderr is a terminal (and
    `show`: false where the bar would mix with output on the same terminal).

    Piped, the bar is disabled and prints nothing, so a log holds only the
    command's result. On a terminal the bar is cleared when the block ends,
    leaving the summary line the command prints either way.
    """
    from tqdm import tqdm

    bar = tqdm(
        desc=what,
        unit=unit,
        file=sys.stderr,
        disable=not (show and sys.stderr.isatty()),
        leave=False,
        dynamic_ncols=True,
    )
    try:
        yield Progress(bar)
    finally:
        bar.close()


def open_store(args: argparse.Namespace, *, check: bool = True) -> Store:
    """The store at `--database-url`; with `check`, refuse one that is not migrated."""
    from chatledger.store import Store  # SQLAlchemy and the drivers: only once a command runs

    store = Store.open(args.database_url)
    if check:
        store.check_schema()
    return store


def where(store: Store) -> str:
    """The store's URL, password hidden."""
    return store.engine.url.render_as_string(hide_password=True)


def load_agent(spec: str) -> Agent:
    """The `Agent` that `--agent module:attribute` names.

    The module is looked up in the current directory first, then among the
    installed packages, as uvicorn and gunicorn look up an application.
    """
    from chatledger.engine.agent import Agent

    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        raise UsageError(
            f"--agent takes module:attribute (e.g. myapp.agents:support), not {spec!r}."
        )
    here = os.getcwd()
    if here not in sys.path:
        sys.path.insert(0, here)
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as error:
        if error.name is not None and f"{module_name}.".startswith(f"{error.name}."):
            raise UsageError(
                f"Cannot import {module_name!r} for --agent: there is no module {error.name!r} "
                f"in the current directory ({here}) or among the installed packages. Run the "
                "command from the directory that holds it, or install it."
            ) from None
        raise UsageError(
            f"Module {module_name!r} for --agent was found, but importing it failed: {error}. "
            "Install what it needs."
        ) from error
    except Exception as error:
        raise UsageError(
            f"Module {module_name!r} for --agent was found, but importing it failed: "
            f"{type(error).__name__}: {error}. Fix the module and try again."
        ) from error
    try:
        agent = getattr(module, attribute)
    except AttributeError:
        raise UsageError(
            f"Module {module_name!r} ({module.__file__}) has no attribute {attribute!r}; "
            "--agent takes module:attribute, the attribute being the Agent."
        ) from None
    if not isinstance(agent, Agent):
        raise UsageError(f"{spec} is a {type(agent).__name__}, not a chatledger Agent.")
    return agent


def parse_time(value: str, option: str, takes: str = "") -> datetime:
    """`value` as an ISO time, or a `UsageError` that says what `option` takes."""
    try:
        return datetime.fromisoformat(value)
    except ValueError:
        takes = takes or "an ISO time such as 2026-11-29T12:00:00+00:00"
        raise UsageError(f"{option} takes {takes}, not {value!r}.") from None


def message_line(message: Message, *, align: int = 0, cut: int | None = None) -> str:
    """A message on one line: `role: text`, or `role: calls name(arguments), ...`.

    Args:
        message: the message.
        align: right-align the role in this many columns (a transcript).
        cut: squeeze the text's whitespace and cut the line to this many
            characters (a table cell).
    """
    role = message.role.rjust(align)
    if message.tool_calls:
        calls = ", ".join(f"{c.name}({c.arguments})" for c in message.tool_calls)
        return f"{role}: calls {calls}"[:cut]
    text = message.text if cut is None else " ".join(message.text.split())
    marker = " [failed]" if message.failed else ""
    return f"{role}: {text}"[:cut] + marker


def print_table(rows: Sequence[Mapping[str, Any]], columns: Sequence[str], *, empty: str) -> None:
    """Rows as aligned columns under an upper-case header; `empty` when there are none."""
    if not rows:
        print(empty)
        return
    cells = [["" if r[c] is None else str(r[c]) for c in columns] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(columns)]
    print("  ".join(c.upper().ljust(w) for c, w in zip(columns, widths, strict=True)).rstrip())
    for row in cells:
        print("  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip())


def print_json(data: Any) -> None:
    """One line of JSON on stdout.

    `json.dumps`, not pydantic's `dump_json`: the same spacing and ASCII
    escapes the commands have always printed.
    """
    print(json.dumps(data))
