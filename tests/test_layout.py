"""The tree keeps its layers: no import cycles, and docs/architecture.md names every module.

Both checks read the source with `ast`; nothing is imported. Every `import`
statement counts: at module top, inside functions, and under
`if TYPE_CHECKING:`, because a cycle that only typing or a late import hides
still ties two modules that should stand apart.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("store", "engine", "adapters", "service")
FOLDERS = (*PACKAGES, "migrations")
ARCHITECTURE = ROOT / "docs" / "architecture.md"


def module_files() -> dict[str, Path]:
    """Every module of the packages, by dotted name (a package by its own name)."""
    found: dict[str, Path] = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def imports_of(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The package modules that `name` imports, by any import statement anywhere in it."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    targets: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets.update(alias.name.removeprefix("chatledger.") for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            base = "" if base == "chatledger" else base.removeprefix("chatledger.")
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                # `from a.b import c`: the module a.b.c when it is one, else a.b.
                submodule = f"{base}.{alias.name}" if base else alias.name
                targets.add(submodule if submodule in modules else base)
    return {t for t in targets if t in modules and t != name}


def import_graph() -> dict[str, set[str]]:
    modules = module_files()
    return {name: imports_of(name, path, modules) for name, path in modules.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph[node]):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def bare_imports(path: Path) -> list[str]:
    """The imports in `path` that name a package folder as a top-level module."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level:
            names = [node.module or ""]
        else:
            continue
        found += [
            f"{path.relative_to(ROOT)}:{node.lineno}: {n}"
            for n in names
            if n.split(".")[0] in FOLDERS
        ]
    return found


def test_nothing_imports_a_folder_by_its_bare_name() -> None:
    """`store`, `engine` and the rest install as `chatledger.*` only (docs/adr/0031).

    A bare `import store` still resolves under pytest, which puts the
    repository root on `sys.path`: the same files would load twice, under two
    names, with two `ConflictError` classes.
    """
    files = [
        path
        for folder in (*FOLDERS, "chatledger", "tests", "bench")
        for path in sorted((ROOT / folder).rglob("*.py"))
    ]
    found = [line for path in files for line in bare_imports(path)]
    assert not found, "bare imports: " + "; ".join(found)


def test_the_walk_sees_function_level_and_type_checking_imports() -> None:
    graph = import_graph()
    # store._sql.log imports store._sql.projector at module top,
    assert "store._sql.projector" in graph["store._sql.log"]
    # and the graph reaches across packages: the engine builds on the store.
    assert any(t.startswith("store") for t in graph["engine._run"])
    planted = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(planted) == [["a", "b", "c"]]


def test_no_module_imports_itself_back() -> None:
    found = cycles(import_graph())
    assert not found, "import cycles: " + "; ".join(" -> ".join(c) for c in found)


# Packages whose modules may import one another freely, but never in a circle between them.
# `store._sql` is not one of them: the faces build on it and it returns the store's values.
LAYERS = ("store", "engine._cli", "engine.providers", "engine", "service", "adapters")


def layer_of(module: str) -> str:
    """The package (or engine sub-package) `module` belongs to."""
    return next(p for p in LAYERS if module == p or module.startswith(p + "."))


def layer_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    layers: dict[str, set[str]] = {layer: set() for layer in LAYERS}
    for name, targets in graph.items():
        layers[layer_of(name)].update(layer_of(t) for t in targets)
    return {layer: targets - {layer} for layer, targets in layers.items()}


def test_no_package_imports_itself_back() -> None:
    """Module cycles are not the only ones: `service -> engine._cli -> service` ties two layers."""
    graph = import_graph()
    found = cycles(layer_graph(graph))
    assert not found, "package cycles: " + "; ".join(" -> ".join(c) for c in found)


def test_the_package_check_sees_the_service_reaching_into_the_cli() -> None:
    # The edge the service once had: it took `to_json` from the CLI's helpers.
    graph = import_graph()
    graph["service._app"] = graph["service._app"] | {"engine._cli._common"}
    assert ["engine._cli", "service"] in cycles(layer_graph(graph))


def test_the_store_never_imports_the_engine() -> None:
    graph = import_graph()
    reaching = {
        name: sorted(t for t in targets if t.startswith("engine"))
        for name, targets in graph.items()
        if name.startswith("store")
    }
    assert not {n: t for n, t in reaching.items() if t}


def test_adapters_import_the_store_and_nothing_imports_them() -> None:
    """A framework backend builds on `store`, never `engine`; `store` and `engine` never import one."""
    graph = import_graph()
    wrong = sorted(
        f"{name} -> {target}"
        for name, targets in graph.items()
        for target in targets
        if (name.startswith("adapters") and target.startswith("engine"))
        or (not name.startswith("adapters") and target.startswith("adapters"))
    )
    assert not wrong
    assert "store" in graph["adapters.pydantic_ai._translate"]


