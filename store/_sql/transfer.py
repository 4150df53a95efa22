"""Export: a conversation, or a tenant, as JSON Lines; and the format both directions share.

An export is the log as stored, byte for byte: every event with its id,
place, payload text (sealed payloads stay sealed) and hash, and every row
needed to rebuild the conversation elsewhere (the conversation, its branches,
its runs, its subject's wrapped data key). View rows are not exported: the
import rebuilds them from the events. A fork needs its source's events up to
the fork point, so a conversation's ancestors are exported first, complete.

Line 1 is a header, the last line an `end` record holding the line count
and the sha256 of every line before it. Between them, per conversation: its
`conversation` record, its `subjectKey` (when its subject still has a key),
its `branch` records (each parent before its children), its `run` records,
then its `event` records, branch by branch in position order, so that an
import recomputes every hash as it reads (`store._sql.importer`). Each
record carries its table's columns under camelCase names (times ISO 8601 in
UTC, hashes hex, the wrapped key base64): `Record`, `encode` and `decode`
are the one place that knows how. docs/export.md is the contract.

The export streams (server-side cursors on Postgres) from one snapshot
(REPEATABLE READ on Postgres; a SQLite read transaction is one already).
"""

from __future__ import annotations

import base64
import binascii
import functools
import hashlib
import json
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, TextIO, get_args

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from chatledger.store._checks import MAX_INT32
from chatledger.store._errors import InvalidInputError
from chatledger.store._sql.dialect import is_sqlite
from chatledger.store._sql.entries import MINTED
from chatledger.store._sql.log import get_conversation, utc
from chatledger.store._values import VALUE_CONFIG, BranchReason, EventKind, Origin, RunStatus
from chatledger.store.ids import is_id
from chatledger.store.schema import (
    branches,
    conversations,
    event_ids,
    events,
    runs,
    subject_keys,
)

__all__ = [
    "BATCH",
    "BRANCH",
    "CONVERSATION",
    "EVENT",
    "FORMAT",
    "RUN",
    "SUBJECT_KEY",
    "VERSION",
    "ExportReport",
    "ImportFileError",
    "ImportReport",
    "Progress",
    "Record",
    "decode",
    "encode",
    "export",
]

FORMAT = "chatledger-export"
VERSION = 1
BATCH = 500
"""Rows fetched per round trip when exporting, and events inserted per statement when importing."""

Progress = Callable[[int], None]
"""Called with the running count of events exported or imported."""


class ImportFileError(InvalidInputError):
    """An import file that cannot be imported as it is. Nothing was written.

    Attributes:
        line: the 1-based line of the file at fault.
    """

    def __init__(self, line: int, problem: str) -> None:
        self.line = line
        super().__init__(f"Line {line} of the import file: {problem} Nothing was imported.")


@dataclass(frozen=True)
class ExportReport:
    """What an export wrote: conversations, events, lines (header and end record
    included), and the sha256 (hex) its end record holds."""

    __pydantic_config__ = VALUE_CONFIG

    conversations: int
    events: int
    lines: int
    sha256: str


@dataclass(frozen=True)
class ImportReport:
    """What an import did: the conversations it wrote, those the target held
    already (identical), and how many events it wrote."""

    __pydantic_config__ = VALUE_CONFIG

    conversations: list[str]
    already_present: list[str]
    events: int


# -- records --------------------------------------------------------------------------


@dataclass(frozen=True)
class Record:
    """A record type: the table it copies, and the columns left out (derived, or the target's own)."""

    name: str
    table: sa.Table
    derived: tuple[str, ...] = ()

    @functools.cached_property
    def columns(self) -> list[tuple[sa.Column[Any], str]]:
        """Each column the record carries, with its field name."""
        return [(c, _camel(c.name)) for c in self.table.columns if c.name not in self.derived]

    @functools.cached_property
    def fields(self) -> frozenset[str]:
        return frozenset({"type", _EXTRA.get(self.name, "type")} | {f for _, f in self.columns})


CONVERSATION = Record("conversation", conversations, ("head_open",))
SUBJECT_KEY = Record("subjectKey", subject_keys)
# A branch's and an event's tenant is their conversation's (a copy that
# Citus distributes by, docs/adr/0054): the file says it once, per conversation.
BRANCH = Record("branch", branches, ("tenant",))
RUN = Record("run", runs)
EVENT = Record("event", events, ("seq", "txid", "tenant"))
_EXTRA = {"conversation": "events", "event": "callerMinted"}
"""The one field each record type has beyond its columns."""


