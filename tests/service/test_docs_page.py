"""docs/serve.md: its Python example runs and prints what the page says."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

PAGE = Path(__file__).parent.parent.parent / "docs" / "serve.md"


def test_the_page_example_runs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    text = PAGE.read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.DOTALL)
    assert blocks
    namespace: dict[str, object] = {"DATABASE_URL": f"sqlite:///{tmp_path / 'serve.db'}"}
    for number, block in enumerate(blocks, 1):
        exec(compile(block, f"serve.md block {number}", "exec"), namespace)
    printed = capsys.readouterr().out.strip()
    said = re.search(r"It prints `([^`]*)`", text)
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
