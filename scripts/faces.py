"""Write the store's faces from the one declaration of each operation.

Every store operation is declared once, as a method of `Operations` (a
tenant's) or `StoreOperations` (the whole database's) in `store/_ops.py`, or
of `AuditOperations` (a tenant's audit queries) in `store/_audit.py`:
its parameters, their defaults and its docstring. The faces people call,
`Store`, `Ledger`, `Runs`, `Retention`, `Audit` and their async twins, run those
declarations; their methods are written here, into one base class per face
in `store/_faces.py`, which the face inherits, and nowhere by hand
(docs/adr/0043-one-declaration-per-operation.md, 0046):

    python scripts/faces.py           # rewrite store/_faces.py
    python scripts/faces.py --check   # exit 1 if that would change it

A declaration returns what its face runs: an `Op[T]` (the face returns `T`
from its store's `execute`), a `Program[T]` (driven by `drive`, or `adrive`
on the async face), or `TailSettings` (the face's own `_tail` iterates it).
"""

from __future__ import annotations

import argparse
import ast
import builtins
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DECLARATIONS = (ROOT / "store" / "_ops.py", ROOT / "store" / "_audit.py")
OUT = ROOT / "store" / "_faces.py"
WIDTH = 100


@dataclass(frozen=True)
class Face:
    """One generated base class: which declarations it runs, under which names."""

    name: str
    declared_by: str
    execute: str
    operations: tuple[tuple[str, str], ...]
    fields: tuple[str, ...]
    """What the base uses of the class that inherits it, declared for the type checker;
    none for a tenant's sub-handle, which the base constructs from its store and the
    tenant's `Operations`."""
    connection: str | None = None  # the type of `migrate`'s `connection`, on a store
    sync: str | None = None
    """On an async face: the sync face whose docstrings it points to."""


def same(*names: str) -> tuple[tuple[str, str], ...]:
    return tuple((name, name) for name in names)


STORE = same(
    "migrate",
    "run_retention",
    "rebuild",
    "claim_stale_runs",
    "verify",
    "rotate_kek",
    "check_schema",
)
LEDGER = same(
    "create_conversation",
    "conversation",
    "conversation_by_key",
    "conversations",
    "entries",
    "entry",
    "state_changes",
    "append_messages",
    "history",
    "fork",
    "move_head",
    "erase",
    "events",
    "tail",
    "verify",
    "verify_all",
    "export",
    "import_file",
)
RUNS = (
    ("start", "start_run"),
    ("record", "record"),
    ("complete", "complete_run"),
    ("fail", "fail_run"),
    ("renew_lease", "renew_lease"),
    ("get", "run"),
    ("claim_stale", "claim_stale_runs"),
    ("recent", "runs"),
)
RETENTION = (("set", "set_retention"), ("get", "retention"), ("clear", "clear_retention"))
AUDIT = same(
    "events", "run_timeline", "model_request", "tool_executions", "supplied_and_repaired", "lineage"
)


def faces() -> list[Face]:
    out = []
    for a, connection, wait in (("", "Connection", ""), ("Async", "AsyncConnection", "Async")):
        executor, iterator = f"{wait}Executor", f"{wait}Iterator"
        store = (
            f"{a}Store",
            "StoreOperations",
            "self.execute",
            STORE,
            (
                "_ops: StoreOperations",
                f"{'async ' if a else ''}def execute(self, op: Op[T], "
                f"connection: {connection} | None = None) -> T: ...",
            ),
        )
        tenant = ("_ops: Operations", f"_store: {executor}")
        for name, declared_by, execute, operations, fields in (
            store,
            (
                f"{a}Ledger",
                "Operations",
                "self._store.execute",
                LEDGER,
                (
                    *tenant,
                    f"def _tail(self, settings: TailSettings) -> {iterator}[Page[Event]]: ...",
                ),
            ),
            (f"{a}Runs", "Operations", "self._store.execute", RUNS, ()),
            (f"{a}Retention", "Operations", "self._store.execute", RETENTION, ()),
            (
                f"{a}Audit",
                "AuditOperations",
                "self._store.execute",
                AUDIT,
                ("_ops: AuditOperations", f"_store: {executor}"),
            ),
        ):
            out.append(
                Face(
                    f"{name}Face",
                    declared_by,
                    execute,
                    operations,
                    fields,
                    f"{connection} | None" if declared_by == "StoreOperations" else None,
                    name.removeprefix("Async") if a else None,
                )
            )
    return out


Declared = dict[str, tuple[str, dict[str, ast.FunctionDef]]]


def declarations() -> Declared:
    """Each declaring class: the source of its file, and its methods by name."""
    found: Declared = {}
    for path in DECLARATIONS:
        source = path.read_text()
        for node in ast.parse(source).body:
            if isinstance(node, ast.ClassDef) and node.name.endswith("Operations"):
                methods = {i.name: i for i in node.body if isinstance(i, ast.FunctionDef)}
                found[node.name] = (source, methods)
    return found


