"""`chatledger tail`, run as a real command in a subprocess, on both backends.

On Postgres a tail holds back every event behind the oldest transaction open
on the whole server (other test runs included), and without `--follow` it
exits once caught up with what it may give. So each test first waits until
its tenant's events are settled (`settled`) before it runs the command
without `--follow`.
"""

from __future__ import annotations

import json
import queue
import signal
import subprocess
import threading
import time
import uuid
from typing import Any

import pytest

from chatledger.store import Message, Store
from chatledger.store._sql.pages import position
from tests.test_cli import EXE, chatledger, one_line_error

DEADLINE = 30.0


def settled(url: str, tenant: str) -> None:
    """Wait until none of `tenant`'s committed events is held back by an open transaction."""
    deadline = time.monotonic() + DEADLINE
    with Store.open(url) as store:
        while store.tenant(tenant).audit.events(limit=10_000).pending:
            assert time.monotonic() < deadline, "events stayed held back"
            time.sleep(0.01)


@pytest.fixture
def seeded(database_url: str) -> tuple[str, str, str]:
    """A tenant of its own with one conversation of three messages: (url, tenant, conversation)."""
    tenant = f"tail-{uuid.uuid4().hex[:8]}"
    with Store.open(database_url) as store:
        ledger = store.tenant(tenant)
        conv = ledger.create_conversation().id
        for text in ("one", "two", "three"):
            ledger.append_messages(conv, [Message(role="user", content=text)])
    settled(database_url, tenant)
    return database_url, tenant, conv


def lines(result: subprocess.CompletedProcess[str]) -> list[dict[str, Any]]:
    assert result.returncode == 0, result.stderr
    return [json.loads(line) for line in result.stdout.splitlines()]


def contents(rows: list[dict[str, Any]]) -> list[str]:
    return [r["payload"]["content"] for r in rows if r["kind"] == "message.recorded"]


def test_tail_prints_every_event_in_commit_order_with_its_page_cursor(
    seeded: tuple[str, str, str],
) -> None:
    url, tenant, conv = seeded
    rows = lines(chatledger("tail", "--tenant", tenant, "--json", "--limit", "2", url=url))
    with Store.open(url) as store:
        page = store.tenant(tenant).audit.events(limit=100)
    assert [r["seq"] for r in rows] == [e.seq for e in page.items]
    assert [r["kind"] for r in rows] == ["conversation.created"] + ["message.recorded"] * 3
    assert contents(rows) == ["one", "two", "three"]
    assert {r["conversationId"] for r in rows} == {conv}
    # The events command's JSON row, plus the cursor of the page it came in.
    assert {"id", "seq", "recordedAt", "payload", "after"} <= set(rows[0])
    assert not {"idempotencyKey", "hash"} & set(rows[0])
    # Pages of 2: the lines of a page share its cursor; the last one is the log's.
    assert [r["after"] for r in rows[:2]] == [rows[1]["after"]] * 2
    assert rows[2]["after"] == rows[3]["after"] != rows[1]["after"]
    # The last page's cursor is at or past the log's end (a page that is not
    # full moves past what is settled): nothing comes after it.
    assert position(rows[3]["after"]) >= position(page.next_after)
    # A page's last line says so: its `after` may be stored once it is handled.
    assert [r["last"] for r in rows[:4]] == [False, True, False, True]


def test_tail_resumes_after_a_printed_cursor(seeded: tuple[str, str, str]) -> None:
    url, tenant, conv = seeded
    rows = lines(chatledger("tail", "--tenant", tenant, "--json", "--limit", "2", url=url))
    resumed = lines(
        chatledger("tail", "--tenant", tenant, "--json", "--after", rows[1]["after"], url=url)
    )
    assert contents(resumed) == ["two", "three"]
    assert (
        lines(
            chatledger("tail", "--tenant", tenant, "--json", "--after", rows[-1]["after"], url=url)
        )
        == []
    )

    with Store.open(url) as store:
        store.tenant(tenant).append_messages(conv, [Message(role="user", content="four")])
    settled(url, tenant)
    later = lines(
        chatledger("tail", "--tenant", tenant, "--json", "--after", rows[-1]["after"], url=url)
    )
    assert contents(later) == ["four"]


