"""Every example of docs/langgraph.md runs: the Python ones in order in one namespace,
then the `chatledger` commands on what they wrote."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from chatledger.engine.cli import main as chatledger

PAGE = Path(__file__).parent.parent.parent / "docs" / "langgraph.md"
PAGE_URL = "sqlite:///chat.db"


def test_the_langgraph_page_runs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    text = PAGE.read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.DOTALL)
    assert len(blocks) >= 6
    url = f"sqlite:///{tmp_path / 'chat.db'}"
    namespace: dict[str, object] = {"DATABASE_URL": url}
    try:
        for number, block in enumerate(blocks, 1):
            exec(compile(block, f"langgraph.md block {number}", "exec"), namespace)
    finally:
        namespace["store"].close()  # type: ignore[attr-defined]
    conversation_id = capsys.readouterr().out.strip()  # the page prints the thread's id

    commands = [
        shlex.split(line)
        for block in re.findall(r"```sh\n(.*?)```", text, flags=re.DOTALL)
        for line in block.splitlines()
        if line.startswith("chatledger ")
    ]
    assert len(commands) == 2
    printed = []
    for command in commands:
        args = [url if a == PAGE_URL else conversation_id if a == "<id>" else a for a in command]
        assert chatledger(args[1:]) == 0, command
        out, err = capsys.readouterr()
        assert err == "", err
        printed.append(out)
    assert [line.strip() for line in printed[0].splitlines()][:2] == [
        "user: Weather in Oslo?",
        "user: No: weather in Tromsø?",
    ]
    assert "every chain is intact" in printed[1]