_CHOICES: dict[tuple[str, str], tuple[str, ...]] = {
    ("chatledger_events", "kind"): get_args(EventKind),
    ("chatledger_events", "origin"): get_args(Origin),
    ("chatledger_branches", "reason"): get_args(BranchReason),
    ("chatledger_runs", "status"): get_args(RunStatus),
}
"""The columns that hold one of a few values (the tables' CHECK constraints, and the event kinds)."""


def _camel(name: str) -> str:
    first, *rest = name.split("_")
    return first + "".join(part.title() for part in rest)


def encode(record: Record, row: Any, **extra: Any) -> dict[str, Any]:
    """A row of the record's table as the record, with `extra` fields after its columns."""
    m = row._mapping
    out: dict[str, Any] = {"type": record.name}
    for column, name in record.columns:
        value = m[column.name]
        if value is None:
            pass
        elif isinstance(column.type, sa.DateTime):
            value = utc(value).isoformat(timespec="microseconds")
        elif isinstance(column.type, sa.LargeBinary):
            value = bytes(value)
            value = base64.b64encode(value).decode() if column.name == "wrapped" else value.hex()
        elif isinstance(column.type, sa.Boolean):
            value = bool(value)
        elif isinstance(column.type, sa.String):
            value = str(value)  # a native uuid too
        out[name] = value
    return {**out, **extra}


def decode(record: Record, data: dict[str, Any], line: int) -> dict[str, Any]:
    """The column values of a record read at `line`, each checked against its column's
    type (`ImportFileError` otherwise); a missing field is null, or the column's default."""
    unknown = sorted(set(data) - record.fields)
    if unknown:
        raise ImportFileError(
            line,
            f"A {record.name} record has a field '{unknown[0]}', which version {VERSION} of the "
            f"format does not have. The file was edited; export it again from the source.",
        )
    values: dict[str, Any] = {}
    for column, name in record.columns:
        if name not in data:
            if column.server_default is not None:
                continue
            if not column.nullable:
                raise ImportFileError(
                    line,
                    f"The {record.name} record has no field '{name}'. The file was edited or "
                    f"damaged; export it again from the source.",
                )
        values[column.name] = _value(column, name, data.get(name), record.name, line)
    return values


def _value(column: sa.Column[Any], name: str, value: Any, record: str, line: int) -> Any:
    expected, t = None, column.type
    if value is None:
        if not column.nullable:
            expected = "a value (it cannot be null)"
    elif isinstance(t, sa.Boolean):
        if not isinstance(value, bool):
            expected = "true or false"
    elif isinstance(t, sa.Integer):
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_INT32:
            expected = f"a whole number from 0 to {MAX_INT32:,}"
    elif isinstance(t, sa.DateTime):
        moment = _time(value)
        if moment is None:
            expected = "an ISO 8601 time with its UTC offset"
        value = moment or value
    elif isinstance(t, sa.LargeBinary):
        value, expected = _bytes(value, base64_=column.name == "wrapped")
    elif isinstance(t, sa.String):
        if not isinstance(value, str) or "\x00" in value or not _encodable(value):
            expected = "a string of Unicode text with no NUL character"
        elif t.length == 36 and not is_id(value):  # an `Id` column
            expected = "a UUID in canonical form (lowercase, hyphenated)"
        elif t.length is not None and len(value) > t.length:
            expected = f"a string of at most {t.length} characters"
        elif value not in _CHOICES.get((column.table.name, column.name), (value,)):
            choices = _CHOICES[(column.table.name, column.name)]
            expected = f"one of {', '.join(choices)} (a newer chatledger may know more)"
    if expected is not None:
        raise ImportFileError(
            line,
            f"Field '{name}' of the {record} record is {value!r:.80}, not {expected}. The "
            f"file was edited or damaged; export it again from the source.",
        )
    return value


def _time(value: Any) -> datetime | None:
    try:
        moment = datetime.fromisoformat(value) if isinstance(value, str) else None
    except ValueError:
        return None
    return None if moment is None or moment.tzinfo is None else moment.astimezone(UTC)


def _bytes(value: Any, *, base64_: bool) -> tuple[Any, str | None]:
    if isinstance(value, str):
        try:
            return (
                base64.b64decode(value, validate=True) if base64_ else bytes.fromhex(value)
            ), None
        except (ValueError, binascii.Error):
            pass
    return value, "base64 text" if base64_ else "hexadecimal text"


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


# -- export -----------------------------------------------------------------------------


class _Writer:
    """Writes records as lines, counting them and hashing their bytes."""

    def __init__(self, out: TextIO) -> None:
        self.out = out
        self.digest = hashlib.sha256()
        self.lines = 0

    def write(self, record: dict[str, Any]) -> None:
        # ASCII only: the bytes (which the digest covers) are the same in any
        # encoding the stream may have, and no text needs decoding to be checked.
        line = json.dumps(record, separators=(",", ":")) + "\n"
        self.out.write(line)
        self.digest.update(line.encode("ascii"))
        self.lines += 1

    def end(self) -> str:
        sha256 = self.digest.hexdigest()
        self.write({"type": "end", "lines": self.lines, "sha256": sha256})
        return sha256


