"""Import: an export file read back into a tenant's log, checked line by line (docs/export.md).

The file is read one line at a time and written in the caller's transaction
as it goes (events in batches), so a file of any size needs memory only for
the conversation being read: its branches, and the hashes its own branches
continue from. Everything is checked before the transaction may commit: the
header's format, version and tenant; each record's fields against its
table's columns (`store._sql.transfer.decode`); the order (a conversation's
records in the order conversation, subjectKey, branch, run, event; each
parent branch before its children; a branch's events together, at
consecutive positions; a fork after its source, or its source already in
the target); every event's hash, recomputed (`store._sql.chain`) from the
hash before it; the head hash; the event count; and the end record's line
count and sha256. The first problem raises `ImportFileError` naming its
line, and the transaction rolls back: nothing is written.

A conversation the target already holds, with the same head and the same
branch tips (so, by the chain, the same events), is checked and left as it
is: importing a file twice writes nothing the second time. One that differs
is refused at the line of its conversation record.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, TextIO

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from chatledger.store._crypto import ERASED_CONTENT, SEALED_KINDS, is_sealed, split_sealed
from chatledger.store._sql import chain as _chain
from chatledger.store._sql import projector
from chatledger.store._sql.transfer import (
    BATCH,
    BRANCH,
    CONVERSATION,
    EVENT,
    FORMAT,
    RUN,
    SUBJECT_KEY,
    VERSION,
    ImportFileError,
    ImportReport,
    Progress,
    decode,
)
from chatledger.store.schema import (
    branches,
    conversation_keys,
    conversations,
    event_ids,
    events,
    runs,
    subject_keys,
)

__all__ = ["import_file"]

_PHASES = {"conversation": 0, "subjectKey": 1, "branch": 2, "run": 3, "event": 4}
_AGAIN = "export it again from the source"


def _edited(what: str) -> str:
    return f"{what} The file was edited or damaged after it was exported; {_AGAIN}."


@dataclass
class _Section:
    """The conversation being read: what its records said so far."""

    line: int
    row: dict[str, Any]
    expected: int
    present: bool
    phase: int = 0
    branches: dict[str, tuple[str | None, int | None]] = field(default_factory=dict)
    tips: dict[str, tuple[int, bytes]] = field(default_factory=dict)
    current: str | None = None
    needed: dict[tuple[str, int], bytes | None] = field(default_factory=dict)
    events: int = 0
    head_seen: bool = False

    @property
    def id(self) -> str:
        return str(self.row["id"])


class _Import:
    """One import, record by record, inside the caller's transaction."""

    def __init__(self, conn: Connection, tenant: str, progress: Progress | None) -> None:
        self.conn, self.tenant, self.progress = conn, tenant, progress
        self.section: _Section | None = None
        self.seen: set[str] = set()
        self.imported: list[str] = []
        self.present: list[str] = []
        self.pending: list[tuple[int, dict[str, Any], bool]] = []
        self.read = 0
        self.written = 0
        self.keys: dict[str, bool] = {}  # data key id -> whether it may seal this tenant's content

    def take(self, data: dict[str, Any], line: int) -> None:
        kind = data.get("type")
        if kind == "conversation":
            self.close()
            self.conversation(data, line)
            return
        if not isinstance(kind, str) or kind not in _PHASES:
            raise ImportFileError(
                line,
                f"A record of type {kind!r} is not part of version {VERSION} of the format. "
                f"The file was edited, or written by another version; {_AGAIN}.",
            )
        s = self.section
        if s is None or _PHASES[kind] < s.phase:
            after = (
                "before any conversation record" if s is None else f"after its {_name(s.phase)}s"
            )
            raise ImportFileError(
                line,
                _edited(
                    f"A {kind} record comes {after}: a conversation's records come in the order "
                    f"conversation, subjectKey, branch, run, event."
                ),
            )
        s.phase = _PHASES[kind]
        if kind == "subjectKey":
            self.subject_key(s, decode(SUBJECT_KEY, data, line), line)
        elif kind == "branch":
            self.branch(s, decode(BRANCH, data, line), line)
        elif kind == "run":
            self.run(s, decode(RUN, data, line), line)
        else:
            self.event(s, data, line)

    def conversation(self, data: dict[str, Any], line: int) -> None:
        row = decode(CONVERSATION, data, line)
        expected = data.get("events")
        if isinstance(expected, bool) or not isinstance(expected, int) or expected < 1:
            raise ImportFileError(
                line, _edited("The conversation record's 'events' is not a count.")
            )
        cid = str(row["id"])
        self._own(row, "conversation", line)
        self._sealed_columns(row, line)
        for column in ("metadata", "state"):
            if isinstance(row.get(column), str):
                _finite(row[column], f"The {column} of conversation '{row['id']}'", line)
        if cid in self.seen:
            raise ImportFileError(line, _edited(f"Conversation '{cid}' comes a second time."))
        source = row["forked_from_conversation_id"]
        if source is not None and source not in self.seen and not self._have(source):
            raise ImportFileError(
                line,
                f"Conversation '{cid}' is a fork of '{source}', which is neither earlier in the "
                f"file nor in the target for tenant '{self.tenant}'. Export the fork again: an "
                f"export of one conversation brings its source along.",
            )
        c = conversations.c
        found = self.conn.execute(
            sa.select(c.tenant, c.head_branch_id, c.head_position, c.head_hash).where(c.id == cid)
        ).first()
        if found is not None:
            count = self.conn.execute(
                sa.select(sa.func.count()).where(events.c.conversation_id == cid)
            ).scalar_one()
            same = (found.tenant, str(found.head_branch_id), found.head_position) == (
                self.tenant,
                row["head_branch_id"],
                row["head_position"],
            )
            if not same or bytes(found.head_hash) != row["head_hash"] or count != expected:
                raise self._conflict(cid, line)
        else:
            key = row["key"]
            if (
                key is not None
                and self.conn.execute(
                    sa.select(conversation_keys.c.conversation_id).where(
                        conversation_keys.c.tenant == self.tenant, conversation_keys.c.key == key
                    )
                ).first()
            ):
                raise ImportFileError(
                    line,
                    f"Conversation key {key!r} of conversation '{cid}' is taken in the target by "
                    f"another conversation of tenant '{self.tenant}'. Import into a database "
                    f"where the key is free.",
                )
            self.conn.execute(conversations.insert().values(**row, head_open=False))
            if key is not None:
                self.conn.execute(
                    conversation_keys.insert().values(
                        tenant=self.tenant, key=key, conversation_id=cid
                    )
                )
        self.seen.add(cid)
        self.section = _Section(line, row, expected, present=found is not None)

    def subject_key(self, s: _Section, row: dict[str, Any], line: int) -> None:
        self._own(row, "subjectKey", line)
        if row["subject"] != s.row["subject"]:
            raise ImportFileError(
                line, _edited("The subjectKey is not of its conversation's subject.")
            )
        k = subject_keys.c
        found = self.conn.execute(
            sa.select(k.key_id, k.wrapped).where(
                sa.or_(
                    k.key_id == row["key_id"],
                    sa.and_(k.tenant == self.tenant, k.subject == row["subject"]),
                )
            )
        ).all()
        if not found:
            self.conn.execute(subject_keys.insert().values(**row))
        elif [(str(f.key_id), bytes(f.wrapped)) for f in found] != [
            (row["key_id"], row["wrapped"])
        ]:
            raise ImportFileError(
                line,
                f"Subject '{row['subject']}' of tenant '{self.tenant}' has another data key in "
                f"the target than in the file (or data key '{row['key_id']}' belongs to another "
                f"subject there): a subject has one key. Import into a database where the "
                f"subject is new.",
            )

    def branch(self, s: _Section, row: dict[str, Any], line: int) -> None:
        bid, parent = str(row["id"]), (row["parent_branch_id"], row["parent_position"])
        self._of(s, row, "branch", line)
        fork_point = (s.row["forked_from_branch_id"], s.row["forked_from_position"])
        if bid in s.branches:
            raise ImportFileError(line, _edited(f"Branch '{bid}' comes a second time."))
        if parent[0] is None:
            if parent[1] is not None:
                raise ImportFileError(
                    line, _edited(f"Branch '{bid}' has a position but no parent.")
                )
        elif parent[0] in s.branches and parent[1] is not None:
            s.needed[(parent[0], parent[1])] = None
        elif parent != fork_point:
            raise ImportFileError(
                line,
                _edited(
                    f"Branch '{bid}' continues branch '{parent[0]}', which is neither an earlier "
                    f"branch of its conversation nor the point it was forked from."
                ),
            )
        if not s.present:
            self._free(branches, bid, "Branch", line)
            self.conn.execute(branches.insert().values(**row, tenant=self.tenant))
        s.branches[bid] = parent

    def run(self, s: _Section, row: dict[str, Any], line: int) -> None:
        self._of(s, row, "run", line)
        self._own(row, "run", line)
        error = row["error"]
        if error is not None and error != ERASED_CONTENT:
            what = f"The error of run '{row['id']}'"
            if is_sealed(error):
                self._under_subject_key(s.row["subject"], split_sealed(error)[0], what, line)
            elif s.row["subject"] is not None:
                raise _in_the_clear(what, line)
        if not s.present:
            self._free(runs, str(row["id"]), "Run", line)
            self.conn.execute(runs.insert().values(**row))

    def event(self, s: _Section, data: dict[str, Any], line: int) -> None:
        row = decode(EVENT, data, line)
        minted = data.get("callerMinted")
        if not isinstance(minted, bool):
            raise ImportFileError(
                line, _edited("The event record's 'callerMinted' is not true or false.")
            )
        self._of(s, row, "event", line)
        bid, position = str(row["branch_id"]), row["position"]
        if bid not in s.branches:
            raise ImportFileError(
                line,
                _edited(f"An event is on branch '{bid}', which has no branch record before it."),
            )
        if bid == s.current:
            last, previous = s.tips[bid]
            if position != last + 1:
                raise ImportFileError(
                    line,
                    _edited(
                        f"The event at position {position} of branch '{bid}' follows the one at "
                        f"position {last}: lines are out of order, or missing."
                    ),
                )
        else:
            previous = self._start(s, bid, position, line)
        computed = _chain.link(previous, _chain.content(**{f: row[f] for f in _chain.FIELDS}))
        if computed != row["hash"]:
            raise ImportFileError(
                line,
                _edited(
                    f"The event at position {position} of branch '{bid}' ({row['kind']}, id "
                    f"'{row['id']}') does not match its hash: its content, or the chain before "
                    f"it, was changed."
                ),
            )
        self._sealed_as_its_conversation(s, row["kind"], row["payload"], line)
        _finite(row["payload"], f"The payload of the {row['kind']} event '{row['id']}'", line)
        s.current, s.tips[bid] = bid, (position, computed)
        if (bid, position) in s.needed:
            s.needed[(bid, position)] = computed
        if (bid, position) == (s.row["head_branch_id"], s.row["head_position"]):
            if computed != s.row["head_hash"]:
                raise ImportFileError(
                    line, _edited(f"The hash of the head event of '{s.id}' is not its head hash.")
                )
            s.head_seen = True
        s.events += 1
        self.read += 1
        if self.progress is not None:
            self.progress(self.read)
        if not s.present:
            self.pending.append((line, {**row, "tenant": self.tenant}, minted))
            if len(self.pending) >= BATCH:
                self.flush()

    def _sealed_as_its_conversation(self, s: _Section, kind: str, text: str, line: int) -> None:
        """Sealed content only in a sealed conversation, under its subject's key (or a key
        that no longer exists anywhere: erased), and no content in the clear there: what
        erasure could not reach. Sealed content elsewhere could have a copied ciphertext
        opened under another subject's (or tenant's) key: so a message that carries the
        reserved field `sealed` anywhere but in the sealed layout (which reads would open
        as well) is refused too, as an append refuses it."""
        if kind not in SEALED_KINDS:
            return
        what = f"A {kind} event of conversation '{s.id}'"
        if is_sealed(text):
            self._under_subject_key(s.row["subject"], split_sealed(text)[0], what, line)
        elif kind == "message.recorded" and _has_sealed_member(text):
            raise ImportFileError(
                line,
                _edited(
                    f"{what} carries the field 'sealed', which chatledger reserves for the "
                    f"messages it stores encrypted."
                ),
            )
        elif s.row["subject"] is not None and kind != "state.changed" and not _no_error(kind, text):
            # A state in the clear was written before states were sealed (ADR 0047):
            # the database it was exported from holds it so too.
            raise _in_the_clear(what, line)

    def _sealed_columns(self, row: dict[str, Any], line: int) -> None:
        """A sealed conversation's metadata: the sealed layout, under its subject's key;
        and a sealed state only there, under that key too (a state in the clear in a
        sealed conversation was written before states were sealed, ADR 0047)."""
        state = row.get("state")
        if isinstance(state, str) and is_sealed(state):
            what = f"The state of conversation '{row['id']}'"
            self._under_subject_key(row["subject"], split_sealed(state)[0], what, line)
        elif isinstance(state, str) and _has_sealed_member(state):
            # Another spelling of the sealed layout, which a read would open too.
            raise ImportFileError(
                line,
                _edited(
                    f"The state of conversation '{row['id']}' carries the field 'sealed', "
                    f"which chatledger reserves for the content it stores encrypted."
                ),
            )
        if row["subject"] is None:
            return
        what = f"The metadata of conversation '{row['id']}'"
        if not is_sealed(row["metadata"]):
            raise _in_the_clear(what, line)
        self._under_subject_key(row["subject"], split_sealed(row["metadata"])[0], what, line)

    def _under_subject_key(self, subject: str | None, key_id: str, what: str, line: int) -> None:
        if subject is not None:
            known = self.keys.get(key_id)
            if known is None:
                k = subject_keys.c
                found = self.conn.execute(
                    sa.select(k.tenant, k.subject).where(k.key_id == key_id)
                ).first()
                known = found is None or (found.tenant, found.subject) == (self.tenant, subject)
                self.keys[key_id] = known
            if known:
                return
        raise ImportFileError(
            line,
            _edited(
                f"{what} is sealed under data key '{key_id}', which is not the key of the "
                f"conversation's subject."
            ),
        )

    def _start(self, s: _Section, bid: str, position: int, line: int) -> bytes:
        """The hash a branch's first event chains to (checking that it comes in order)."""
        if bid in s.tips:
            raise ImportFileError(
                line,
                _edited(
                    f"An event of branch '{bid}' comes after another branch's: a branch's events come together."
                ),
            )
        parent_id, parent_position = s.branches[bid]
        first = (parent_position or 0) + 1
        if position != first:
            raise ImportFileError(
                line,
                _edited(
                    f"The first event of branch '{bid}' is at position {position}, but the branch "
                    f"starts at {first}: lines are out of order, or missing."
                ),
            )
        if parent_id is None or parent_position is None:
            return _chain.GENESIS
        if parent_id in s.branches:
            known = s.needed[(parent_id, parent_position)]
            if known is None:
                raise ImportFileError(
                    line,
                    _edited(
                        f"Branch '{bid}' has events before the event it continues "
                        f"({parent_id}:{parent_position}): lines are out of order."
                    ),
                )
            return known
        self.flush()  # the fork's source may be in the batch
        e, b = events.c, branches.c
        found = self.conn.execute(
            sa.select(e.hash)
            .select_from(events.join(branches, sa.and_(b.id == e.branch_id, b.tenant == e.tenant)))
            .where(
                e.conversation_id == b.conversation_id, b.id == parent_id, b.tenant == self.tenant
            )
            .where(e.position == parent_position)
        ).scalar()
        if found is None:
            raise ImportFileError(
                line,
                f"Conversation '{s.id}' was forked from {parent_id}:{parent_position}, an event "
                f"neither in the file nor in the target. Export the fork again with its source.",
            )
        return bytes(found)

    def close(self) -> None:
        """Check the conversation just read as a whole; rebuild its views."""
        s, self.section = self.section, None
        if s is None:
            return
        if s.events != s.expected:
            raise ImportFileError(
                s.line,
                _edited(
                    f"Conversation '{s.id}' has {s.expected} events by its record, but the file "
                    f"holds {s.events}."
                ),
            )
        empty = [b for b in s.branches if b not in s.tips]
        if empty or not s.head_seen:
            what = f"branch '{empty[0]}' has no events" if empty else "its head event is missing"
            raise ImportFileError(s.line, _edited(f"In conversation '{s.id}', {what}."))
        if s.present:
            if _tips(self.conn, self.tenant, s.id) != {b: tip for b, tip in s.tips.items()}:
                raise self._conflict(s.id, s.line)
            self.present.append(s.id)
            return
        self.flush()
        projector.rebuild_views(self.conn, [s.id])
        self.imported.append(s.id)

    def flush(self) -> None:
        """Insert the events read and not yet written, with their caller-minted ids."""
        if not self.pending:
            return
        minted = {str(row["id"]): line for line, row, caller in self.pending if caller}
        if minted:
            taken = self.conn.execute(
                sa.select(event_ids.c.id).where(event_ids.c.id.in_(list(minted)))
            ).scalar()
            if taken is not None:
                raise ImportFileError(
                    minted[str(taken)],
                    f"Event id '{taken}' is taken in the target by another event. Import into a "
                    f"database that does not hold it.",
                )
        with _clashes(self.pending[0][0], self.pending[-1][0]):
            seqs = (
                self.conn.execute(
                    events.insert().returning(events.c.seq, sort_by_parameter_order=True),
                    [row for _, row, _ in self.pending],
                )
                .scalars()
                .all()
            )
            rows = [
                {
                    "id": row["id"],
                    "conversation_id": row["conversation_id"],
                    "event_seq": seq,
                    "tenant": self.tenant,
                }
                for (_, row, caller), seq in zip(self.pending, seqs, strict=True)
                if caller
            ]
            if rows:
                self.conn.execute(event_ids.insert(), rows)
        self.written += len(self.pending)
        self.pending.clear()

    def _own(self, row: dict[str, Any], what: str, line: int) -> None:
        if row["tenant"] != self.tenant:
            raise ImportFileError(
                line,
                _edited(
                    f"A {what} record is of tenant {row['tenant']!r}, not the file's '{self.tenant}'."
                ),
            )

    def _of(self, s: _Section, row: dict[str, Any], what: str, line: int) -> None:
        if row["conversation_id"] != s.id:
            raise ImportFileError(
                line,
                _edited(
                    f"A {what} record of conversation '{row['conversation_id']}' comes among the "
                    f"records of '{s.id}'."
                ),
            )

    def _have(self, conversation_id: str) -> bool:
        c = conversations.c
        query = sa.select(c.id).where(c.id == conversation_id, c.tenant == self.tenant)
        return self.conn.execute(query).first() is not None

    def _free(self, table: sa.Table, ident: str, what: str, line: int) -> None:
        if self.conn.execute(sa.select(table.c.id).where(table.c.id == ident)).first():
            raise ImportFileError(
                line,
                f"{what} id '{ident}' is taken in the target by another conversation's. Import "
                f"into a database that does not hold it.",
            )

    def _conflict(self, cid: str, line: int) -> ImportFileError:
        return ImportFileError(
            line,
            f"Conversation '{cid}' is already in the target with other content (another head, "
            f"other events), or is taken by another tenant. Import into another database, or "
            f"leave it out of the export.",
        )


