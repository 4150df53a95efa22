"""The documentation site builds as CI builds it, and its reference is complete.

`mkdocs build --strict` (mkdocs.yml) fails on any warning: a broken link
between pages, a docstring griffe cannot parse, a documented parameter the
signature does not have. The reference pages (docs/reference/) render each
package's `__all__`; a name added to one shows up without a page edit, and
these tests fail if it does not. The parameters of the calls most programs
start from must each be documented in their docstring's `Args:`
(docs/adr/0039-a-reference-built-from-docstrings.md).
"""

from __future__ import annotations

import importlib
import os
import re
import subprocess
import sys
from pathlib import Path

import griffe
import pytest

ROOT = Path(__file__).resolve().parent.parent

# Each public package, and the reference page that renders it.
PAGES = {
    "chatledger": "chatledger",
    "chatledger.store": "store",
    "chatledger.engine": "engine",
    "chatledger.engine.providers": "providers",
    "chatledger.service": "service",
    "chatledger.adapters.langgraph": "adapters",
    "chatledger.adapters.openai_agents": "adapters",
    "chatledger.adapters.pydantic_ai": "adapters",
}

# Calls whose every parameter the docstring must name in `Args:`: (package, object).
FULLY_DOCUMENTED = [
    ("chatledger.store", "Ledger.append_messages"),
    ("chatledger.store", "AsyncLedger.append_messages"),
    ("chatledger.engine", "Agent"),
    *[
        ("chatledger.engine", f"Agent.{method}{suffix}")
        for method in ("run", "run_stream", "run_with_history", "resume")
        for suffix in ("", "_async")
    ],
]


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where this build lays the packages out as they install (scripts/docs_hooks.py)."""
    return tmp_path_factory.mktemp("tree")


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory, tree: Path) -> Path:
    out = tmp_path_factory.mktemp("site")
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "CHATLEDGER_DOCS_TREE": str(tree)},
    )
    assert proc.returncode == 0, proc.stderr
    assert "WARNING" not in proc.stderr, proc.stderr
    return out


def test_the_site_builds_with_no_warnings(site: Path) -> None:
    assert (site / "reference" / "store" / "index.html").is_file()


@pytest.mark.parametrize("package", PAGES)
def test_the_reference_shows_every_exported_name(site: Path, package: str) -> None:
    html = (site / "reference" / PAGES[package] / "index.html").read_text(encoding="utf-8")
    names = [n for n in importlib.import_module(package).__all__ if not n.startswith("__")]
    missing = [n for n in names if f'id="{package}.{n}"' not in html]
    assert missing == [], f"{package}: not in docs/reference/{PAGES[package]}.md: {missing}"


def documented_parameters(obj: griffe.Object | griffe.Alias) -> set[str]:
    names: set[str] = set()
    for section in obj.docstring.parsed if obj.docstring else []:
        if section.kind is griffe.DocstringSectionKind.parameters:
            names.update(p.name.lstrip("*") for p in section.value)
    return names


# A variant whose docstring opens by naming another (`run_async` for `run`,
# "See `Ledger.append_messages`." for the async one) is documented there.
DELEGATES = re.compile(r"^(?:See )?`(\w+(?:\.\w+)?)`")


@pytest.fixture(scope="module")
def loader(site: Path, tree: Path) -> griffe.GriffeLoader:
    # The build (the site fixture) laid the packages out in this module's own tree.
    loader = griffe.GriffeLoader(search_paths=[tree], docstring_parser=griffe.Parser.google)
    for package in {package for package, _ in FULLY_DOCUMENTED}:
        loader.load(package)
    return loader


@pytest.mark.parametrize(("package", "name"), FULLY_DOCUMENTED)
def test_every_parameter_is_documented(
    loader: griffe.GriffeLoader, package: str, name: str
) -> None:
    obj = loader.modules_collection[f"{package}.{name}"].final_target
    documented = documented_parameters(obj)
    named = DELEGATES.match(obj.docstring.value if obj.docstring else "")
    if not documented and named:
        where = named[1] if "." in named[1] else f"{name.rpartition('.')[0]}.{named[1]}"
        documented = documented_parameters(
            loader.modules_collection[f"{package}.{where}"].final_target
        )
    # A class documents its constructor's parameters in its own docstring.
    signature = obj.members["__init__"] if obj.is_class else obj
    parameters = [p.name for p in signature.parameters if p.name not in ("self", "cls")]
    undocumented = [p for p in parameters if p not in documented]
    assert undocumented == [], f"{package}.{name}: parameters with no `Args:` entry: {undocumented}"
