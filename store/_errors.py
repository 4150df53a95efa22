"""The errors chatledger raises.

Every public error is a subclass of `ChatledgerError`, so a caller can catch
the whole family in one place. Each carries, as attributes, what the caller
needs to act, and its message reads as a sentence: what happened, to what,
and what to do.

```
ChatledgerError
├── HistoryError           a history processor cannot produce a usable history
├── InvalidInputError      a value the caller passed is malformed, or an idempotency key is
│                          reused for other content; nothing was written, do not retry
├── NotFoundError          no such conversation, branch or run for this tenant
├── ConflictError          another writer got there first; nothing was written
│   └── ResumeConflictError   the failed run already has its (single) resume branch
├── LeaseError             the run's lease was lost (fencing); nothing was written
├── RunStateError          the run is not in a state that allows the operation
├── SchemaError            the database is not migrated to this version
├── ErasedError            the conversation's subject was erased; nothing was written
├── EncryptionError        sealed content needs a key-encryption key this store lacks
└── StorageError           the database refused or failed an operation
```

Engine errors (`engine.RunError`, provider errors) subclass `ChatledgerError`
too. Driver errors (SQLAlchemy, psycopg, sqlite3) are translated into these in
one place, `store._sql.translate`.
"""

from __future__ import annotations

__all__ = [
    "ChatledgerError",
    "ConflictError",
    "EncryptionError",
    "ErasedError",
    "HistoryError",
    "InvalidInputError",
    "LeaseError",
    "NotFoundError",
    "ResumeConflictError",
    "RunStateError",
    "SchemaError",
    "StorageError",
]


class ChatledgerError(Exception):
    """Base class of every error chatledger raises."""


class HistoryError(ChatledgerError):
    """A history processor cannot produce a history that can open a request."""


class InvalidInputError(ChatledgerError, ValueError):
    """A value passed by the caller is malformed, or an idempotency key is reused for
    other content. Nothing was written, and the same call fails the same way again."""


class NotFoundError(ChatledgerError, LookupError):
    """No such object exists for this tenant.

    An object of another tenant is reported exactly like a missing one.
    """

    def __init__(self, kind: str, ident: str, tenant: str) -> None:
        self.kind = kind
        self.ident = ident
        self.tenant = tenant
        super().__init__(
            f"{kind.capitalize()} '{ident}' does not exist for tenant '{tenant}'. "
            f"Check the id, and that the handle comes from store.tenant('{tenant}') "
            f"for the tenant that created it."
        )


class ConflictError(ChatledgerError):
    """Another writer changed the target first. Nothing was written.

    Attributes:
        conversation_id: the conversation concerned.
        branch_id: the branch concerned.
        expected: the position the operation expected.
        actual: the position found.
    """

    def __init__(
        self,
        message: str,
        *,
        conversation_id: str,
        branch_id: str | None = None,
        expected: int | None = None,
        actual: int | None = None,
    ) -> None:
        self.conversation_id = conversation_id
        self.branch_id = branch_id
        self.expected = expected
        self.actual = actual
        super().__init__(message)


class ResumeConflictError(ConflictError):
    """The failed run already has its resume branch: another worker resumed it."""

    def __init__(self, *, conversation_id: str, run_id: str) -> None:
        self.run_id = run_id
        super().__init__(
            f"Run '{run_id}' already has a resume branch: another worker resumed it "
            f"first. Do not resume it again; read the conversation's runs to follow the resume.",
            conversation_id=conversation_id,
        )


class LeaseError(ChatledgerError):
    """The run's lease is no longer held by this worker and attempt (fencing)."""

    def __init__(self, *, run_id: str, owner: str, attempt: int, reason: str) -> None:
        self.run_id = run_id
        self.owner = owner
        self.attempt = attempt
        self.reason = reason
        super().__init__(
            f"Run '{run_id}' is not leased to worker '{owner}' at attempt {attempt} "
            f"({reason}); nothing was written. Another worker has taken the run over or it "
            f"has ended: stop working on it."
        )


class RunStateError(ChatledgerError):
    """The run is not in a state that allows the requested operation."""

    def __init__(self, *, run_id: str, status: str, wanted: str) -> None:
        self.run_id = run_id
        self.status = status
        super().__init__(
            f"Run '{run_id}' is {status}, so it cannot {wanted}. Only a run that is "
            f"running can record events or end; start a new run (or resume a failed one) instead."
        )


class SchemaError(ChatledgerError):
    """The database is not migrated to the version this package needs."""


class StorageError(ChatledgerError):
    """The database refused or failed an operation."""


class ErasedError(ChatledgerError):
    """The conversation's erasure subject was erased: it takes no more writes.

    Reads still work and return erased markers (docs/erasure.md).
    """

    def __init__(self, *, conversation_id: str, subject: str | None = None) -> None:
        self.conversation_id = conversation_id
        self.subject = subject
        super().__init__(
            f"Conversation '{conversation_id}' was erased (its data key is destroyed); it "
            f"takes no more writes. Start a new conversation for new content."
        )


class EncryptionError(ChatledgerError):
    """Sealed content met a store that cannot seal or open it. Nothing was written.

    Open the store with the key-encryption key the content was sealed under
    (`Store.open(kek=...)` or `CHATLEDGER_KEK`).
    """
