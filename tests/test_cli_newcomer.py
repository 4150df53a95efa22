"""The command line a newcomer meets (issue 35): finding conversations, positions,
resuming one run, errors in the command's own terms, progress, `--json`, and the
small things. Every test runs the installed `chatledger` command in a subprocess
(forked from a warm process, tests/warm.py, unless it is about the terminal),
on both databases where the database matters."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import select
import shutil
import struct
import subprocess
import sys
import termios
import uuid
from pathlib import Path

import pytest
from sqlalchemy import inspect

from chatledger.store import Message, NewEvent, Store
from tests import warm

COMMAND = Path(sys.executable).with_name("chatledger")
AGENT = "tests.agent.cli_agent:agent"


def run(
    *args: str, url: str | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """The installed command, stdout and stderr piped."""
    command = [str(COMMAND), *args] + (["--database-url", url] if url else [])
    return warm.run(
        command,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **(env or {})},
        stdin=subprocess.DEVNULL,
    )


def ok(*args: str, url: str | None = None) -> str:
    result = run(*args, url=url)
    assert result.returncode == 0, result.stderr
    return result.stdout


def error_line(*args: str, url: str | None = None) -> str:
    """The one line a refused command prints on stderr (exit 1, nothing on stdout)."""
    result = run(*args, url=url)
    assert result.returncode == 1, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr and result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


def on_a_terminal(*args: str, url: str) -> tuple[str, str]:
    """Run the command with stderr on a pseudo-terminal: (stdout, what the terminal got)."""
    master, slave = pty.openpty()
    # A new pseudo-terminal is 0 columns wide, where a bar has no room at all.
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
    process = subprocess.Popen(
        [str(COMMAND), *args, "--database-url", url],
        stdout=subprocess.PIPE,
        stderr=slave,
        stdin=subprocess.DEVNULL,
    )
    os.close(slave)
    terminal = b""
    while True:  # until the child closes the terminal (EOF, or EIO on Linux)
        select.select([master], [], [], 60)
        try:
            chunk = os.read(master, 65536)
        except OSError:
            break
        if not chunk:
            break
        terminal += chunk
    os.close(master)
    out = process.communicate(timeout=120)[0]
    assert process.returncode == 0, terminal
    return out.decode(), terminal.decode()


@pytest.fixture
def tenant() -> str:
    return f"t-{uuid.uuid4().hex[:10]}"


# -- item 1: finding things -------------------------------------------------------------


def test_conversations_lists_the_tenants_conversations_newest_first(
    database_url: str, tenant: str
) -> None:
    with Store.open(database_url) as store:
        ledger = store.tenant(tenant)
        first = ledger.create_conversation(key="support-42").id
        second = ledger.create_conversation().id
        ledger.append_messages(second, [Message(role="user", content="hi")])
        third = ledger.create_conversation().id  # no message, no run
        store.tenant(f"{tenant}-other").create_conversation()

    rows = json.loads(ok("conversations", "--tenant", tenant, "--json", url=database_url))
    assert [r["id"] for r in rows] == [third, second, first]
    assert [r["head"] for r in rows] == [1, 2, 1]
    assert rows[2]["key"] == "support-42" and rows[0]["key"] is None
    assert all(r["subject"] is None and r["createdAt"] for r in rows)

    limited = ok("conversations", "--tenant", tenant, "--limit", "2", "--json", url=database_url)
    assert [r["id"] for r in json.loads(limited)] == [third, second]
    after = ok("conversations", "--tenant", tenant, "--before", second, "--json", url=database_url)
    assert [r["id"] for r in json.loads(after)] == [first]

    table = ok("conversations", "--tenant", tenant, url=database_url).splitlines()
    assert table[0].split() == ["ID", "KEY", "SUBJECT", "HEAD", "CREATED"]
    assert [line.split()[0] for line in table[1:]] == [third, second, first]

    empty = ok("conversations", "--tenant", f"{tenant}-none", url=database_url)
    assert empty.strip() == f"Tenant '{tenant}-none' has no conversations."


def test_history_without_a_conversation_shows_the_newest_one(
    database_url: str, tenant: str
) -> None:
    with Store.open(database_url) as store:
        ledger = store.tenant(tenant)
        older = ledger.create_conversation().id
        ledger.append_messages(older, [Message(role="user", content="older")])
        newest = ledger.create_conversation().id
        ledger.append_messages(newest, [Message(role="user", content="newest")])

    out = ok("history", "--tenant", tenant, url=database_url)
    assert newest in out.splitlines()[0] and "chatledger conversations" in out.splitlines()[0]
    assert "user: newest" in out and "older" not in out
    as_json = json.loads(ok("history", "--tenant", tenant, "--json", url=database_url))
    assert [m["content"] for m in as_json] == ["newest"]

    line = error_line("history", "--tenant", f"{tenant}-none", url=database_url)
    assert f"'{tenant}-none' has no conversations" in line and "--tenant" in line


def test_history_shows_each_messages_position_to_fork_at(database_url: str, tenant: str) -> None:
    with Store.open(database_url) as store:
        ledger = store.tenant(tenant)
        conv = ledger.create_conversation().id
        ledger.append_messages(
            conv,
            [
                Message(role="user", content="one"),
                Message(role="assistant", content="two"),
                Message(role="user", content="three"),
            ],
        )

    lines = ok("history", conv, "--tenant", tenant, url=database_url).splitlines()
    assert [line.split()[:2] for line in lines] == [
        ["2", "user:"],
        ["3", "assistant:"],
        ["4", "user:"],
    ]
    rows = json.loads(ok("history", conv, "--tenant", tenant, "--json", url=database_url))
    assert [(m["position"], m["content"]) for m in rows] == [(2, "one"), (3, "two"), (4, "three")]

    # The position printed beside "two" is the --at that keeps "one" and "two".
    fork = json.loads(ok("fork", conv, "--at", "3", "--tenant", tenant, "--json", url=database_url))
    kept = json.loads(ok("history", fork["id"], "--tenant", tenant, "--json", url=database_url))
    assert [m["content"] for m in kept] == ["one", "two"]

    help_text = " ".join(ok("history", "--help").split())
    assert "events on the conversation's branch" in help_text and "fork --at" in help_text

    # A position past the head names the range, in words a command-line user can act on.
    line = error_line("fork", conv, "--at", "9", "--tenant", tenant, url=database_url)
    assert "runs from 1 to 4. Pass a position in that range" in line and "Position(" not in line


# -- item 2: resuming ---------------------------------------------------------------------


def test_resume_once_names_the_runs_still_running_and_when_their_lease_runs_out(
    own_database: str,
) -> None:
    with Store.open(own_database) as store:
        ledger = store.tenant("acme")
        conv = ledger.create_conversation().id
        cursor = ledger.runs.start(conv, owner="a-live-process")  # the default lease: 60 s
        expires = ledger.runs.get(cursor.run_id).lease_expires_at
    assert expires is not None
    out = ok("resume", "--agent", AGENT, "--once", url=own_database)
    assert out.startswith("No crashed runs to resume: 1 run is still running under a live lease")
    assert expires.isoformat(timespec="seconds") in out
    assert "60 s" in out and f"chatledger resume {cursor.run_id}" not in out
    assert "chatledger resume RUN_ID" in out


def test_resume_run_id_says_why_not_in_a_sentence_for_each_state(
    database_url: str, tenant: str
) -> None:
    with Store.open(database_url) as store:
        ledger = store.tenant(tenant)
        live = ledger.runs.start(ledger.create_conversation().id, owner="alive")
        done = ledger.runs.start(ledger.create_conversation().id, owner="done")
        ledger.runs.complete(done)
    args = ("--agent", AGENT, "--tenant", tenant)

    line = error_line("resume", live.run_id, *args, url=database_url)
    assert f"Run '{live.run_id}' is still running" in line and "lease" in line
    line = error_line("resume", done.run_id, *args, url=database_url)
    assert f"Run '{done.run_id}' completed" in line and "nothing to resume" in line
    missing = str(uuid.uuid4())
    line = error_line("resume", missing, *args, url=database_url)
    assert "--tenant" in line and "store.tenant" not in line
    line = error_line("resume", live.run_id, "--once", *args, url=database_url)
    assert "--once" in line
    line = error_line("resume", "--once", *args, url=database_url)
    assert "serves every tenant" in line


def test_resume_run_id_resumes_a_crashed_run_and_a_canceled_one_once(
    database_url: str, tenant: str
) -> None:
    prompt = NewEvent.of_message(Message(role="user", content="Weather in Oslo?"))
    with Store.open(database_url) as store:
        ledger = store.tenant(tenant)
        crashed = ledger.runs.start(
            ledger.create_conversation().id, owner="dead", lease_seconds=0, events=[prompt]
        )
        canceled = ledger.runs.start(ledger.create_conversation().id, owner="gone", events=[prompt])
        ledger.runs.fail(canceled, stage="disconnect", error="the client went away", canceled=True)

    for cursor in (crashed, canceled):
        out = ok("resume", cursor.run_id, "--agent", AGENT, "--tenant", tenant, url=database_url)
        assert out.startswith(f"Resumed run {cursor.run_id} as run ")
        line = error_line(
            "resume", cursor.run_id, "--agent", AGENT, "--tenant", tenant, url=database_url
        )
        assert "was resumed already by run" in line
    with Store.open(database_url) as store:
        ledger = store.tenant(tenant)
        assert ledger.runs.get(crashed.run_id).stage == "crashed"
        for cursor in (crashed, canceled):
            (resume,) = [
                r for r in ledger.runs.recent(conversation_id=cursor.conversation_id) if r.resumes
            ]
            assert resume.status == "completed"


def test_resume_takes_protected_tools_on_the_command_line(own_database: str) -> None:
    with Store.open(own_database) as store:
        ledger = store.tenant("acme")
        prompt = NewEvent.of_message(Message(role="user", content="Weather in Oslo?"))
        cursor = ledger.runs.start(ledger.create_conversation().id, owner="dead", events=[prompt])
        _, cursor = ledger.runs.record(
            cursor, [NewEvent("tool.started", {"callId": "c1", "name": "weather"})]
        )
        ledger.runs.renew_lease(cursor, 0)  # its process died: the lease runs out now
    out = ok(
        "resume",
        "--agent",
        AGENT,
        "--once",
        "--protected-tool",
        "weather",
        "--json",
        url=own_database,
    )
    (outcome,) = [json.loads(line) for line in out.splitlines()]
    assert outcome["run"] == cursor.run_id and outcome["action"] == "attention"
    assert "c1 (weather)" in outcome["detail"]


def test_the_lease_default_is_one_minute_in_the_code_and_the_docs() -> None:
    help_text = ok("resume", "--help")
    assert "default: 60" in help_text
    docs = Path(__file__).parents[1] / "docs" / "operations.md"
    text = " ".join(docs.read_text().split())
    assert "`--lease-seconds` (default 60" in text and "(default 30)" not in text


# -- item 4: errors in the command's own terms ----------------------------------------


def test_a_missing_conversation_is_explained_with_the_commands_options(
    database_url: str, tenant: str
) -> None:
    missing = str(uuid.uuid4())
    line = error_line("history", missing, "--tenant", tenant, url=database_url)
    assert "store.tenant" not in line
    assert f"no conversation '{missing}' in tenant '{tenant}'" in line
    assert "--tenant" in line and "--database-url" in line


def test_audit_request_without_the_agent_or_instructions_names_them(
    database_url: str, tenant: str
) -> None:
    from tests.agent.cli_agent import agent

    with Store.open(database_url) as store:
        result = agent.run(store.tenant(tenant), "Weather in Oslo?")
    line = error_line("audit", "request", result.run_id, "1", "--tenant", tenant, url=database_url)
    assert "--agent" in line and "--instructions" in line
    assert "e3b0c44298fc1c14" not in line  # the sha256 of an empty string
    out = ok(
        "audit",
        "request",
        result.run_id,
        "1",
        "--tenant",
        tenant,
        "--instructions",
        "Answer briefly.",
        url=database_url,
    )
    assert "user: Weather in Oslo?" in out


# -- item 5: progress -------------------------------------------------------------------


@pytest.fixture
def long_work(database_url: str, tenant: str, tmp_path: Path) -> tuple[str, str, Path]:
    """A tenant with three conversations and a retention policy, and its export file."""
    with Store.open(database_url) as store:
        ledger = store.tenant(tenant)
        for text in ("a", "b", "c"):
            conv = ledger.create_conversation().id
            ledger.append_messages(conv, [Message(role="user", content=text)])
        ledger.retention.set(30, "erase")
    export = tmp_path / "export.jsonl"
    ok("export", "--tenant", tenant, "--output", str(export), url=database_url)
    return database_url, tenant, export


def long_commands(tenant: str, export: Path) -> list[tuple[list[str], str, str]]:
    """(arguments, the bar's label, the summary line's start) of every long command, in
    an order that works on an empty database."""
    return [
        (["migrate"], "migrating", "Created chatledger's tables"),
        (["import", str(export)], "importing", "Imported 3 conversations"),
        (["verify", "--tenant", tenant], "verifying", "Verified 3 conversations"),
        (["rebuild", "--tenant", tenant], "rebuilding", "Rebuilt the views of 3 conversations"),
        (
            ["export", "--tenant", tenant, "-o", str(export)],
            "exporting",
            "Exported 3 conversations",
        ),
        (["retention", "run", "--tenant", tenant], "applying retention", "Nothing is due."),
    ]


@pytest.mark.parametrize("stderr", ["terminal", "piped"])
def test_long_commands_show_a_bar_on_a_terminal_and_only_their_result_when_piped(
    long_work: tuple[str, str, Path], empty_url: str, stderr: str
) -> None:
    _, tenant, export = long_work
    for args, bar, summary in long_commands(tenant, export):
        if args[0] == "retention":
            policy = ["--tenant", tenant, "--idle-days", "30", "--action", "erase"]
            ok("retention", "set", *policy, url=empty_url)
        if stderr == "terminal":
            out, terminal = on_a_terminal(*args, url=empty_url)
            assert f"\r{bar}: " in terminal, (args, terminal)  # tqdm's bar, rewritten in place
            assert summary in (terminal if args[0] == "export" else out), (args, out, terminal)
            continue
        result = run(*args, url=empty_url)
        assert result.returncode == 0, result.stderr
        if args[0] == "export":  # stdout is the export's: the summary is on stderr
            assert result.stdout == "" and result.stderr.startswith(summary)
            assert result.stderr.count("\n") == 1
        else:
            assert result.stderr == "", (args, result.stderr)
            assert summary in result.stdout, (args, result.stdout)


# -- item 6: --json everywhere -----------------------------------------------------------


def test_every_command_that_writes_answers_in_json(
    database_url: str, tenant: str, tmp_path: Path
) -> None:
    with Store.open(database_url) as store:
        conv = store.tenant(tenant).create_conversation().id
    fresh = f"sqlite:///{tmp_path / 'fresh.db'}"
    created = json.loads(ok("migrate", "--json", url=fresh))
    assert created == {"created": True, "from": None, "revision": created["revision"]}
    again = json.loads(ok("migrate", "--json", url=fresh))
    assert again == {"created": False, "from": created["revision"], "revision": created["revision"]}
    rebuilt = json.loads(ok("rebuild", "--tenant", tenant, "--json", url=database_url))
    assert rebuilt == {"tenant": tenant, "conversations": 1}
    policy = json.loads(
        ok(
            "retention",
            "set",
            "--tenant",
            tenant,
            "--idle-days",
            "7",
            "--action",
            "erase",
            "--json",
            url=database_url,
        )
    )
    assert policy == {"tenant": tenant, "idleDays": 7, "action": "erase"}
    key = json.loads(ok("api-key", tenant, "--json"))
    assert key["tenant"] == tenant and key["key"] and key["digest"]
    export = tmp_path / "one.jsonl"
    exported = json.loads(
        ok(
            "export",
            "--tenant",
            tenant,
            "--conversation",
            conv,
            "-o",
            str(export),
            "--json",
            url=database_url,
        )
    )
    assert exported["conversations"] == 1 and exported["file"] == str(export)
    assert exported["sha256"] and exported["events"] >= 1
    result = run(
        "rotate-kek",
        "--json",
        url=fresh,
        env={
            "CHATLEDGER_KEK": "00" * 32,
            "CHATLEDGER_NEW_KEK": "11" * 32,
        },
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == {
        "rewrapped": 0,
        "kekId": json.loads(result.stdout)["kekId"],
    }


def test_migrate_takes_partitions_and_refuses_them_on_sqlite(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'p.db'}"
    line = error_line("migrate", "--partitions", "4", url=url)
    assert "Postgres" in line or "SQLite" in line
    assert "`chatledger migrate`" in line  # advice a user of the command can follow
    assert not (tmp_path / "p.db").exists() or "chatledger_events" not in ok("history", url=url)


def test_migrate_partitions_on_postgres(empty_url: str, backend: str) -> None:
    if backend != "postgres":
        pytest.skip("partitions are Postgres'")
    out = json.loads(ok("migrate", "--partitions", "4", "--json", url=empty_url))
    assert out["created"] is True and out["partitions"] == 4


def test_migrate_citus_is_refused_where_there_is_no_citus_and_writes_nothing(
    empty_url: str, backend: str
) -> None:
    line = error_line("migrate", "--citus", url=empty_url)
    if backend == "sqlite":
        assert "Citus is for Postgres" in line
    else:
        assert "no citus extension" in line and "without --citus" in line
        with Store.open(empty_url) as store, store.engine.connect() as conn:
            assert not inspect(conn).has_table("chatledger_events")  # one transaction
    line = error_line("migrate", "--citus", "--partitions", "4", url=empty_url)
    assert "--partitions" in line  # two layouts, or partitions on SQLite: refused either way


# -- item 9: small things -------------------------------------------------------------------


def test_counts_agree_with_their_nouns(database_url: str, tenant: str) -> None:
    with Store.open(database_url) as store:
        conv = store.tenant(tenant).create_conversation().id
    out = ok("verify", "--tenant", tenant, "--conversation", conv, url=database_url)
    assert out.startswith("Verified 1 conversation, 1 event: every chain is intact.")


def test_an_uppercase_id_is_the_same_id(database_url: str, tenant: str) -> None:
    with Store.open(database_url) as store:
        conv = store.tenant(tenant).create_conversation().id
        store.tenant(tenant).append_messages(conv, [Message(role="user", content="hello")])
    out = ok("history", conv.upper(), "--tenant", tenant, url=database_url)
    assert "user: hello" in out
    # Lower-casing never reaches another tenant's conversation.
    line = error_line("history", conv.upper(), "--tenant", f"{tenant}-other", url=database_url)
    assert f"no conversation '{conv}'" in line


def test_a_fresh_migrate_says_it_created_the_tables(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'new.db'}"
    assert ok("migrate", url=url).startswith("Created chatledger's tables")
    assert ok("migrate", url=url).startswith("chatledger's tables are already at the newest")


def test_an_unreachable_server_is_named_in_whole_sentences() -> None:
    line = error_line("runs", url="postgresql+psycopg://nobody@127.0.0.1:1/none")
    assert "?." not in line and "refused Is" not in line
    assert "Connection refused. Is the server running" in line


def test_bash_completes_a_subcommand_name(tmp_path: Path) -> None:
    script = ok("completion", "bash")
    assert "complete " in script and "chatledger" in script
    assert "compdef" in ok("completion", "zsh") or "#compdef" in ok("completion", "zsh")
    if shutil.which("bash") is None:
        pytest.skip("no bash")
    (tmp_path / "completion.bash").write_text(script)
    probe = (
        f"source {tmp_path / 'completion.bash'}\n"
        "COMP_LINE='chatledger conv'; COMP_POINT=${#COMP_LINE}\n"
        "COMP_WORDS=(chatledger conv); COMP_CWORD=1\n"
        "_python_argcomplete chatledger conv chatledger\n"
        'printf "%s\\n" "${COMPREPLY[@]}"\n'
    )
    done = subprocess.run(
        ["bash", "--norc", "-c", probe],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PATH": f"{COMMAND.parent}{os.pathsep}{os.environ['PATH']}"},
    )
    assert done.stdout.split() == ["conversations"], done.stderr