@contextlib.contextmanager
def _clashes(first: int, last: int) -> Iterator[None]:
    """A row the target refuses as a duplicate (a unique key the checks before the insert
    do not cover: an idempotency key given twice, say), as the lines that hold it."""
    try:
        yield
    except sa.exc.IntegrityError as error:
        lines = f"line {first}" if first == last else f"lines {first} to {last}"
        raise ImportFileError(
            first,
            _edited(
                f"The target refuses the rows of {lines}: a key among them is taken there, or "
                f"given twice in the file."
            ),
        ) from error


def _in_the_clear(what: str, line: int) -> ImportFileError:
    return ImportFileError(
        line,
        _edited(
            f"{what} is in the clear, but its conversation is sealed: a sealed conversation "
            f"holds only sealed content, which its erasure makes unreadable."
        ),
    )


def _name(phase: int) -> str:
    return next(k for k, v in _PHASES.items() if v == phase)


def _tips(conn: Connection, tenant: str, conversation_id: str) -> dict[str, tuple[int, bytes]]:
    """Each branch's last position and hash, as the target holds them."""
    e = events.c
    last = (
        sa.select(e.tenant, e.branch_id, sa.func.max(e.position).label("tip"))
        .where(e.conversation_id == conversation_id, e.tenant == tenant)
        .group_by(e.tenant, e.branch_id)
        .subquery()
    )
    rows = conn.execute(
        sa.select(e.branch_id, e.position, e.hash)
        .join(
            last,
            sa.and_(
                e.tenant == last.c.tenant,
                e.branch_id == last.c.branch_id,
                e.position == last.c.tip,
            ),
        )
        .where(e.conversation_id == conversation_id, e.tenant == tenant)
    ).all()
    return {str(b): (p, bytes(h)) for b, p, h in rows}


