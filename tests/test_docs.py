"""Every snippet of README.md and docs/*.md runs as written, pasted into a fresh directory.

Each ```python and ```sh block runs in a subprocess of its own, in an empty
temporary directory, with the installed `chatledger` and `python` first on
the PATH and nothing else set up: a block that needs tables runs
`migrate` itself, a block that needs a key makes one. It runs once per
backend: on SQLite with no `CHATLEDGER_DATABASE_URL` (so `Store.open()` and
the `chatledger` command use ./chatledger.db), and on Postgres with
`CHATLEDGER_DATABASE_URL` naming a database of its own, without chatledger's
tables. A block passes when it exits 0; its `assert`s are what it checks.

Markers, each on the line before a block, say what the test does with it:

- `<!-- docs-test: postgres -->`: run on Postgres only (the block reads
  `CHATLEDGER_DATABASE_URL`, with a Postgres URL as its default);
- `<!-- docs-test: not run (REASON) -->`: not run, for the reason given: an
  output sample, a synopsis, an install step, a server that runs until it is
  stopped.

Every other block, whatever its language, must carry one of them, or be a
SQL query marked `<!-- query: NAME -->` (tests/test_docs_sql.py and
tests/store/test_audit.py run those against the store) or one of docs/tables.md.
"""

from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests import warm

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
RUNNABLE = {"python", "sh"}
MARKER = re.compile(r"<!--\s*(docs-test|query):\s*(.*?)\s*-->\s*$")
FENCE = re.compile(r"^(\s*)(`{3,})(\S*)")


@dataclass(frozen=True)
class Block:
    page: str
    line: int
    language: str
    code: str
    marker: str | None  # "postgres", "not run (...)", "query"

    @property
    def id(self) -> str:
        return f"{self.page}:{self.line}"


def blocks(page: Path) -> list[Block]:
    """The fenced blocks of `page`, each with the marker on the line before it."""
    found: list[Block] = []
    lines = page.read_text(encoding="utf-8").splitlines(keepends=True)
    i = 0
    while i < len(lines):
        fence = FENCE.match(lines[i])
        if fence is None:
            i += 1
            continue
        indent, ticks, language = fence.groups()
        start, body = i, []
        i += 1
        while i < len(lines) and lines[i].strip() != ticks:
            body.append(lines[i][len(indent) :])
            i += 1
        before = lines[start - 1].strip() if start else ""
        marked = MARKER.match(before)
        marker = None if marked is None else ("query" if marked[1] == "query" else marked[2])
        found.append(Block(page.name, start + 1, language, "".join(body), marker))
        i += 1
    return found


ALL = [block for page in PAGES for block in blocks(page)]


RUN = [b for b in ALL if b.language in RUNNABLE and not (b.marker or "").startswith("not run")]
"""Every block the test runs, each alone."""


def test_every_block_is_run_or_says_why_not() -> None:
    unmarked = [
        b.id
        for b in ALL
        if b.language not in RUNNABLE
        and b.marker is None
        and not (b.page == "tables.md" and b.language == "sql")
    ]
    assert unmarked == [], f"blocks with no docs-test marker: {unmarked}"
    bad = [
        b.id
        for b in ALL
        if b.marker not in (None, "query", "postgres") and not b.marker.startswith("not run (")
    ]
    assert bad == [], f"unknown docs-test markers: {bad}"
    assert len(RUN) >= 40


def snippet_env(database_url: str | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CHATLEDGER_")}
    # The installed `chatledger` and this interpreter, as an activated virtual environment has them.
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["CHATLEDGER_TEST_POSTGRES_URL"] = os.environ.get("CHATLEDGER_TEST_POSTGRES_URL", "")
    if database_url is not None:
        env["CHATLEDGER_DATABASE_URL"] = database_url
    return env


def run_page_python(page: str, where: Path) -> str:
    """Run every runnable Python example of `page` as one program in `where`; its stdout."""
    code = "\n".join(b.code for b in RUN if b.page == page and b.language == "python")
    proc = warm.run(
        [sys.executable, "-c", code],
        cwd=where,
        env=snippet_env(None),
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


@pytest.mark.parametrize("block", RUN, ids=[b.id for b in RUN])
def test_the_snippet_runs_alone(
    block: Block, backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    if block.marker == "postgres" and backend == "sqlite":
        pytest.skip("a Postgres example")
    url = request.getfixturevalue("empty_url") if backend == "postgres" else None
    code = block.code
    if block.language == "python":
        (tmp_path / "snippet.py").write_text(code, encoding="utf-8")
        command = [sys.executable, str(tmp_path / "snippet.py")]
    else:
        command = ["bash", "-euo", "pipefail", "-c", code]
    work = tmp_path / "fresh"  # nothing in it but what the snippet makes
    work.mkdir()
    proc = warm.run(  # a Python block forks from a warm process (tests/warm.py)
        command,
        cwd=work,
        env=snippet_env(url),
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, f"{block.id} failed:\n{proc.stdout}\n{proc.stderr}"