def parameters(fn: ast.FunctionDef) -> list[tuple[str, str, bool]]:
    """Each parameter after `self`: its text, its name, whether it is keyword-only;
    a bare `*` as ("*", "", False)."""
    args = fn.args
    assert not args.posonlyargs and args.vararg is None and args.kwarg is None, fn.name
    positional = args.args[1:]
    defaults: list[ast.expr | None] = [None] * (len(args.args) - len(args.defaults))
    defaults += list(args.defaults)
    out: list[tuple[str, str, bool]] = []

    def text(arg: ast.arg, default: ast.expr | None) -> str:
        assert arg.annotation is not None, f"{fn.name}({arg.arg}) has no annotation"
        written = f"{arg.arg}: {ast.unparse(arg.annotation)}"
        return written if default is None else f"{written} = {ast.unparse(default)}"

    for arg, default in zip(positional, defaults[1:], strict=True):
        out.append((text(arg, default), arg.arg, False))
    if args.kwonlyargs:
        out.append(("*", "", False))
        for arg, kw_default in zip(args.kwonlyargs, args.kw_defaults, strict=True):
            out.append((text(arg, kw_default), arg.arg, True))
    return out


def call(head: str, items: list[str], indent: str, tail: str = "") -> list[str]:
    """`head(items...)tail` on one line when it fits, else one item a line."""
    line = f"{indent}{head}({', '.join(items)}){tail}"
    if len(line) <= WIDTH or not items:
        return [line]
    return [f"{indent}{head}(", *(f"{indent}    {item}," for item in items), f"{indent}){tail}"]


def method(face: Face, name: str, fn: ast.FunctionDef, source: str) -> list[str]:
    is_async = face.sync is not None
    assert fn.returns is not None, fn.name
    returns = ast.unparse(fn.returns)
    params = parameters(fn)
    if fn.name == "migrate" and face.connection is not None:
        params.insert(0, (f"connection: {face.connection} = None", "", False))
    args = [p for p, _, _ in params]
    passed = [f"{n}={n}" if kw else n for _, n, kw in params if n]
    ops = f"self._ops.{fn.name}"
    if returns == "TailSettings":
        result = "AsyncIterator[Page[Event]]" if is_async else "Iterator[Page[Event]]"
        define, body = "def", call(f"return self._tail({ops}", passed, " " * 8, ")")
    else:
        kind, _, inner = returns.partition("[")
        assert kind in ("Op", "Program") and inner.endswith("]"), f"{fn.name} -> {returns}"
        result = inner[:-1]
        define = "async def" if is_async else "def"
        wait = "await " if is_async else ""
        one = f"{ops}({', '.join(passed)})"
        runner, extra = (
            (face.execute, "")
            if kind == "Op"
            else ("adrive" if is_async else "drive", face.execute)
        )
        if kind == "Op" and fn.name == "migrate" and face.connection:
            extra = "connection"
        single = f"        return {wait}{runner}({one}{', ' + extra if extra else ''})"
        if len(single) <= WIDTH:
            body = [single]
        else:
            body = [
                f"        return {wait}{runner}(",
                *call(ops, passed, " " * 12, "," if extra else ""),
                *([f"            {extra},"] if extra else []),
                "        )",
            ]
    signature = call(f"{define} {name}", ["self", *args], "    ", f" -> {result}:")
    if is_async:
        # The sync face's method documents it (the reference reads it there).
        docstring = f'"""See `{face.sync}.{name}`."""'
    else:
        doc = fn.body[0]
        assert isinstance(doc, ast.Expr) and isinstance(doc.value, ast.Constant), fn.name
        found = ast.get_source_segment(source, doc)
        assert found is not None
        docstring = found
    return [*signature, f"        {docstring}", *body]


def render(face: Face, declared: Declared) -> list[str]:
    source, methods = declared[face.declared_by]
    owner = face.name.removesuffix("Face")
    lines = [f"class {face.name}:", f'    """The operations of `{owner}`."""', ""]
    if face.fields:
        lines.append("    if TYPE_CHECKING:")
        for field in face.fields:
            if field.startswith(("def ", "async def ")):
                lines.append("")
            lines.append(f"        {field}")
    else:
        executor = "AsyncExecutor" if face.sync else "Executor"
        lines += [
            f"    def __init__(self, store: {executor}, ops: {face.declared_by}) -> None:",
            "        self._store = store",
            "        self._ops = ops",
        ]
    for name, op in face.operations:
        lines.append("")
        lines += method(face, name, methods[op], source)
    return lines