def import_file(
    conn: Connection, tenant: str, source: TextIO, progress: Progress | None
) -> ImportReport:
    """Read an export from `source` into the tenant's log; any problem raises
    `ImportFileError` and the caller's transaction rolls back."""
    job = _Import(conn, tenant, progress)
    digest = hashlib.sha256()
    number, ended, lines = 0, False, iter(source)
    while True:
        try:
            line = next(lines)
        except StopIteration:
            break
        except UnicodeDecodeError:
            raise ImportFileError(
                number + 1, f"The line is not UTF-8 text. {_AGAIN.capitalize()}."
            ) from None
        number += 1
        if ended:
            raise ImportFileError(number, _edited("A line follows the end record."))
        data = _parse(line, number)
        if number == 1:
            _check_header(data, tenant)
        elif data.get("type") == "end":
            job.close()
            _check_end(data, number, digest.hexdigest())
            ended = True
            continue
        else:
            with _clashes(number, number):
                job.take(data, number)
        digest.update(line.encode("utf-8"))
    if number == 0:
        raise ImportFileError(1, "The file is empty: it is no chatledger export.")
    if not ended:
        raise ImportFileError(
            number + 1,
            f"The file ends after line {number} without its end record: it was cut short. "
            f"Copy the whole file again, or {_AGAIN}.",
        )
    job.flush()
    return ImportReport(job.imported, job.present, job.written)