def test_the_service_sits_on_top_and_only_serve_imports_it() -> None:
    """`service` builds on `engine` and `store`; only the `serve` command imports it."""
    graph = import_graph()
    importers = sorted(
        name
        for name, targets in graph.items()
        if not name.startswith("service") and any(t.startswith("service") for t in targets)
    )
    assert importers == ["engine._cli._serve"]
    assert not any(t.startswith("adapters") for t in graph["service._app"])
    assert {"engine", "store"} <= graph["service._app"]


def test_the_sql_layer_holds_no_database_resources() -> None:
    """`store._sql` is functions over one transaction or cursor; what holds engines,
    connections, replicas and the tail's threads is `store._db`, built on it, never under it."""
    graph = import_graph()
    assert graph["store._db.run"] & {"store._sql.ops"}  # the walk sees `_db` building on `_sql`
    wrong = sorted(
        f"{name} -> {target}"
        for name, targets in graph.items()
        if name.startswith("store._sql")
        for target in targets
        if target == "store._db" or target.startswith("store._db.")
    )
    assert not wrong, "store._sql imports store._db: " + "; ".join(wrong)


def test_the_contract_layer_imports_no_database_layer() -> None:
    """messages, ids, history and the values are the pure layer: no `store._sql` or
    `store._db`, no SQLAlchemy."""
    pure = ["store.messages", "store.ids", "store.history", "store._repair", "store._values"]
    for name in pure:
        path = module_files()[name]
        tree = ast.parse(path.read_text())
        names = {
            alias.name
            for node in ast.walk(tree)
            if isinstance(node, ast.Import)
            for alias in node.names
        } | {node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
        assert not {
            n
            for n in names
            if n.startswith(("store._sql", "store._db", "sqlalchemy", "psycopg", "alembic"))
        }, name


# -- docs/architecture.md -------------------------------------------------------------

_PATH = re.compile(r"\b((?:store|engine|migrations|adapters|service)/[\w/]*\.py)\b")


def named_in_architecture() -> set[str]:
    return set(_PATH.findall(ARCHITECTURE.read_text()))


def test_every_module_named_in_the_architecture_exists() -> None:
    missing = sorted(p for p in named_in_architecture() if not (ROOT / p).is_file())
    assert not missing, f"docs/architecture.md names modules that do not exist: {missing}"


def test_every_module_is_named_in_the_architecture() -> None:
    named = named_in_architecture()
    every = {str(p.relative_to(ROOT)) for p in module_files().values()}
    unnamed = sorted(every - named)
    assert not unnamed, f"docs/architecture.md does not name: {unnamed}"


def picture() -> dict[str, set[str]]:
    """The tree's picture in docs/architecture.md: each folder's row (with the lines
    that continue it), as the words it holds."""
    text = ARCHITECTURE.read_text()
    start = text.index("```\nstore/")
    rows: dict[str, set[str]] = {}
    folder = None
    for line in text[start + 4 : text.index("```", start + 4)].splitlines():
        found = re.match(r"(\S+/)\s", line)
        if found:
            folder = found.group(1)
        if folder is not None:
            rows.setdefault(folder, set()).update(re.findall(r"\w+", line))
    return rows


def test_the_architecture_picture_shows_every_module_in_its_folder() -> None:
    """The picture of the tree names every module on its folder's row."""
    missing = []
    for folder, words in picture().items():
        for module in sorted((ROOT / folder).glob("*.py")):
            if module.stem != "__init__" and module.stem not in words:
                missing.append(f"{folder}{module.name}")
    packages = {str(p.parent.relative_to(ROOT)) + "/" for p in module_files().values()}
    unpictured = sorted(f for f in packages if f not in picture() and f != "migrations/versions/")
    assert not missing, f"the picture in docs/architecture.md leaves out: {missing}"
    assert not unpictured, f"the picture in docs/architecture.md has no row for: {unpictured}"


@pytest.mark.parametrize("pattern", [r"\.\./", r"(?<![\w.])/(?:work|home|tmp|root)/"])
def test_the_architecture_points_inside_the_repository(pattern: str) -> None:
    assert not re.search(pattern, ARCHITECTURE.read_text())


def test_every_decision_record_is_in_the_index_with_a_status() -> None:
    """docs/adr/README.md lists every record, by a link that resolves, with a status."""
    adr = ROOT / "docs" / "adr"
    rows = re.findall(
        r"^\| \[(\d{4})\]\(([^)]+)\) \| [^|]+ \| ([^|]+) \|$",
        (adr / "README.md").read_text(),
        re.M,
    )
    listed = {file for _, file, _ in rows}
    assert listed == {p.name for p in adr.glob("[0-9][0-9][0-9][0-9]-*.md")}
    for number, file, status in rows:
        assert file.startswith(number + "-")
        assert status.split(";")[0].split(" by ")[0].strip() in {
            "accepted",
            "superseded",
            "proposed",
        }, (file, status)