# Where the names a generated annotation or default uses come from, beyond the
# declaring modules' own imports and classes.
KNOWN = {
    "AsyncConnection": "sqlalchemy.ext.asyncio",
    "AsyncExecutor": "chatledger.store._sql.ops",
    "AsyncIterator": "collections.abc",
    "Executor": "chatledger.store._sql.ops",
    "Iterator": "collections.abc",
    "Page": "chatledger.store._sql.pages",
}
RUNTIME = {
    "TYPE_CHECKING": "typing",
    "TypeVar": "typing",
    "adrive": "chatledger.store._sealing",
    "drive": "chatledger.store._sealing",
}


def origins() -> dict[str, str]:
    """The module each name the declaring modules use comes from."""
    found = dict(KNOWN)
    for path in DECLARATIONS:
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                found.update((a.asname or a.name, node.module) for a in node.names)
            elif isinstance(node, ast.Import):
                found.update((a.asname or a.name, f"import {a.name}") for a in node.names)
            elif isinstance(node, ast.ClassDef):
                found[node.name] = f"chatledger.store.{path.stem}"
    return found


def imports(body: str) -> tuple[list[str], list[str]]:
    """The import lines `body` needs: at run time (defaults, calls), and for the
    type checker only (annotations)."""
    tree = ast.parse(body)
    used = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    runtime = {"TYPE_CHECKING", "TypeVar"} | (set(RUNTIME) & used)
    typing: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            a = node.args
            for default in [*a.defaults, *(d for d in a.kw_defaults if d is not None)]:
                runtime |= {n.id for n in ast.walk(default) if isinstance(n, ast.Name)}
        annotations = []
        if isinstance(node, ast.arg) and node.annotation is not None:
            annotations.append(node.annotation)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.returns is not None:
            annotations.append(node.returns)
        if isinstance(node, ast.AnnAssign):
            annotations.append(node.annotation)
        for annotation in annotations:
            typing |= {n.id for n in ast.walk(annotation) if isinstance(n, ast.Name)}
    where = {**origins(), **RUNTIME}
    typing -= runtime | set(dir(builtins)) | {"T"}
    runtime -= set(dir(builtins))
    return import_lines(runtime, where), import_lines(typing, where)


def import_lines(names: set[str], where: dict[str, str]) -> list[str]:
    """`from module import names` lines in isort's order: standard library, then
    third-party, then first-party, each section by module."""
    by_module: dict[str, list[str]] = {}
    for name in names:
        by_module.setdefault(where[name], []).append(name)

    def section(module: str) -> int:
        top = module.removeprefix("import ").partition(".")[0]
        return 2 if top == "chatledger" else 0 if top in sys.stdlib_module_names else 1

    def order(module: str) -> tuple[int, bool, str]:  # `import x` before `from x import y`
        return section(module), not module.startswith("import "), module

    out: list[str] = []
    last = None
    for module in sorted(by_module, key=order):
        if last is not None and section(module) != last:
            out.append("")
        last = section(module)
        if module.startswith("import "):
            out.append(module)
            continue
        listed = sorted(by_module[module], key=lambda n: (not n.isupper(), not n[:1].isupper(), n))
        out += _from(module, listed)
    return out


def _from(module: str, names: list[str]) -> list[str]:
    line = f"from {module} import {', '.join(names)}"
    if len(line) <= WIDTH:
        return [line]
    return [f"from {module} import (", *(f"    {n}," for n in names), ")"]


HEADER = '''\
"""The operations of the store's faces, written by scripts/faces.py from their
declarations (`store/_ops.py`, `store/_audit.py`): edit those, then run it.

Each class here is the base of one face, `Store`, `Ledger`, `Runs`, `Retention`,
`Audit` and their async twins, each of which adds only what is its own:
construction, `execute`, properties, the tail's waiter
(docs/adr/0043-one-declaration-per-operation.md). An async face's method points
to the sync face's, which documents both.
"""

from __future__ import annotations
'''


def generate() -> str:
    declared = declarations()
    classes: list[str] = []
    names = []
    for face in faces():
        names.append(face.name)
        classes += ["", "", *render(face, declared)]
    body = "\n".join(classes)
    runtime, typing = imports(body)
    lines = [
        HEADER.rstrip("\n"),
        "",
        *runtime,
        "",
        "if TYPE_CHECKING:",
        *(f"    {t}" if t else "" for t in typing),
    ]
    lines += ["", "__all__ = [", *(f'    "{n}",' for n in sorted(names)), "]"]
    lines += ["", 'T = TypeVar("T")', body]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if stale")
    check = parser.parse_args().check
    text = generate()
    stale = not OUT.exists() or OUT.read_text() != text
    if stale and not check:
        OUT.write_text(text)
    if stale:
        where = OUT.relative_to(ROOT)
        print(f"{where}: {'stale, run python scripts/faces.py' if check else 'rewritten'}")
    return 1 if check and stale else 0


if __name__ == "__main__":
    sys.exit(main())
