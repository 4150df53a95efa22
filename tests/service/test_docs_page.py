"""docs/serve.md: its Python example runs and prints what the page says."""

from __future__ import annotations

import re
from pathlib import Path

from tests.test_docs import run_page_python

PAGE = Path(__file__).parent.parent.parent / "docs" / "serve.md"


def test_the_page_example_prints_what_the_page_says(tmp_path: Path) -> None:
    # tests/test_docs.py runs it on both databases; here, what it prints.
    printed = run_page_python("serve.md", tmp_path).strip()
    said = re.search(r"It prints `([^`]*)`", PAGE.read_text())
    assert said is not None and printed == said.group(1)


def test_the_page_lists_every_endpoint() -> None:
    from chatledger.engine import Agent
    from chatledger.engine.providers.scripted import ScriptedModel
    from chatledger.service import ApiKeys, create_app

    app = create_app(Agent(ScriptedModel([])), "sqlite://", keys=ApiKeys.of({}))
    text = PAGE.read_text()
    for path, methods in app.openapi()["paths"].items():
        for method in methods:
            shown = re.sub(r"\{[a-z_]+\}", "{id}", path)
            assert f"{method.upper()} {shown}" in text, (method, path)
