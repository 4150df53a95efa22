"""Lint and type-check every package, as CI does: `python scripts/check.py`.

`ruff check .` covers the packages, the tests, the benches and the scripts.
mypy cannot follow the `package-dir` mapping that installs `store/` as
`chatledger.store` (an editable install maps it with an import hook, which
static tools do not run; docs/adr/0031-one-import-package.md), so this script
lays the packages out as they install, as links under `build/typecheck/`
(the `mypy_path` of pyproject.toml), runs mypy on `chatledger` there, and
prints each finding at its path in the repository.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TREE = ROOT / "build" / "typecheck"
FOLDERS = ("store", "engine", "service", "adapters", "migrations")


def link_tree() -> None:
    """`build/typecheck/chatledger/` as the wheel lays it out, linked to the sources."""
    shutil.rmtree(TREE, ignore_errors=True)
    package = TREE / "chatledger"
    package.mkdir(parents=True)
    for source in (ROOT / "chatledger").iterdir():
        if source.suffix in (".py", ".typed"):
            (package / source.name).symlink_to(source)
    for folder in FOLDERS:
        (package / folder).symlink_to(ROOT / folder, target_is_directory=True)


def mypy() -> int:
    link_tree()
    # pyproject.toml says what to check (`packages`, `strict`, `mypy_path`).
    proc = subprocess.run([sys.executable, "-m", "mypy"], cwd=ROOT, capture_output=True, text=True)
    # build/typecheck/chatledger/store/_x.py -> store/_x.py, and the root package's own files.
    where = re.compile(rf"^build/typecheck/(?:chatledger/(?=(?:{'|'.join(FOLDERS)})/))?", re.M)
    sys.stdout.write(where.sub("", proc.stdout))
    sys.stderr.write(proc.stderr)
    return proc.returncode


def main() -> int:
    failed = subprocess.run([sys.executable, "-m", "ruff", "check", "."], cwd=ROOT).returncode
    return mypy() or failed


if __name__ == "__main__":
    sys.exit(main())
