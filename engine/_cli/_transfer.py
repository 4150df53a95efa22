"""`chatledger export` and `chatledger import`: a tenant's log as JSON Lines, and back (docs/export.md).

```
chatledger export [--tenant T] [--conversation ID] [--output FILE]
chatledger import FILE [--json]
```

`export` writes to stdout unless `--output` names a file; a file is written
beside its final name, synced, and renamed into place once the export is
complete, so a failed export leaves no half file behind. With stderr on a
terminal (and the export not on it too), a bar counts the events there. A
one-line summary always ends on stderr (stdout holds only the export), or with
`--output` and `--json`, the report on stdout. `import` takes the tenant from
the file's header and prints how many conversations it wrote and how many were
already there (`--json` lists them); a file it refuses writes nothing.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TextIO

from chatledger.engine._cli._common import (
    DEFAULT_TENANT,
    UsageError,
    counted,
    open_store,
    print_json,
    progress,
)
from chatledger.store import ExportReport, ImportReport
from chatledger.store._json import to_json


def export(args: argparse.Namespace) -> int:
    to_stdout = args.output in (None, "-")
    if to_stdout and args.json:
        raise UsageError(
            "export --json prints its report on stdout, which holds the export itself: "
            "pass --output FILE with --json."
        )
    with (
        open_store(args) as store,
        progress(
            "exporting", unit=" events", show=not (to_stdout and sys.stdout.isatty())
        ) as shown,
    ):
        ledger = store.tenant(args.tenant)
        if to_stdout:
            report = ledger.export(sys.stdout, conversation_id=args.conversation, progress=shown.at)
            sys.stdout.flush()
            where = "stdout"
        else:
            path = Path(args.output)
            with _writing(path) as out:
                report = ledger.export(out, conversation_id=args.conversation, progress=shown.at)
            where = str(path)
    if args.json:
        print_json({"tenant": args.tenant, "file": where, **to_json(report, ExportReport)})
    else:
        print(_summary(report, args.tenant, where), file=sys.stderr)
    return 0


def import_(args: argparse.Namespace) -> int:
    path = Path(args.file)
    try:
        source = path.open(encoding="utf-8")
    except OSError as error:
        raise UsageError(f"Cannot read {args.file}: {error.strerror or error}.") from None
    with source:
        try:
            tenant = _tenant_of(source.readline())
        except UnicodeDecodeError:
            tenant = DEFAULT_TENANT  # the import says so, at line 1
        source.seek(0)
        with open_store(args) as store, progress("importing", unit=" events") as shown:
            report = store.tenant(tenant).import_file(source, progress=shown.at)
    if args.json:
        print_json({"tenant": tenant, **to_json(report, ImportReport)})
        return 0
    already = len(report.already_present)
    print(
        f"Imported {counted(len(report.conversations), 'conversation')} "
        f"({counted(report.events, 'event')}) into tenant '{tenant}'; "
        f"{already:,} {'was' if already == 1 else 'were'} already there."
    )
    return 0


@contextlib.contextmanager
def _writing(path: Path) -> Iterator[TextIO]:
    """A file written aside, synced and renamed to `path` once the block completes;
    removed if it fails, so `path` holds a whole export or what it held before."""
    try:
        handle, aside = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    except OSError as error:
        raise UsageError(f"Cannot write {path}: {error.strerror or error}.") from None
    try:
        with os.fdopen(handle, "w", encoding="utf-8", newline="\n") as out:
            yield out
            out.flush()
            os.fsync(out.fileno())
        os.replace(aside, path)
    except BaseException:
        Path(aside).unlink(missing_ok=True)
        raise


def _tenant_of(header: str) -> str:
    """The tenant a file's header names; the default one when it names none (the import
    then refuses the header, at line 1, saying what is wrong with it)."""
    try:
        tenant = json.loads(header).get("tenant")
    except (ValueError, AttributeError):
        return DEFAULT_TENANT
    return tenant if isinstance(tenant, str) and tenant else DEFAULT_TENANT


def _summary(report: ExportReport, tenant: str, where: str) -> str:
    return (
        f"Exported {counted(report.conversations, 'conversation')}, "
        f"{counted(report.events, 'event')} ({counted(report.lines, 'line')}, sha256 "
        f"{report.sha256}) of tenant '{tenant}' to {where}."
    )
