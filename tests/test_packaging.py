"""One import package: the wheel installs `chatledger` and nothing else, and a user's
own `store.py`, `engine.py`, `migrations/` and the like never meet ours (ADR 0031)."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tomllib
import zipfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parent.parent
FOLDERS = ("store", "engine", "service", "adapters", "migrations")
COMMAND = Path(sys.executable).with_name("chatledger")  # the installed console script


def source_packages() -> set[str]:
    """Every folder of the source tree with an `__init__.py`, by its installed name."""
    found = {"chatledger"}
    for folder in FOLDERS:
        for init in (ROOT / folder).rglob("__init__.py"):
            parts = init.parent.relative_to(ROOT).parts
            found.add(".".join(("chatledger", *parts)))
    return found


def test_pyproject_lists_every_subpackage_of_the_source_tree() -> None:
    listed = set(
        tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    )
    assert listed == source_packages()


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> zipfile.ZipFile:
    out = tmp_path_factory.mktemp("wheel")
    # Built from a copy: setuptools writes build/ and *.egg-info/ beside the sources,
    # which another run of the suite on the same checkout may be writing too.
    source = tmp_path_factory.mktemp("source") / "chatledger"
    shutil.copytree(
        ROOT,
        source,
        ignore=shutil.ignore_patterns(
            ".git", ".venv*", "build", "__pycache__", "*.egg-info", ".hypothesis", "*.db"
        ),
    )
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(out),
            str(source),
        ],
        check=True,
        capture_output=True,
    )
    (built,) = out.glob("chatledger-*.whl")
    return zipfile.ZipFile(built)


def test_the_wheel_installs_one_top_level_name(wheel: zipfile.ZipFile) -> None:
    tops = {name.split("/")[0] for name in wheel.namelist()}
    assert {t for t in tops if not t.endswith(".dist-info")} == {"chatledger"}
    entry = next(n for n in wheel.namelist() if n.endswith("entry_points.txt"))
    assert "chatledger = chatledger.engine._cli:main" in wheel.read(entry).decode()


def test_the_wheel_holds_every_module_of_the_source_tree(wheel: zipfile.ZipFile) -> None:
    """A folder left out of `packages` imports in development (the editable install
    maps whole folders) and would be missing from the wheel."""
    names = set(wheel.namelist())
    expected = {f"chatledger/{p.name}" for p in (ROOT / "chatledger").glob("*.py")}
    for folder in FOLDERS:
        for path in (ROOT / folder).rglob("*"):
            if path.suffix in (".py", ".mako", ".typed", ".html", ".css") and "__pycache__" not in path.parts:
                expected.add("chatledger/" + path.relative_to(ROOT).as_posix())
    assert expected - names == set()


# -- a user's project with names like ours --------------------------------------------

_TRAP = """import pathlib
pathlib.Path(__file__).with_name("IMPORTED-" + __name__.replace(".", "-")).write_text("")
raise SystemExit("the user's own {name} was imported")
"""


def user_project(where: Path) -> dict[Path, str]:
    """A directory holding a user's own modules named as chatledger's folders; each
    leaves a mark and stops the process when imported. Returns each file's digest."""
    for name in ("store", "engine", "service"):
        (where / f"{name}.py").write_text(_TRAP.format(name=f"{name}.py"))
    (where / "adapters").mkdir()
    (where / "adapters" / "__init__.py").write_text(_TRAP.format(name="adapters/"))
    migrations = where / "migrations"
    (migrations / "versions").mkdir(parents=True)
    (migrations / "__init__.py").write_text(_TRAP.format(name="migrations/"))
    (migrations / "env.py").write_text(_TRAP.format(name="migrations/env.py"))
    (migrations / "script.py.mako").write_text("${upgrades}\n")
    (where / "localmodule.py").write_text(
        "from chatledger import Agent\n"
        "from chatledger.engine.providers import ScriptedModel\n"
        "agent = Agent(ScriptedModel(['Hello from the local agent.']))\n"
    )
    return digests(where)


def digests(where: Path) -> dict[Path, str]:
    return {
        p.relative_to(where): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in where.rglob("*.py")
        if "__pycache__" not in p.parts
    }


def readme_example() -> str:
    text = (ROOT / "README.md").read_text()
    found = re.search(r"In code:\n\n```python\n(.*?)```", text, re.DOTALL)
    assert found is not None, "README.md has no code example after 'In code:'"
    return found.group(1)


@pytest.fixture
def project(tmp_path: Path) -> Iterator[tuple[Path, dict[Path, str]]]:
    where = tmp_path / "userapp"
    where.mkdir()
    files = user_project(where)
    yield where, files
    marks = sorted(p.name for p in where.rglob("IMPORTED-*"))
    assert not marks, f"the user's own modules were imported: {marks}"
    now = digests(where)
    assert {p: now.get(p) for p in files} == files, "the user's files changed"


def clean_environment() -> dict[str, str]:
    """This environment without PYTHONPATH (pytest's own path must not leak in)."""
    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


def run(where: Path, *args: str | Path, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(
        [str(a) for a in args],
        cwd=where,
        env={**clean_environment(), **(env or {})},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_a_user_project_with_our_folder_names_runs_the_readme_and_the_commands(
    project: tuple[Path, dict[Path, str]],
) -> None:
    where, _ = project
    (where / "main.py").write_text(readme_example())
    run(where, sys.executable, "-W", "error", "main.py")  # offline: its model is scripted
    assert run(where, COMMAND, "runs", "--tenant", "acme").count("completed") == 2
    run(where, COMMAND, "migrate")
    assert (where / "chatledger.db").is_file()
    assert "chatledger verify" in run(where, COMMAND, "demo")
    made = run(where, COMMAND, "api-key", "acme", "--keys", "keys.json")
    key = re.search(r"^key:\s+(\S+)$", made, re.MULTILINE)
    assert key is not None, made
    answer = serve_one_request(where, key.group(1))
    assert answer["answer"] == "Hello from the local agent."


def serve_one_request(where: Path, key: str) -> dict[str, object]:
    """`chatledger serve --agent localmodule:agent` from `where`, asked once."""
    env = {**clean_environment(), "PYTHONUNBUFFERED": "1"}
    with subprocess.Popen(
        [
            str(COMMAND),
            "serve",
            "--agent",
            "localmodule:agent",
            "--keys",
            "keys.json",
            "--port",
            "0",
        ],
        cwd=where,
        env=env,
        text=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    ) as server:
        try:
            assert server.stderr is not None
            url = None
            for line in server.stderr:
                found = re.search(r"Uvicorn running on (http://\S+)", line)
                if found:
                    url = found.group(1)
                    break
            assert url is not None, "the server did not start"
            answer = httpx.post(
                f"{url}/v1/ask",
                json={"question": "Hello?"},
                headers={"Authorization": f"Bearer {key}"},
                timeout=60,
            )
            assert answer.status_code == 200, answer.text
            return dict(answer.json())
        finally:
            server.send_signal(signal.SIGINT)
            server.communicate(timeout=60)


def test_an_agent_module_that_cannot_be_imported_is_named_with_what_was_tried(
    project: tuple[Path, dict[Path, str]],
) -> None:
    where, _ = project
    done = subprocess.run(
        [str(COMMAND), "resume", "--once", "--agent", "nosuchmodule:agent"],
        cwd=where,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 1
    assert "nosuchmodule" in done.stderr and str(where) in done.stderr
    assert "internal error" not in done.stderr
    assert done.stderr.count("\n") == 1, done.stderr


def test_the_console_script_is_installed() -> None:
    assert shutil.which(str(COMMAND)), f"no chatledger command beside {sys.executable}"
