"""The commands of the framework pages print what the pages say, on what the
pages' Python examples wrote (tests/test_docs.py runs each example itself)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from chatledger.engine._cli import main as chatledger
from tests.test_docs import run_page_python

DOCS = Path(__file__).parent.parent.parent / "docs"


def run_page_commands(
    page: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> list[str]:
    """Run the page's Python, then each `chatledger` line of its sh blocks on what
    it wrote (`<id>`: the id its last example prints); what each command printed."""
    text = (DOCS / page).read_text()
    conversation_id = run_page_python(page, tmp_path).strip()
    monkeypatch.chdir(tmp_path)  # the commands, like the examples, use ./chatledger.db
    monkeypatch.delenv("CHATLEDGER_DATABASE_URL", raising=False)
    commands = [
        shlex.split(line)
        for block in re.findall(r"```sh\n(.*?)```", text, flags=re.DOTALL)
        for line in block.splitlines()
        if line.startswith("chatledger ")
    ]
    printed = []
    for command in commands:
        args = [conversation_id if a == "<id>" else a for a in command]
        assert chatledger(args[1:]) == 0, command
        out, err = capsys.readouterr()
        assert err == "", err
        printed.append(out)
    return printed


@pytest.mark.parametrize(
    ("page", "commands_at_least"), [("pydantic-ai.md", 4), ("openai-agents.md", 3)]
)
def test_the_page_commands_print_what_it_says(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    page: str,
    commands_at_least: int,
) -> None:
    printed = run_page_commands(page, tmp_path, monkeypatch, capsys)
    assert len(printed) >= commands_at_least
    # Each line: the message's position, then the message.
    history = [line.split(maxsplit=1) for line in printed[0].splitlines()]
    assert all(position.isdigit() for position, _ in history[:3])
    assert [message for _, message in history[:3]] == [
        "user: Weather in Oslo?",
        'assistant: calls weather({"city":"Oslo"})',
        "tool: sunny in Oslo",
    ]
    assert "Weather in Oslo?" in "".join(printed[1:-1])
    assert "every chain is intact" in printed[-1]
