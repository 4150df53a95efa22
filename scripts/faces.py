"""Write the store's faces from the one declaration of each operation.

Every store operation is declared once, as a method of `Operations` (a
tenant's) or `StoreOperations` (the whole database's) in `store/_ops.py`, or
of `AuditOperations` (a tenant's audit queries) in `store/_audit.py`:
its parameters, their defaults and its docstring. The faces people call,
`Store`, `Ledger`, `Runs`, `Retention`, `Audit` and their async twins, run those
declarations; their methods are written here, between the markers in each
class, and nowhere by hand (docs/adr/0043-one-declaration-per-operation.md):

    python scripts/faces.py           # rewrite the generated methods
    python scripts/faces.py --check   # exit 1 if that would change a file

A declaration returns what its face runs: an `Op[T]` (the face returns `T`
from its store's `execute`), a `Program[T]` (driven by `drive`, or `adrive`
on the async face), or `TailSettings` (the face's own `_tail` iterates it).
"""

from __future__ import annotations

import argparse
import ast
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DECLARATIONS = (ROOT / "store" / "_ops.py", ROOT / "store" / "_audit.py")
BEGIN = "    # -- operations: written by scripts/faces.py from their declarations; edit those --"
END = "    # -- end of the operations --"
WIDTH = 100


@dataclass(frozen=True)
class Face:
    """One class of a face: which declarations it runs, under which names."""

    path: str
    name: str
    declared_by: str
    execute: str
    operations: tuple[tuple[str, str], ...]
    connection: str | None = None  # the type of `migrate`'s `connection`, on a store


def same(*names: str) -> tuple[tuple[str, str], ...]:
    return tuple((name, name) for name in names)


STORE = same(
    "migrate", "run_retention", "rebuild", "claim_stale_runs", "verify", "rotate_kek", "check_schema"
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

FACES = [
    face
    for path, prefix, connection in (
        ("store/_store.py", "", "Connection | None"),
        ("store/_async.py", "Async", "AsyncConnection | None"),
    )
    for face in (
        Face(path, f"{prefix}Store", "StoreOperations", "self.execute", STORE, connection),
        Face(path, f"{prefix}Ledger", "Operations", "self._store.execute", LEDGER),
        Face(path, f"{prefix}Runs", "Operations", "self._store.execute", RUNS),
        Face(path, f"{prefix}Retention", "Operations", "self._store.execute", RETENTION),
    )
] + [
    Face("store/_audit.py", f"{prefix}Audit", "AuditOperations", "self._store.execute", AUDIT)
    for prefix in ("", "Async")
]


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


def method(face: Face, name: str, fn: ast.FunctionDef, source: str, is_async: bool) -> list[str]:
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
        runner, extra = (face.execute, "") if kind == "Op" else ("adrive" if is_async else "drive", face.execute)
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
    doc = fn.body[0]
    assert isinstance(doc, ast.Expr) and isinstance(doc.value, ast.Constant), fn.name
    docstring = ast.get_source_segment(source, doc)
    assert docstring is not None
    return [*signature, f"        {docstring}", *body]


def render(face: Face, declared: Declared) -> str:
    is_async = face.name.startswith("Async")
    source, methods = declared[face.declared_by]
    lines = [BEGIN]
    for name, op in face.operations:
        lines.append("")
        lines += method(face, name, methods[op], source, is_async)
    lines += ["", END]
    return "\n".join(lines)


def rewrite(text: str, face: Face, block: str) -> str:
    start = text.index(f"\nclass {face.name}:")
    begin = text.index(BEGIN, start)
    end = text.index(END, begin) + len(END)
    nxt = text.find("\nclass ", start + 1)
    assert nxt == -1 or end < nxt, f"{face.path}: {face.name} has no markers of its own"
    return text[:begin] + block + text[end:]


def generate() -> dict[Path, str]:
    declared = declarations()
    files: dict[Path, str] = {}
    for face in FACES:
        path = ROOT / face.path
        text = files.get(path, path.read_text())
        files[path] = rewrite(text, face, render(face, declared))
    return files


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if stale")
    check = parser.parse_args().check
    stale = []
    for path, text in generate().items():
        if path.read_text() != text:
            stale.append(path.relative_to(ROOT))
            if not check:
                path.write_text(text)
    for path in stale:
        print(f"{path}: {'stale, run python scripts/faces.py' if check else 'rewritten'}")
    return 1 if check and stale else 0


if __name__ == "__main__":
    sys.exit(main())
