"""Every `chatledger` subcommand, run as a real command in a subprocess (forked
from a warm process, tests/warm.py, where the interpreter's start is not what a
test is about)."""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from chatledger.store import Message, Store
from tests import warm

EXE = [sys.executable, "-m", "chatledger"]


def chatledger(
    *args: str,
    url: str | None = None,
    stdin: str = "",
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    command = [*EXE, *args]
    if url is not None:
        command += ["--database-url", url]
    return warm.run(
        command,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,
        env={**os.environ, **(env or {})},
    )


def one_line_error(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode != 0
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


@pytest.fixture
def seeded(database_url: str) -> tuple[str, str]:
    with Store.open(database_url) as store:
        ledger = store.tenant("cli")
        conv = ledger.create_conversation()
        ledger.append_messages(conv.id, [Message(role="user", content="hello cli")])
        ledger.append_messages(conv.id, [Message(role="assistant", content="hi there")])
    return database_url, conv.id


def test_version_and_help() -> None:
    assert chatledger("--version").stdout.startswith("chatledger ")
    for command in (
        "migrate",
        "demo",
        "history",
        "runs",
        "fork",
        "resume",
        "rebuild",
        "chat",
        "verify",
        "tail",
    ):
        result = chatledger(command, "--help")
        assert result.returncode == 0 and "usage:" in result.stdout, command


def test_demo_runs_offline_and_shows_crash_resume_and_fork(tmp_path: Path) -> None:
    # How long it takes is not asserted here: a timed test fails on a busy machine.
    result = chatledger("demo", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "chatledger.db").exists()
    out = result.stdout
    assert "killed (SIGKILL)" in out
    assert "resumed run" in out and "a second pass finds 0 runs" in out
    assert "fork" in out


def follow_ups(out: str) -> list[list[str]]:
    """The commands the demo ends with, split as a shell would, `chatledger` left off."""
    commands = [shlex.split(line) for line in out.splitlines() if line.startswith("  chatledger ")]
    assert commands and all(c[0] == "chatledger" for c in commands), out
    return [c[1:] for c in commands]


@pytest.mark.parametrize("given_url", [False, True], ids=["default-database", "database-url"])
def test_the_demo_ends_with_commands_that_show_what_it_wrote(
    tmp_path: Path, given_url: bool
) -> None:
    url = f"sqlite:///{tmp_path / 'elsewhere.db'}" if given_url else None
    demo = chatledger("demo", url=url, cwd=tmp_path)
    assert demo.returncode == 0, demo.stderr
    crash = demo.stdout.split("\n2. ")[1].split("\n3. ")[0]
    assert "user: slow weather for Oslo and Cairo, please" in crash, "the killed run's prompt"
    commands = follow_ups(demo.stdout)
    assert [c[0] for c in commands] == ["history", "runs", "audit", "verify"]
    assert all(("--database-url" in c) == given_url for c in commands)

    # Pasted as printed, in the same directory: each one shows what the demo wrote.
    out = {}
    for args in commands:
        result = chatledger(*args, cwd=tmp_path)
        assert result.returncode == 0, (args, result.stderr)
        out[args[0]] = result.stdout
    assert "user: slow weather for Oslo and Cairo, please" in out["history"]
    assert "assistant: Weather: snow, -3 °C; clear, 31 °C." in out["history"]
    crashed = commands[2][2]  # audit timeline RUN
    status = {row.split()[0]: row.split()[2] for row in out["runs"].splitlines()[1:]}
    resumed = re.search(r"as run ([0-9a-f-]+)…", demo.stdout)
    assert resumed is not None, demo.stdout
    assert status[crashed] == "failed"
    assert [s for run, s in status.items() if run.startswith(resumed[1])] == ["completed"]
    assert "tool.started" in out["audit"] and "run.failed" in out["audit"]
    assert "every chain is intact" in out["verify"]


def test_version_loads_no_database_or_http_code() -> None:
    code = (
        "import sys\n"
        "from chatledger.engine._cli import main\n"
        "try:\n"
        "    main(['--version'])\n"
        "except SystemExit:\n"
        "    pass\n"
        "print(' '.join(sorted(sys.modules)))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    version, modules = result.stdout.splitlines()
    assert version.startswith("chatledger ")
    loaded = {name.partition(".")[0] for name in modules.split()}
    # pydantic too: `--version` should answer as fast as the interpreter starts.
    assert not loaded & {"sqlalchemy", "psycopg", "alembic", "httpx", "pydantic"}


def test_import_chatledger_loads_none_of_its_subpackages() -> None:
    code = (
        "import sys, chatledger\n"
        "assert chatledger.__version__\n"
        "print(' '.join(sorted(sys.modules)))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    loaded = set(result.stdout.split())
    assert not {n for n in loaded if n.startswith("chatledger.")}
    assert not {n.partition(".")[0] for n in loaded} & {"sqlalchemy", "pydantic", "httpx"}


def test_the_shortcuts_of_the_root_package_are_the_subpackages_names() -> None:
    import chatledger
    from chatledger import engine, store

    assert chatledger.Store is store.Store and chatledger.AsyncStore is store.AsyncStore
    assert chatledger.Message is store.Message
    assert chatledger.Agent is engine.Agent and chatledger.tool is engine.tool


def test_every_command_names_a_handler_that_exists() -> None:
    from chatledger.engine._cli import _handler, _parser

    def leaves(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
        found = [parser] if parser.get_default("handler") else []
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for sub in action.choices.values():
                    found += leaves(sub)
        return found

    commands = leaves(_parser())
    assert len(commands) == 29  # 19 commands, 4 retention actions and 6 audit questions
    for command in commands:
        assert callable(_handler(command.get_default("handler"))), command.prog


def test_migrate_then_history(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'm.db'}"
    assert chatledger("migrate", url=url).returncode == 0
    with Store.open(url) as store:
        ledger = store.tenant("default")
        conv = ledger.create_conversation()
        ledger.append_messages(conv.id, [Message(role="user", content="from the test")])
    result = chatledger("history", conv.id, "--json", url=url)
    assert json.loads(result.stdout) == [
        {"role": "user", "content": "from the test", "position": 2}
    ]


def test_history_readable_raw_and_at(seeded: tuple[str, str]) -> None:
    url, conv = seeded
    text = chatledger("history", conv, "--tenant", "cli", url=url).stdout
    assert "user: hello cli" in text and "assistant: hi there" in text
    at = chatledger("history", conv, "--tenant", "cli", "--at", "2", "--raw", "--json", url=url)
    assert [m["content"] for m in json.loads(at.stdout)] == ["hello cli"]


def test_fork_prints_the_new_conversation(seeded: tuple[str, str]) -> None:
    url, conv = seeded
    result = chatledger("fork", conv, "--tenant", "cli", "--at", "2", "--json", url=url)
    fork_id = json.loads(result.stdout)["id"]
    history = chatledger("history", fork_id, "--tenant", "cli", "--json", url=url)
    assert [m["content"] for m in json.loads(history.stdout)] == ["hello cli"]


def test_runs_lists_and_filters(seeded: tuple[str, str]) -> None:
    url, conv = seeded
    with Store.open(url) as store:
        ledger = store.tenant("cli")
        cursor = ledger.runs.start(conv, owner="t")
        ledger.runs.fail(cursor, stage="model", error="x", attention="look at me")
    rows = json.loads(
        chatledger("runs", "--tenant", "cli", "--attention", "--json", url=url).stdout
    )
    assert [r["id"] for r in rows] == [cursor.run_id]
    assert rows[0]["attention"] == "look at me"
    table = chatledger("runs", "--tenant", "cli", "--status", "failed", url=url).stdout
    assert cursor.run_id in table and "STATUS" in table


def test_rebuild_reports_views(seeded: tuple[str, str]) -> None:
    url, _ = seeded
    result = chatledger("rebuild", url=url)
    assert result.returncode == 0 and "Rebuilt" in result.stdout


def test_resume_once_with_nothing_to_do(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'idle.db'}"  # its own database: no other test's runs
    assert chatledger("migrate", url=url).returncode == 0
    result = chatledger("resume", "--agent", "tests.agent.cli_agent:agent", "--once", url=url)
    assert result.returncode == 0, result.stderr
    assert "No crashed runs" in result.stdout


def test_chat_without_credentials_says_what_to_set(tmp_path: Path) -> None:
    env = {"OPENAI_API_KEY": "", "OPENAI_BASE_URL": ""}
    line = one_line_error(chatledger("chat", url=f"sqlite:///{tmp_path / 'c.db'}", env=env))
    assert "OPENAI_API_KEY" in line


@pytest.mark.parametrize(
    "args",
    [
        ["history", "not-an-id"],
        ["resume", "--agent", "no_colon"],
        ["resume", "--agent", "missing.module:agent"],
        ["history", "01900000-0000-7000-8000-000000000000", "--at", "yesterday"],
    ],
)
def test_bad_arguments_give_one_clear_line(tmp_path: Path, args: list[str]) -> None:
    url = f"sqlite:///{tmp_path / 'b.db'}"
    chatledger("migrate", url=url)
    one_line_error(chatledger(*args, url=url))


def test_unmigrated_database_gives_one_clear_line(tmp_path: Path) -> None:
    line = one_line_error(chatledger("runs", url=f"sqlite:///{tmp_path / 'new.db'}"))
    assert "chatledger migrate" in line


def test_unreachable_database_gives_one_clear_line() -> None:
    url = "postgresql+psycopg://nobody@127.0.0.1:1/none"
    line = one_line_error(chatledger("runs", url=url))
    assert line.startswith("chatledger: error:")


@pytest.mark.parametrize(
    ("args", "said", "helped"),
    [
        (["runs", "--status", "sideways"], "invalid choice: 'sideways'", "chatledger runs"),
        (["tail", "--limit", "0"], "0 is not from 1 to 10,000", "chatledger tail"),
        (["fork"], "the following arguments are required", "chatledger fork"),
        (["fork", "x", "--at", "many"], "'many' is not a whole number", "chatledger fork"),
        (["audit"], "the following arguments are required", "chatledger audit"),
        (["audit", "events", "--limit", "x"], "invalid int value", "chatledger audit events"),
        (["retention", "set", "--action", "erase"], "--idle-days", "chatledger retention set"),
        (["nosuch"], "invalid choice: 'nosuch'", "chatledger"),
        (["runs", "--bogus"], "unrecognized arguments: --bogus", "chatledger"),
    ],
)
def test_argument_errors_are_one_line_that_points_to_help(
    tmp_path: Path, args: list[str], said: str, helped: str
) -> None:
    result = chatledger(*args, cwd=tmp_path)
    assert result.returncode == 2
    line = one_line_error(result)
    assert line.startswith("chatledger: error: ") and said in line, line
    assert line.endswith(f"; see '{helped} --help'"), line
    assert result.stdout == ""
    assert not list(tmp_path.iterdir()), "nothing is opened, let alone written"


@pytest.mark.parametrize(
    "args",
    [
        ["audit", "events", "--tenant", "cli"],
        ["audit", "events", "--tenant", "cli", "--json"],
        ["history", "CONV", "--tenant", "cli"],
        ["runs", "--tenant", "cli"],
        ["verify"],
        ["tail", "--tenant", "cli"],
        ["export", "--tenant", "cli"],
    ],
)
def test_a_reader_that_is_gone_ends_every_command_quietly(
    seeded: tuple[str, str], args: list[str]
) -> None:
    """`chatledger ... | head -1`, made deterministic: the pipe's read end is
    closed before the command starts, so its first write to stdout fails."""
    url, conv = seeded
    read, write = os.pipe()
    os.close(read)
    try:
        result = subprocess.run(
            [*EXE, *(conv if a == "CONV" else a for a in args), "--database-url", url],
            stdout=write,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
        )
    finally:
        os.close(write)
    assert result.stderr == ""
    assert result.returncode == 141  # as a SIGPIPE death, what a shell shows


def test_a_broken_pipe_that_is_not_stdout_is_an_error(tmp_path: Path) -> None:
    """Only stdout's reader going away ends a command quietly: a broken pipe of
    something else (here the agent's module, as a provider's socket might) is an
    error, said in one line, while stdout's reader is still there."""
    (tmp_path / "pipe_agent.py").write_text(
        "def __getattr__(name):\n    raise BrokenPipeError(32, 'Broken pipe')\n"
    )
    url = f"sqlite:///{tmp_path / 'chat.db'}"
    assert chatledger("migrate", url=url).returncode == 0
    result = subprocess.run(
        [*EXE, "resume", "--once", "--agent", "pipe_agent:agent", "--database-url", url],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(tmp_path)},
    )
    assert result.returncode == 1, (result.returncode, result.stderr)
    assert result.stderr == "chatledger: error: [Errno 32] Broken pipe\n"


def test_verify_reports_intact_chains_and_the_head_digest(seeded: tuple[str, str]) -> None:
    url, conv = seeded
    result = chatledger("verify", "--tenant", "cli", "--conversation", conv, url=url)
    assert result.returncode == 0, result.stderr
    assert "every chain is intact" in result.stdout and "Chain head: " in result.stdout
    rows = json.loads(chatledger("verify", "--json", url=url).stdout)
    assert any(r["conversation"] == conv and r["ok"] for r in rows)


@pytest.mark.parametrize(
    "args",
    [
        ("runs", "--limit", "99999999999999999999"),
        ("runs", "--limit", "0"),
        ("fork", "01900000-0000-7000-8000-000000000000", "--at", "-3"),
        ("audit", "events", "--limit", "99999999999999999999"),
        ("audit", "events", "--after", "99999999999999999999999:1"),
        ("history", "not-an-id"),
        ("verify", "--tenant", ""),
        ("verify", "--conversation", "01900000-0000-7000-8000-000000000000", "--tenant", ""),
    ],
)
def test_bad_arguments_get_a_sentence_never_a_traceback(
    seeded: tuple[str, str], args: tuple[str, ...]
) -> None:
    url, _ = seeded
    result = chatledger(*args, url=url)
    assert result.returncode != 0
    assert "Traceback" not in result.stderr and "Traceback" not in result.stdout
    assert "error" in result.stderr


def test_an_empty_tenant_is_refused_not_taken_as_every_tenant(seeded: tuple[str, str]) -> None:
    url, _ = seeded
    line = one_line_error(chatledger("verify", "--tenant", "", url=url))
    assert "tenant ''" in line


def test_the_demo_prints_no_password() -> None:
    from chatledger.engine._cli._demo import _hidden

    assert (
        _hidden("postgresql+psycopg://u:s3cret@h:5432/db") == "postgresql+psycopg://u:***@h:5432/db"
    )
    assert _hidden("sqlite:////tmp/a b.db") == "sqlite:////tmp/a b.db"
