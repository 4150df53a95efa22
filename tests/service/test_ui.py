"""The read-only page under `/ui/`, in a real headless browser and over HTTP.

The browser tests click through what `chatledger demo` writes, served by a real
`chatledger ui` process; the browser is Debian's chromium (skipped without it,
except under `CI=true`, where it fails). Screenshots go to `$CHATLEDGER_UI_SCREENSHOTS`
when set (docs/ui.md's come from `CHATLEDGER_UI_SCREENSHOTS=docs/ui`).
"""

from __future__ import annotations

import base64
import os
import re
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest

from chatledger.service._ui import PAGE, create_ui_app
from chatledger.store import Message, Store, ToolCall
from tests.service.agents import weather_agent
from tests.service.conftest import Server, Tenants
from tests.service.test_docs_browser import _browser

EXE = [sys.executable, "-m", "chatledger"]
HOSTILE = [
    "<script>window.__pwned = 1</script>",
    '<img src=x onerror="window.__pwned = 2">',
    "javascript:window.__pwned=3",
    '"><svg onload="window.__pwned=4">',
]


@contextmanager
def chatledger_ui(url: str, *options: str) -> Iterator[str]:
    """A real `chatledger ui` process on a free port; yields the URL it prints."""
    with subprocess.Popen(
        [*EXE, "ui", "--database-url", url, "--port", "0", *options],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as process:
        try:
            assert process.stdout is not None
            line = process.stdout.readline()
            found = re.search(r"http://\S+/ui/", line)
            assert found, (
                f"chatledger ui printed {line!r}; stderr: {process.stderr.read() if process.stderr else ''}"
            )
            yield found.group(0)
        finally:
            process.send_signal(signal.SIGINT)
            process.communicate(timeout=60)
    assert process.returncode == 0


class Browser:
    """A headless chromium page that records what leaves the machine and console errors."""

    def __init__(self, playwright: Any, shots: Path) -> None:
        self.browser = playwright.chromium.launch(
            executable_path=str(_browser()), args=["--no-sandbox"]
        )
        self.page = self.browser.new_page(viewport={"width": 1280, "height": 900})
        self.outside: list[str] = []
        self.errors: list[str] = []
        self.dialogs: list[str] = []
        self.shots = shots
        self.page.route("**/*", self._route)
        self.page.on("console", lambda m: self.errors.append(m.text) if m.type == "error" else None)
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        self.page.on("dialog", lambda d: (self.dialogs.append(d.message), d.dismiss()))

    def _route(self, route: Any) -> None:
        if urlsplit(route.request.url).hostname == "127.0.0.1":
            route.continue_()
        else:
            self.outside.append(route.request.url)
            route.abort()

    def shot(self, name: str) -> None:
        self.page.screenshot(path=str(self.shots / f"{name}.png"), full_page=True)

    def close(self) -> None:
        self.browser.close()


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[Browser]:
    from playwright.sync_api import sync_playwright

    _browser()
    shots = Path(os.environ.get("CHATLEDGER_UI_SCREENSHOTS") or tmp_path)
    shots.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as playwright:
        opened = Browser(playwright, shots)
        try:
            yield opened
        finally:
            opened.close()


def test_clicking_through_the_demo(browser: Browser, tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'demo.db'}"
    demo = subprocess.run(
        [*EXE, "demo", "--database-url", url], capture_output=True, text=True, timeout=300
    )
    assert demo.returncode == 0, demo.stderr
    with Store.open(url) as store:
        ledger = store.tenant("default")
        runs = ledger.runs.recent(limit=100)
        resumed = next(r for r in runs if r.resumes)
        source = next(c for c in ledger.conversations() if ledger.audit.lineage(c.id).forks)
        fork = ledger.audit.lineage(source.id).forks[0]
        crashed = ledger.runs.get(str(resumed.resumes))
    assert resumed.conversation_id == source.id

    page = browser.page
    with chatledger_ui(url) as ui:
        page.goto(ui)
        rows = page.locator("#conversations tr.conversation")
        assert rows.count() == 2
        browser.shot("conversations")
        page.click(f'a[href="/ui/conversations/{source.id}"]')

        # The crashed-and-resumed conversation: a timeline with its tool calls
        # beside their results, positions, runs and a verified chain.
        page.wait_for_selector("ol.timeline")
        assert page.locator("li.message.user").count() >= 1
        calls = page.locator("table.calls tr.call")
        assert calls.count() >= 2
        assert all("weather" in t or "Sunny" in t or "°" in t for t in calls.all_inner_texts())
        assert page.locator(".position").count() >= 4
        assert page.locator(".badge.verified").count() == 1
        assert page.locator("#runs tr.run").count() == len(
            [r for r in runs if r.conversation_id == source.id]
        )
        browser.shot("conversation")

        page.click("text=Raw events")
        kinds = page.locator("#events tr.event td:nth-child(2)").all_inner_texts()
        assert {"conversation.created", "run.started", "run.failed", "tool.started"} <= set(kinds)
        browser.shot("raw")

        page.click("text=Branches")
        branches = page.locator("#branches tr.branch")
        reasons = page.locator("#branches tr.branch td:nth-child(4)").all_inner_texts()
        assert "resume" in reasons and "root" in reasons
        assert page.locator("#branches tr.branch.head .badge.head").count() == 1
        assert page.locator(f'#forks a[href="/ui/conversations/{fork.id}"]').count() == 1
        browser.shot("branches")
        assert branches.count() >= 2

        page.click("text=Compare A and B")  # A: the first branch, B: the head
        page.wait_for_selector("#side-a")
        assert "share" in page.locator(".fork-point").inner_text()
        assert page.locator("#side-b li.message").count() >= 1
        browser.shot("compare")

        page.go_back()
        page.click(f'#forks a[href="/ui/conversations/{fork.id}"]')
        assert "forked from" in page.locator(".facts").inner_text()
        assert "Cairo" in page.locator("ol.timeline").inner_text()

        page.goto(f"{ui}conversations/{source.id}")
        page.click(f'#runs a[href="/ui/runs/{resumed.id}"]')
        assert page.locator("#steps tr.step").count() >= 3
        assert page.locator("#steps code.digest").count() >= 1
        assert page.locator("#tools tr.tool").count() >= 1
        browser.shot("run")
        page.click("a.resumes")
        assert page.locator(".badge.status").inner_text() == crashed.status == "failed"
        assert crashed.stage
        assert page.locator("b.stage").inner_text() == crashed.stage
        assert page.locator(f'a.resumed-by[href="/ui/runs/{resumed.id}"]').count() == 1
    assert browser.outside == []
    assert browser.errors == []


def _hostile_conversation(ledger: Any) -> str:
    call = ToolCall(
        id="c1", name=HOSTILE[1], arguments='{"q": "' + HOSTILE[0].replace('"', "'") + '"}'
    )
    conversation = ledger.create_conversation({"title": HOSTILE[0]}, key=HOSTILE[1])
    ledger.append_messages(
        conversation.id,
        [
            Message(role="user", content=" ".join(HOSTILE)),
            Message(role="assistant", content=HOSTILE[3], tool_calls=[call]),
            Message(role="tool", tool_call_id="c1", content=HOSTILE[2]),
        ],
    )
    return conversation.id


@pytest.mark.parametrize("backend", ["sqlite"])
def test_hostile_content_renders_as_text(browser: Browser, database_url: str) -> None:
    with Store.open(database_url) as store:
        conversation = _hostile_conversation(store.tenant("t"))
    with Server(create_ui_app(database_url, tenant="t")) as server:
        page = browser.page
        for path in (
            "/ui/",
            f"/ui/conversations/{conversation}",
            f"/ui/conversations/{conversation}?raw=true",
            f"/ui/conversations/{conversation}/branches",
            f"/ui/conversations/{conversation}/verify",
        ):
            page.goto(server.url + path)
            text = page.locator("main").inner_text()
            assert HOSTILE[0] in text, path  # the title, as text
            assert page.evaluate("window.__pwned") is None
            assert page.locator("main script, main img, main svg").count() == 0
            hrefs = page.eval_on_selector_all(
                "a", "links => links.map(a => a.getAttribute('href'))"
            )
            assert not any(h.lower().startswith("javascript") for h in hrefs)
        timeline = page.goto(server.url + f"/ui/conversations/{conversation}")
        assert timeline is not None
        shown = page.locator("ol.timeline").inner_text()
        for payload in HOSTILE:
            assert payload in shown
    assert browser.dialogs == []
    assert browser.errors == []


def _routes(conversation: str, branch: str, run: str) -> list[str]:
    return [
        f"/ui/conversations/{conversation}",
        f"/ui/conversations/{conversation}?raw=true",
        f"/ui/conversations/{conversation}/branches",
        f"/ui/conversations/{conversation}/verify",
        f"/ui/conversations/{conversation}/compare?a={branch}&b={branch}",
        f"/ui/runs/{run}",
    ]


async def test_another_tenants_ids_are_missing_ones(
    client_for: Callable[..., httpx.AsyncClient], sync_store: Store, tenants: Tenants
) -> None:
    ledger = sync_store.tenant(tenants.a)
    theirs = ledger.append_messages(
        ledger.create_conversation().id, [Message(role="user", content="hi")]
    )
    run = ledger.runs.start(theirs.conversation_id, owner="test")
    made_up = "01a23898-0000-7000-8000-000000000000"
    client = client_for(weather_agent())
    own = [
        (await client.get(path)).status_code
        for path in _routes(theirs.conversation_id, theirs.head.branch_id, run.run_id)
    ]
    assert own == [200] * len(own)
    other = {"Authorization": tenants.auth(tenants.key_b)["Authorization"]}
    for theirs_path, missing_path in zip(
        _routes(theirs.conversation_id, theirs.head.branch_id, run.run_id),
        _routes(made_up, made_up, made_up),
        strict=True,
    ):
        seen = await client.get(theirs_path, headers=other)
        missing = await client.get(missing_path, headers=other)
        assert seen.status_code == missing.status_code == 404, theirs_path
        # The same answer, but for the id each asked about.
        ids = (theirs.conversation_id, theirs.head.branch_id, run.run_id)
        assert _without(seen.text, ids) == _without(missing.text, (made_up,)), theirs_path
    listing = await client.get("/ui/", headers=other)
    assert theirs.conversation_id not in listing.text


def _without(text: str, ids: tuple[str, ...]) -> str:
    for one in ids:
        text = text.replace(one, "ID")
    return text


async def test_a_browser_sends_its_key_as_basic_auth(
    client_for: Callable[..., httpx.AsyncClient], tenants: Tenants
) -> None:
    client = client_for(weather_agent())
    asked = await client.get("/ui/", headers={"Authorization": ""})
    assert asked.status_code == 401
    assert asked.headers["www-authenticate"].startswith("Basic")
    basic = base64.b64encode(f"anyone:{tenants.key_b}".encode()).decode()
    shown = await client.get("/ui/", headers={"Authorization": f"Basic {basic}"})
    assert shown.status_code == 200
    assert shown.headers["content-security-policy"].startswith("default-src 'self'")
    wrong = base64.b64encode(b"anyone:not-a-key").decode()
    assert (
        await client.get("/ui/", headers={"Authorization": f"Basic {wrong}"})
    ).status_code == 401
    # Basic is for the page only: the API still asks for a bearer token.
    assert (
        await client.get("/v1/conversations", headers={"Authorization": f"Basic {basic}"})
    ).status_code == 401


def test_a_long_conversation_opens_on_its_newest_page(sync_store: Store, database_url: str) -> None:
    ledger = sync_store.tenant("long")
    messages = []
    for i in range(2_500):
        messages.append(Message(role="user", content=f"question {i}"))
        messages.append(Message(role="assistant", content=f"answer {i}"))
    conversation = ledger.create_conversation().id
    ledger.append_messages(conversation, messages)
    stored = [e.position.position for e in ledger.entries(conversation)]
    with Server(create_ui_app(database_url, tenant="long")) as server:
        first = httpx.get(f"{server.url}/ui/conversations/{conversation}", timeout=60)
        assert first.status_code == 200
        positions = [int(p) for p in re.findall(r'class="position">#(\d+)<', first.text)]
        assert positions == stored[-PAGE:]
        older = re.search(r'class="older" href="([^"]+)"', first.text)
        assert older is not None
        second = httpx.get(server.url + older.group(1).replace("&amp;", "&"), timeout=60)
        shown = [int(p) for p in re.findall(r'class="position">#(\d+)<', second.text)]
        assert shown == stored[-2 * PAGE : -PAGE]
        # A big log is verified on demand, from the badge's link.
        assert 'class="badge unverified"' in first.text


def test_chatledger_ui_listens_elsewhere_only_with_keys(sqlite_url: str) -> None:
    refused = subprocess.run(
        [*EXE, "ui", "--database-url", sqlite_url, "--host", "0.0.0.0"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert refused.returncode != 0
    assert "--keys" in refused.stderr
    with chatledger_ui(sqlite_url) as url:
        page = httpx.get(url, timeout=60)
        assert page.status_code == 200
        assert "No conversation matches." in page.text
        css = httpx.get(url + "ui.css", timeout=60)
        assert css.headers["content-type"].startswith("text/css")


def test_the_list_filters_by_key_title_and_day_and_marks_the_erased(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    kek = bytes(range(32))
    monkeypatch.setenv("CHATLEDGER_KEK", kek.hex())  # the page's store reads sealed metadata
    with Store.open(database_url, kek=kek) as store:
        ledger = store.tenant("filters")
        refund = ledger.create_conversation({"title": "Refund request"}, key="ticket-1")
        other = ledger.create_conversation({"title": "Other"})
        gone = ledger.create_conversation({"title": "Refund, erased"}, subject="person-1")
        ledger.append_messages(gone.id, [Message(role="user", content="my address")])
        ledger.erase("person-1", reason="request 1")

    def listed(query: str) -> dict[str, str]:
        page = httpx.get(f"{server.url}/ui/{query}", timeout=60)
        assert page.status_code == 200, page.text
        rows = re.findall(
            r'<tr class="(conversation[^"]*)">\s*<td><a class="id" href="/ui/conversations/([^"]+)"',
            page.text,
        )
        return {conversation: row for row, conversation in rows}

    with Server(create_ui_app(database_url, tenant="filters")) as server:
        assert listed("") == {
            gone.id: "conversation erased",
            other.id: "conversation",
            refund.id: "conversation",
        }
        assert set(listed("?title=refund")) == {refund.id}  # the erased title is gone
        assert set(listed("?key=ticket-1")) == {refund.id}
        assert listed("?key=ticket-2") == {}
        assert listed("?since=2999-01-01") == {}
        assert set(listed("?since=2000-01-01&limit=1")) == {gone.id}  # newest first
        refused = httpx.get(f"{server.url}/ui/?since=yesterday", timeout=60)
        assert refused.status_code == 422  # as every invalid input of the service
        assert "YYYY-MM-DD" in refused.text


def test_what_repair_synthesized_and_dropped_is_marked(
    sync_store: Store, database_url: str
) -> None:
    ledger = sync_store.tenant("repair")
    conversation = ledger.create_conversation().id
    call = ToolCall(id="c1", name="lookup", arguments='{"q": "x"}')
    ledger.append_messages(
        conversation,
        [
            Message(role="user", content="look it up"),
            Message(role="tool", tool_call_id="c0", content="a result without its call"),
            Message(role="assistant", tool_calls=[call]),
            Message(role="user", content="well?"),
        ],
    )
    with Server(create_ui_app(database_url, tenant="repair")) as server:
        page = httpx.get(f"{server.url}/ui/conversations/{conversation}", timeout=60).text
    dropped = re.findall(r'<li class="message dropped">(.*?)</li>', page, re.S)
    assert len(dropped) == 1
    assert "a result without its call" in dropped[0]
    assert "#3" in dropped[0]  # its position in the log
    calls = re.findall(r'<tr class="call">(.*?)</tr>', page, re.S)
    assert len(calls) == 1
    assert "lookup" in calls[0]
    assert "synthesized by repair" in calls[0]
    # The user's messages keep their positions; the synthesized result has none.
    assert re.findall(r'class="position">#(\d+)<', page) == ["2", "4", "5"]


def test_without_keys_only_loopback_names_are_served(sqlite_url: str) -> None:
    # A page of another site that points its name at 127.0.0.1 sends its own Host.
    with Server(create_ui_app(sqlite_url, tenant="t")) as server:
        assert httpx.get(f"{server.url}/ui/", timeout=60).status_code == 200
        rebound = httpx.get(f"{server.url}/ui/", headers={"Host": "evil.example"}, timeout=60)
        assert rebound.status_code == 400
        assert "evil" not in rebound.text


def test_older_pages_follow_the_lineage_into_the_parent_branch(
    sync_store: Store, database_url: str
) -> None:
    ledger = sync_store.tenant("lineage")
    conversation = ledger.create_conversation().id
    ledger.append_messages(
        conversation, [Message(role="user", content=f"root {i}") for i in range(150)]
    )
    edited = ledger.append_messages(
        conversation, [Message(role="user", content=f"edit {i}") for i in range(5)], after=140
    )
    stored = [e.position for e in ledger.entries(conversation)]
    assert stored[-1].branch_id == edited.head.branch_id != stored[0].branch_id
    with Server(create_ui_app(database_url, tenant="lineage")) as server:
        first = httpx.get(f"{server.url}/ui/conversations/{conversation}", timeout=60).text
        shown = [int(p) for p in re.findall(r'class="position">#(\d+)<', first)]
        assert shown == [p.position for p in stored[-PAGE:]]
        older = re.search(r'class="older" href="([^"]+)"', first)
        assert older is not None
        assert stored[-PAGE - 1].branch_id in older.group(1)  # the root branch's position
        second = httpx.get(server.url + older.group(1).replace("&amp;", "&"), timeout=60)
        assert second.status_code == 200, second.text
        shown = [int(p) for p in re.findall(r'class="position">#(\d+)<', second.text)]
        assert shown == [p.position for p in stored[:-PAGE]][-PAGE:]
        # Compare: the root and the edit share #1 to #140; after it, each its own.
        branches = {p.branch_id for p in stored} | {stored[0].branch_id}
        root = stored[0].branch_id
        compared = httpx.get(
            f"{server.url}/ui/conversations/{conversation}/compare",
            params={"a": root, "b": edited.head.branch_id},
            timeout=60,
        ).text
        assert len(branches) == 2
        side_a, side_b = compared.split('id="side-b"')
        # ("root i" is at position i + 2: the conversation's creation holds #1.)
        assert "root 139" in side_a and "root 149" in side_a
        assert "root 138<" not in side_a and "edit" not in side_a
        assert "share 139 messages, up to #140" in compared
        assert "edit 0" in side_b and "edit 4" in side_b and "root" not in side_b