def test_tail_prints_a_table_one_event_a_line(seeded: tuple[str, str, str]) -> None:
    url, tenant, _ = seeded
    result = chatledger("tail", "--tenant", tenant, url=url)
    assert result.returncode == 0, result.stderr
    header, *rows = result.stdout.splitlines()
    assert header.split() == [
        "SEQ",
        "KIND",
        "ORIGIN",
        "CONVERSATION",
        "RUN",
        "POS",
        "RECORDED",
        "WHAT",
    ]
    assert [r.split()[1] for r in rows] == ["conversation.created"] + ["message.recorded"] * 3
    assert rows[-1].endswith("user: three")
    empty = chatledger("tail", "--tenant", f"none-{uuid.uuid4().hex[:8]}", url=url)
    assert (empty.returncode, empty.stdout) == (0, "No events.\n")


def test_tail_of_one_conversation_leaves_the_others_out(seeded: tuple[str, str, str]) -> None:
    url, tenant, conv = seeded
    with Store.open(url) as store:
        ledger = store.tenant(tenant)
        other = ledger.create_conversation().id
        ledger.append_messages(other, [Message(role="user", content="elsewhere")])
    settled(url, tenant)
    assert contents(lines(chatledger("tail", "--tenant", tenant, "--json", url=url))) == [
        "one",
        "two",
        "three",
        "elsewhere",
    ]
    mine = lines(chatledger("tail", "--tenant", tenant, "--json", "--conversation", conv, url=url))
    assert contents(mine) == ["one", "two", "three"]
    assert {r["conversationId"] for r in mine} == {conv}


def test_another_tenants_conversation_is_not_found(seeded: tuple[str, str, str]) -> None:
    url, _, conv = seeded
    result = chatledger("tail", "--tenant", "someone-else", "--conversation", conv, url=url)
    assert "in tenant 'someone-else'" in one_line_error(result)
    assert result.stdout == ""


@pytest.mark.parametrize("cursor", ["x", "12", "1:2:3", "a:5", "1:99999999999999999999"])
def test_a_bad_cursor_is_one_line(seeded: tuple[str, str, str], cursor: str) -> None:
    url, tenant, _ = seeded
    result = chatledger("tail", "--tenant", tenant, "--after", cursor, url=url)
    assert "is not an audit cursor" in one_line_error(result)


class Lines:
    """A subprocess's stdout, line by line, each wait with a deadline."""

    def __init__(self, process: subprocess.Popen[str]) -> None:
        self._lines: queue.Queue[str] = queue.Queue()
        assert process.stdout is not None
        self._stdout = process.stdout
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self._stdout:
            self._lines.put(line)

    def next(self) -> dict[str, Any]:
        try:
            line = self._lines.get(timeout=DEADLINE)
        except queue.Empty:
            raise AssertionError(f"no line within {DEADLINE} s") from None
        return json.loads(line)  # type: ignore[no-any-return]

    def close(self) -> None:
        """Once the process has ended: the reader has met the end of its stdout."""
        self._reader.join(timeout=DEADLINE)
        self._stdout.close()


def test_follow_prints_what_commits_later_and_ends_on_sigint(
    seeded: tuple[str, str, str],
) -> None:
    url, tenant, conv = seeded
    process = subprocess.Popen(
        [*EXE, "tail", "--tenant", tenant, "--follow", "--json", "--database-url", url],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # A test run started in the background inherits SIGINT ignored, and
        # Python keeps it so; Ctrl-C is what this test is about.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    out = Lines(process)
    try:
        # Four lines (the conversation and its messages): the tail has read what
        # was there and is following.
        assert contents([out.next() for _ in range(4)]) == ["one", "two", "three"]
        with Store.open(url) as store:
            store.tenant(tenant).append_messages(conv, [Message(role="user", content="later")])
        line = out.next()
        assert (line["kind"], line["payload"]["content"]) == ("message.recorded", "later")
        assert line["after"]

        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=DEADLINE) == 130
        assert process.stderr is not None
        assert process.stderr.read().strip() == "chatledger: interrupted"
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        out.close()
        assert process.stderr is not None
        process.stderr.close()


@pytest.mark.parametrize(
    "cursor", [f"0:{2**63}", f"{2**63}:1", "9999999999999999999:0", "\uff11:\uff12", f"{2**62}:0"]
)
def test_a_cursor_chatledger_never_printed_is_one_line_naming_it(
    seeded: tuple[str, str, str], cursor: str
) -> None:
    url, tenant, _ = seeded
    result = chatledger("tail", "--tenant", tenant, "--after", cursor, url=url)
    line = one_line_error(result)
    assert line.startswith("chatledger: error:") and repr(cursor) in line, line
    assert "internal error" not in line and result.returncode == 1
    assert result.stdout == ""