def export(
    conn: Connection,
    tenant: str,
    out: TextIO,
    conversation_id: str | None,
    progress: Progress | None,
) -> ExportReport:
    """Write the tenant's conversations (or one, with its ancestors) to `out`."""
    if not is_sqlite(conn):
        # Every row from one snapshot: a conversation's events, runs and head agree.
        conn.exec_driver_sql("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
    order = _export_order(conn, tenant, conversation_id)
    w = _Writer(out)
    w.write(
        {
            "format": FORMAT,
            "version": VERSION,
            "tenant": tenant,
            "exportedAt": datetime.now(UTC).isoformat(timespec="microseconds"),
        }
    )
    written, subjects = 0, set()
    for cid in order:
        row = conn.execute(sa.select(conversations).where(conversations.c.id == cid)).one()
        count = conn.execute(
            sa.select(sa.func.count()).where(events.c.conversation_id == cid)
        ).scalar_one()
        w.write(encode(CONVERSATION, row, events=count))
        if row.subject is not None and row.subject not in subjects:
            subjects.add(row.subject)
            key = conn.execute(
                sa.select(subject_keys).where(
                    subject_keys.c.tenant == tenant, subject_keys.c.subject == row.subject
                )
            ).first()
            if key is not None:  # an erased subject has none: its copy reads as erased
                w.write(encode(SUBJECT_KEY, key))
        tree = _parents_first(
            conn.execute(
                sa.select(branches).where(branches.c.conversation_id == cid).order_by(branches.c.id)
            ).all()
        )
        for branch in tree:
            w.write(encode(BRANCH, branch))
        for run in _stream(
            conn, sa.select(runs).where(runs.c.conversation_id == cid).order_by(runs.c.id)
        ):
            w.write(encode(RUN, run))
        minted = event_ids.c.id.is_not(None).label("caller_minted")
        for branch in tree:
            query = (
                sa.select(events, minted)
                .select_from(events.outerjoin(event_ids, MINTED))
                .where(events.c.conversation_id == cid, events.c.branch_id == branch.id)
                .order_by(events.c.position)
            )
            for event in _stream(conn, query):
                w.write(encode(EVENT, event, callerMinted=bool(event.caller_minted)))
                written += 1
                if progress is not None:
                    progress(written)
    sha256 = w.end()
    return ExportReport(len(order), written, w.lines, sha256)


def _stream(conn: Connection, query: sa.Select[Any]) -> Iterator[Any]:
    """The rows of `query`, `BATCH` at a time (a server-side cursor on Postgres)."""
    yield from conn.execute(query.execution_options(yield_per=BATCH))


def _export_order(conn: Connection, tenant: str, conversation_id: str | None) -> list[str]:
    """The conversations to export, each fork after its source (ancestors of one included)."""
    c = conversations.c
    if conversation_id is not None:
        conv = get_conversation(conn, tenant, conversation_id)  # NotFoundError for another's
        ancestry = [conv.id]
        source = conv.forked_from.conversation_id if conv.forked_from else None
        while source is not None and source not in ancestry:
            ancestry.append(str(source))
            source = conn.execute(
                sa.select(c.forked_from_conversation_id).where(c.id == source, c.tenant == tenant)
            ).scalar()
        return ancestry[::-1]
    # Ids and sources only: two short strings per conversation, never its rows.
    sources = {
        str(i): None if s is None else str(s)
        for i, s in conn.execute(
            sa.select(c.id, c.forked_from_conversation_id).where(c.tenant == tenant).order_by(c.id)
        )
    }
    order: list[str] = []
    done: set[str] = set()
    for cid in sources:
        chain = []
        at: str | None = cid
        while at is not None and at in sources and at not in done:
            chain.append(at)
            done.add(at)
            at = sources[at]
        order.extend(reversed(chain))
    return order


def _parents_first(rows: Sequence[Any]) -> list[Any]:
    """A conversation's branches, each after the branch it continues (when that is one of them)."""
    by_id = {str(r.id): r for r in rows}
    order: list[Any] = []
    done: set[str] = set()
    for row in rows:
        chain = []
        bid: str | None = str(row.id)
        while bid is not None and bid in by_id and bid not in done:
            chain.append(by_id[bid])
            done.add(bid)
            parent = by_id[bid].parent_branch_id
            bid = None if parent is None else str(parent)
        order.extend(reversed(chain))
    return order
