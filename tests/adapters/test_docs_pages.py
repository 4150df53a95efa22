"""Every example of the framework pages runs: the Python ones in order in one
namespace, then the `chatledger` commands on what they wrote, printing what the
page says they print."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from chatledger.engine.cli import main as chatledger

DOCS = Path(__file__).parent.parent.parent / "docs"
PAGE_URL = "sqlite:///chat.db"


@pytest.mark.parametrize(
    ("page", "blocks_at_least", "conversation", "commands_at_least"),
    [("pydantic-ai.md", 4, "trip", 4), ("openai-agents.md", 5, "conversation", 3)],
)
def test_the_page_examples_run(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    page: str,
    blocks_at_least: int,
    conversation: str,
    commands_at_least: int,
) -> None:
    text = (DOCS / page).read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.DOTALL)
    assert len(blocks) >= blocks_at_least
    url = f"sqlite:///{tmp_path / 'chat.db'}"
    namespace: dict[str, object] = {"DATABASE_URL": url}
    for number, block in enumerate(blocks, 1):
        exec(compile(block, f"{page} block {number}", "exec"), namespace)
    # The last example prints the conversation id the command line takes.
    conversation_id = capsys.readouterr().out.strip()
    assert conversation_id == namespace[conversation].id  # type: ignore[attr-defined]

    commands = [
        shlex.split(line)
        for block in re.findall(r"```sh\n(.*?)```", text, flags=re.DOTALL)
        for line in block.splitlines()
        if line.startswith("chatledger ")
    ]
    assert len(commands) >= commands_at_least
    printed = []
    for command in commands:
        args = [url if a == PAGE_URL else conversation_id if a == "<id>" else a for a in command]
        assert chatledger(args[1:]) == 0, command
        out, err = capsys.readouterr()
        assert err == "", err
        printed.append(out)
    history = [line.strip() for line in printed[0].splitlines()]
    assert history[:3] == [
        "user: Weather in Oslo?",
        'assistant: calls weather({"city":"Oslo"})',
        "tool: sunny in Oslo",
    ]
    assert "Weather in Oslo?" in "".join(printed[1:-1])
    assert "every chain is intact" in printed[-1]
