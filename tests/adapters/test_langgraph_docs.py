"""The commands of docs/langgraph.md print what the page says, on what its Python
examples wrote (tests/test_docs.py runs each example itself)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from chatledger.engine.cli import main as chatledger
from tests.test_docs import run_page_python

PAGE = Path(__file__).parent.parent.parent / "docs" / "langgraph.md"


def test_the_langgraph_page_commands_print_what_it_says(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    text = PAGE.read_text()
    conversation_id = run_page_python("langgraph.md", tmp_path).strip()  # the thread's id
    monkeypatch.chdir(tmp_path)  # the commands, like the examples, use ./chatledger.db
    monkeypatch.delenv("CHATLEDGER_DATABASE_URL", raising=False)

    commands = [
        shlex.split(line)
        for block in re.findall(r"```sh\n(.*?)```", text, flags=re.DOTALL)
        for line in block.splitlines()
        if line.startswith("chatledger ")
    ]
    assert len(commands) == 2
    printed = []
    for command in commands:
        args = [conversation_id if a == "<id>" else a for a in command]
        assert chatledger(args[1:]) == 0, command
        out, err = capsys.readouterr()
        assert err == "", err
        printed.append(out)
    assert [line.split(maxsplit=1)[1] for line in printed[0].splitlines()][:2] == [
        "user: Weather in Oslo?",
        "user: No: weather in Tromsø?",
    ]
    assert "every chain is intact" in printed[1]
