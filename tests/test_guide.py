"""Every Python example of docs/guide.md runs, in order, in one namespace."""

from __future__ import annotations

import re
from pathlib import Path

GUIDE = Path(__file__).parent.parent / "docs" / "guide.md"


def test_guide_examples_run(tmp_path: Path) -> None:
    blocks = re.findall(r"```python\n(.*?)```", GUIDE.read_text(), flags=re.DOTALL)
    assert len(blocks) >= 6
    namespace: dict[str, object] = {"DATABASE_URL": f"sqlite:///{tmp_path / 'guide.db'}"}
    try:
        for number, block in enumerate(blocks, 1):
            exec(compile(block, f"{GUIDE.name} block {number}", "exec"), namespace)
    finally:
        store = namespace.get("store")
        if store is not None:
            store.close()  # type: ignore[attr-defined]
