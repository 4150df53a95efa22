"""mkdocs hooks (mkdocs.yml `hooks:`): lay the packages out before griffe reads them.

griffe, which reads the docstrings for the reference, finds modules by their
files and cannot follow the `package-dir` mapping that installs `store/` as
`chatledger.store` (docs/adr/0031-one-import-package.md). So the build reads
them under `build/docs/chatledger/`, laid out as the wheel installs them: the
root package's files copied (griffe follows a linked `__init__.py` to its
folder, where the subpackages are not) and a link to each subpackage's folder.
It is a tree of its own, apart from scripts/check.py's, so a docs build and a
type check can run at once; `$CHATLEDGER_DOCS_TREE` (mkdocs.yml reads it too)
puts it elsewhere, so that two builds of one checkout can run at once.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

from check import FOLDERS, ROOT  # this folder is on the path only from the line above

PACKAGE = Path(os.environ.get("CHATLEDGER_DOCS_TREE") or ROOT / "build" / "docs") / "chatledger"


def on_startup(**_: Any) -> None:
    shutil.rmtree(PACKAGE, ignore_errors=True)
    shutil.copytree(ROOT / "chatledger", PACKAGE, ignore=shutil.ignore_patterns("__pycache__"))
    for folder in FOLDERS:
        (PACKAGE / folder).symlink_to(ROOT / folder, target_is_directory=True)