def _parse(line: str, number: int) -> dict[str, Any]:
    try:
        data = json.loads(line)
    except json.JSONDecodeError as error:
        raise ImportFileError(
            number, _edited(f"The line is not valid JSON ({error.msg} at column {error.colno}).")
        ) from None
    except (ValueError, RecursionError):
        raise ImportFileError(number, _edited("The line is not valid JSON.")) from None
    if not isinstance(data, dict):
        raise ImportFileError(number, _edited("The line is not a JSON object."))
    return data


def _check_header(data: dict[str, Any], tenant: str) -> None:
    if data.get("format") != FORMAT:
        raise ImportFileError(
            1,
            f"The file does not begin with a chatledger export header ('format': '{FORMAT}'). "
            f"Import a file that `chatledger export` (or `Ledger.export`) wrote.",
        )
    version = data.get("version")
    if version != VERSION or isinstance(version, bool):
        raise ImportFileError(
            1,
            f"The file is in version {version!r} of the export format; this chatledger reads "
            f"version {VERSION}. Import it with the chatledger that wrote it, or export it again "
            f"with this one.",
        )
    if data.get("tenant") != tenant:
        raise ImportFileError(
            1,
            f"The file holds tenant {data.get('tenant')!r}, but it is being imported by tenant "
            f"'{tenant}'. Import it through store.tenant({data.get('tenant')!r}) (the command "
            f"line reads the tenant from the file).",
        )


