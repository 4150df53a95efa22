"""`chatledger export` and `chatledger import`: a tenant's log as JSON Lines, and back (docs/export.md).

```
chatledger export [--tenant T] [--conversation ID] [--output FILE]
chatledger import FILE [--json]
```

`export` writes to stdout unless `--output` names a file; a file is written
beside its final name, synced, and renamed into place once the export is
complete, so a failed export leaves no half file behind. Writing to a file with stderr on
a terminal, it shows the running count of events there, updated in place. A
one-line summary always ends on stderr (stdout holds only the export).
`import` takes the tenant from the file's header and prints what it wrote
and what was already there; a file it refuses writes nothing.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TextIO

from chatledger.engine._cli._common import (
    DEFAULT_TENANT,
    UsageError,
    open_store,
    print_json,
    to_json,
)
from chatledger.store import ExportReport, ImportReport


def export(args: argparse.Namespace) -> int:
    with open_store(args) as store:
        ledger = store.tenant(args.tenant)
        if args.output in (None, "-"):
            report = ledger.export(sys.stdout, conversation_id=args.conversation)
            sys.stdout.flush()
            where = "stdout"
        else:
            path = Path(args.output)
            shown = _Progress("exported") if sys.stderr.isatty() else None
            try:
                with _writing(path) as out:
                    report = ledger.export(out, conversation_id=args.conversation, progress=shown)
            finally:
                if shown is not None:
                    shown.clear()
            where = str(path)
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
        shown = _Progress("read") if sys.stderr.isatty() else None
        with open_store(args) as store:
            try:
                report = store.tenant(tenant).import_file(source, progress=shown)
            finally:
                if shown is not None:
                    shown.clear()
    if args.json:
        print_json({"tenant": tenant, **to_json(report, ImportReport)})
        return 0
    print(
        f"Imported {len(report.conversations):,} conversations ({report.events:,} events) "
        f"into tenant '{tenant}'; {len(report.already_present):,} were already there."
    )
    for conversation_id in report.conversations:
        print(f"  imported         {conversation_id}")
    for conversation_id in report.already_present:
        print(f"  already present  {conversation_id}")
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
        f"Exported {report.conversations:,} conversations, {report.events:,} events "
        f"({report.lines:,} lines, sha256 {report.sha256}) of tenant '{tenant}' to {where}."
    )


class _Progress:
    """The running count of events on stderr, one line rewritten in place, at most 10 times a second."""

    def __init__(self, verb: str) -> None:
        self.verb = verb
        self.shown = 0.0
        self.width = 0

    def __call__(self, count: int) -> None:
        now = time.monotonic()
        if now - self.shown >= 0.1:
            self.shown = now
            line = f"{self.verb} {count:,} events"
            self.width = len(line)
            print(f"\r{line}", end="", file=sys.stderr, flush=True)

    def clear(self) -> None:
        if self.width:
            print("\r" + " " * self.width + "\r", end="", file=sys.stderr, flush=True)
