"""The commands of docs/langgraph.md print what the page says, on what its Python
examples wrote (tests/test_docs.py runs each example itself)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.adapters.test_docs_pages import run_page_commands


def test_the_langgraph_page_commands_print_what_it_says(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    printed = run_page_commands("langgraph.md", tmp_path, monkeypatch, capsys)
    assert len(printed) == 2
    assert [line.split(maxsplit=1)[1] for line in printed[0].splitlines()][:2] == [
        "user: Weather in Oslo?",
        "user: No: weather in Tromsø?",
    ]
    assert "every chain is intact" in printed[1]