def _check_end(data: dict[str, Any], number: int, sha256: str) -> None:
    lines, claimed = data.get("lines"), data.get("sha256")
    if lines != number - 1 or claimed != sha256 or set(data) != {"type", "lines", "sha256"}:
        raise ImportFileError(
            number,
            _edited(
                f"The end record says {lines!r} lines with sha256 {claimed!r}, but the "
                f"{number - 1} lines before it have sha256 '{sha256}'."
            ),
        )


def _no_error(kind: str, text: str) -> bool:
    """Whether a run end's payload in the clear has no error to seal: none, or the
    erased marker (a run that ended after its conversation was erased)."""
    if kind not in ("run.failed", "run.canceled"):
        return False
    try:
        value = json.loads(text)
    except ValueError:
        return False
    return isinstance(value, dict) and value.get("error") in (None, ERASED_CONTENT)


def _finite(text: str, what: str, line: int) -> None:
    """Refuse a JSON text that holds NaN or Infinity as a bare token, which Python's
    parser reads as a number and every other one refuses: chatledger never writes one
    (nor the null that pydantic would write in its place), so the file was edited."""
    if "NaN" not in text and "Infinity" not in text:
        return  # the common case: no such token can be there

    def refuse(token: str) -> Any:
        raise ImportFileError(
            line,
            _edited(
                f"{what} holds {token}, which JSON cannot hold (no parser reads NaN or "
                f"Infinity back)."
            ),
        )

    try:
        json.loads(text, parse_constant=refuse)
    except ImportFileError:
        raise
    except (ValueError, RecursionError):
        return  # not JSON: the checks of its record say so


def _has_sealed_member(text: str) -> bool:
    """Whether the JSON object `text` has a top-level member `sealed`."""
    if '"sealed"' not in text:
        return False
    try:
        value = json.loads(text)
    except ValueError:
        return False  # not JSON: the checks of its record say so
    return isinstance(value, dict) and "sealed" in value
