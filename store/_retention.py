"""A retention pass: erase (or export, then erase) what each tenant's policy says is due.

Run by `Store.run_retention` (and `AsyncStore.run_retention`, driving the
same program of `Op`s) and `chatledger retention run`, which a scheduler
calls. Each subject is its own unit of work: its conversations are
exported (each to a file written aside and renamed into place once synced)
and then the subject is erased in one transaction. A pass killed anywhere
leaves every subject either untouched, exported and not yet erased, or
erased; the next pass finds the erased ones no longer due and does the rest
again (an export overwrites its file whole). A dry run reads the plans and
writes nothing.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Protocol, TextIO
from urllib.parse import quote

from chatledger.store._cache import MessageCache
from chatledger.store._errors import ChatledgerError, InvalidInputError
from chatledger.store._sealing import Blocking, Program
from chatledger.store._sql import erasure as _erasure
from chatledger.store._sql import retention as _retention
from chatledger.store._sql.ops import Op
from chatledger.store._sql.retention import RetentionPlan, RetentionPolicy
from chatledger.store._sql.transfer import ExportReport


class TenantOperations(Protocol):
    """What a pass needs of a tenant's operations (`store._ops.Operations`, which
    imports this module: a structural type keeps the import one way)."""

    @property
    def cache(self) -> MessageCache: ...

    def retention(self) -> Op[RetentionPolicy | None]: ...

    def export(self, out: TextIO, *, conversation_id: str | None = None) -> Op[ExportReport]: ...

__all__ = ["RetentionReport", "SubjectOutcome", "export_path", "run_retention"]


@dataclass(frozen=True)
class SubjectOutcome:
    """What the pass did (or, in a dry run, would do) with one due subject."""

    tenant: str
    subject: str
    conversation_ids: list[str]
    exported: list[str] = field(default_factory=list)
    """The export files written (`export-erase`), one per conversation."""
    erased: bool = False
    active: bool = False
    """True when the subject was written to after the plan was made: kept (its
    exports stay)."""
    error: str | None = None
    """Why this subject failed; the pass went on with the others."""


@dataclass(frozen=True)
class RetentionReport:
    """A retention pass: each tenant's plan and what was done with it."""

    dry_run: bool
    plans: list[RetentionPlan]
    subjects: list[SubjectOutcome]

    @property
    def failed(self) -> list[SubjectOutcome]:
        return [s for s in self.subjects if s.error is not None]


def export_path(export_dir: str | os.PathLike[str], tenant: str, conversation_id: str) -> Path:
    """Where `export-erase` writes a conversation's export: one directory per tenant,
    `tenant-<the tenant, percent-encoded>` (never `.` or `..`)."""
    return Path(export_dir) / f"tenant-{quote(tenant, safe='')}" / f"{conversation_id}.jsonl"


def run_retention(
    ops_for: Callable[[str], TenantOperations],
    *,
    tenant: str | None,
    export_dir: str | os.PathLike[str] | None,
    dry_run: bool,
    now: datetime | None,
    progress: Callable[[SubjectOutcome], None] | None = None,
) -> Program[RetentionReport]:
    """Apply the retention policy of `tenant` (default: every tenant that has one),
    as a program of `Op`s (`store._sealing`) that each face drives; `progress`
    with each subject's outcome."""
    if now is not None and not isinstance(now, datetime):
        raise InvalidInputError(f"now must be a datetime, not {type(now).__name__}.")
    policies: list[RetentionPolicy]
    if tenant is None:
        policies = yield Op("reading retention policies", write=False, fn=_retention.list_policies)
    else:
        found = yield ops_for(tenant).retention()
        policies = [] if found is None else [found]
    needs_dir = [p.tenant for p in policies if p.action == "export-erase"]
    if needs_dir and export_dir is None and not dry_run:
        raise InvalidInputError(
            f"The retention policy of {', '.join(repr(t) for t in needs_dir)} exports "
            f"conversations before erasing them: pass an export directory (--export-dir)."
        )
    plans: list[RetentionPlan] = []
    for policy in policies:
        plans.append((yield _plan(policy, now)))
    outcomes: list[SubjectOutcome] = []
    for plan in plans:
        for subject, conversation_ids in plan.due.items():
            if dry_run:
                outcomes.append(SubjectOutcome(plan.tenant, subject, conversation_ids))
            else:
                ops = ops_for(plan.tenant)
                outcomes.append(
                    (yield from _apply(ops, plan, subject, conversation_ids, export_dir))
                )
            if progress is not None:
                progress(outcomes[-1])
    return RetentionReport(dry_run, plans, outcomes)


def _plan(policy: RetentionPolicy, now: datetime | None) -> Op[RetentionPlan]:
    return Op(
        f"planning the retention of tenant '{policy.tenant}'",
        write=False,
        fn=lambda c: _retention.plan(c, policy, now),
    )


def _apply(
    ops: TenantOperations,
    plan: RetentionPlan,
    subject: str,
    conversation_ids: list[str],
    export_dir: str | os.PathLike[str] | None,
) -> Program[SubjectOutcome]:
    exported: list[str] = []
    try:
        if plan.policy.action == "export-erase":
            assert export_dir is not None
            for conversation_id in conversation_ids:
                path = export_path(export_dir, plan.tenant, conversation_id)
                yield from _export(ops, conversation_id, path)
                exported.append(str(path))
        reason = (
            f"retention: idle for {plan.policy.idle_days} days "
            f"(nothing since {plan.cutoff.isoformat()})"
        )
        done = yield Op(
            f"erasing subject '{subject}' of tenant '{plan.tenant}'",
            write=True,
            fn=lambda c: _erasure.erase_if_idle(
                c,
                plan.tenant,
                subject,
                reason,
                conversation_ids=conversation_ids,
                idle_before=plan.cutoff,
            ),
        )
    except (ChatledgerError, OSError) as error:
        return SubjectOutcome(
            plan.tenant, subject, conversation_ids, exported, error=" ".join(str(error).split())
        )
    if done is None:  # written to since the plan, or a new conversation: not due now
        return SubjectOutcome(plan.tenant, subject, conversation_ids, exported, active=True)
    ops.cache.clear()  # opened messages leave memory, as after Ledger.erase
    return SubjectOutcome(plan.tenant, subject, conversation_ids, exported, erased=True)


def _export(ops: TenantOperations, conversation_id: str, path: Path) -> Program[None]:
    """Export one conversation to `path`, whole or not at all: written aside, synced,
    renamed into place, and the directory synced. The file work is `Blocking`
    (`AsyncStore` does it in a worker thread)."""
    out, aside = yield Blocking(lambda: _open_aside(path))
    try:
        with out:
            yield ops.export(out, conversation_id=conversation_id)
            yield Blocking(lambda: _sync(out))
        yield Blocking(lambda: _publish(aside, path))
    except BaseException:
        Path(aside).unlink(missing_ok=True)
        raise


def _open_aside(path: Path) -> tuple[TextIO, str]:
    """A new file beside `path`, open for writing, and its name."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, aside = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        return os.fdopen(handle, "w", encoding="utf-8", newline=""), aside
    except BaseException:
        os.close(handle)
        Path(aside).unlink(missing_ok=True)
        raise


def _sync(out: TextIO) -> None:
    out.flush()
    os.fsync(out.fileno())


def _publish(aside: str, path: Path) -> None:
    """Rename `aside` into place at `path`, and sync the directory."""
    os.replace(aside, path)
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)
