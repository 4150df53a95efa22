"""chatledger's persistence half: the message contract, history algorithms and the event log.

Every name is imported on first use (PEP 562): `from chatledger.store import
Message` loads pydantic and the contract only, `import chatledger.store._errors`
loads nothing else, and the event-log faces (`Store`, `Ledger`, their async
twins, `Audit`, `Page`, `Verification`) load SQLAlchemy, psycopg and Alembic
only when first named.
"""

import importlib as _importlib
import importlib.util as _importlib_util
import typing as _typing

from chatledger import __version__

if _typing.TYPE_CHECKING:
    from chatledger.store._async import AsyncLedger, AsyncRetention, AsyncRuns, AsyncStore
    from chatledger.store._audit import AsyncAudit, Audit
    from chatledger.store._crypto import KeyEncryptionKey, LocalKek
    from chatledger.store._errors import (
        ChatledgerError,
        ConflictError,
        EncryptionError,
        ErasedError,
        HistoryError,
        InvalidInputError,
        LeaseError,
        NotFoundError,
        ResumeConflictError,
        RunStateError,
        SchemaError,
        StorageError,
    )
    from chatledger.store._retention import RetentionReport
    from chatledger.store._sql.erasure import Erasure
    from chatledger.store._sql.pages import Page
    from chatledger.store._sql.retention import RetentionPolicy
    from chatledger.store._sql.transfer import ExportReport, ImportFileError, ImportReport
    from chatledger.store._sql.verify import Recompute, Verification
    from chatledger.store._store import Ledger, Retention, Runs, Store
    from chatledger.store._values import (
        Appended,
        Branch,
        Conversation,
        Entry,
        Event,
        Expected,
        ForkPoint,
        Lineage,
        LineageBranch,
        LineageResume,
        NewConversation,
        NewEvent,
        Position,
        RecordedRequest,
        Run,
        RunCursor,
        TimelineEntry,
        ToolExecution,
    )
    from chatledger.store.history import (
        HistoryProcessor,
        HistoryRepair,
        SanitizeReport,
        UnsafePart,
        budget_history,
        from_pairs,
        normalize_history,
        resolve_conversation_id,
        sanitize_history,
        trim_history,
    )
    from chatledger.store.ids import new_id
    from chatledger.store.messages import (
        DataPart,
        Message,
        Part,
        TextPart,
        ThinkingPart,
        ToolCall,
        UnknownPart,
        UrlPart,
        Usage,
    )

# Each public name, and the module it comes from.
_LAZY = {
    "Appended": "._values",
    "AsyncAudit": "._audit",
    "AsyncLedger": "._async",
    "AsyncRetention": "._async",
    "AsyncRuns": "._async",
    "AsyncStore": "._async",
    "Audit": "._audit",
    "Branch": "._values",
    "ChatledgerError": "._errors",
    "ConflictError": "._errors",
    "Conversation": "._values",
    "DataPart": ".messages",
    "EncryptionError": "._errors",
    "Entry": "._values",
    "ErasedError": "._errors",
    "Erasure": "._sql.erasure",
    "Event": "._values",
    "Expected": "._values",
    "ExportReport": "._sql.transfer",
    "ForkPoint": "._values",
    "HistoryError": "._errors",
    "HistoryProcessor": ".history",
    "HistoryRepair": ".history",
    "ImportFileError": "._sql.transfer",
    "ImportReport": "._sql.transfer",
    "InvalidInputError": "._errors",
    "KeyEncryptionKey": "._crypto",
    "LeaseError": "._errors",
    "Ledger": "._store",
    "Retention": "._store",
    "Runs": "._store",
    "Lineage": "._values",
    "LineageBranch": "._values",
    "LineageResume": "._values",
    "LocalKek": "._crypto",
    "Message": ".messages",
    "NewConversation": "._values",
    "NewEvent": "._values",
    "NotFoundError": "._errors",
    "Page": "._sql.pages",
    "Part": ".messages",
    "Position": "._values",
    "Recompute": "._sql.verify",
    "RecordedRequest": "._values",
    "ResumeConflictError": "._errors",
    "RetentionPolicy": "._sql.retention",
    "RetentionReport": "._retention",
    "Run": "._values",
    "RunCursor": "._values",
    "RunStateError": "._errors",
    "SanitizeReport": ".history",
    "SchemaError": "._errors",
    "StorageError": "._errors",
    "Store": "._store",
    "TextPart": ".messages",
    "ThinkingPart": ".messages",
    "TimelineEntry": "._values",
    "ToolCall": ".messages",
    "ToolExecution": "._values",
    "UnknownPart": ".messages",
    "UnsafePart": ".history",
    "UrlPart": ".messages",
    "Usage": ".messages",
    "Verification": "._sql.verify",
    "budget_history": ".history",
    "from_pairs": ".history",
    "new_id": ".ids",
    "normalize_history": ".history",
    "resolve_conversation_id": ".history",
    "sanitize_history": ".history",
    "trim_history": ".history",
}


def __getattr__(name: str) -> _typing.Any:
    module = _LAZY.get(name)
    if module is not None:
        value = getattr(_importlib.import_module(module, __name__), name)
    elif not name.startswith("_") and _importlib_util.find_spec(f"{__name__}.{name}"):
        value = _importlib.import_module(f"{__name__}.{name}")  # a submodule, as `store.schema`
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value  # once loaded, a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


__all__ = [
    "Appended",
    "AsyncAudit",
    "AsyncLedger",
    "AsyncRetention",
    "AsyncRuns",
    "AsyncStore",
    "Audit",
    "Branch",
    "ChatledgerError",
    "ConflictError",
    "Conversation",
    "DataPart",
    "EncryptionError",
    "Entry",
    "ErasedError",
    "Erasure",
    "Event",
    "Expected",
    "ExportReport",
    "ForkPoint",
    "HistoryError",
    "HistoryProcessor",
    "HistoryRepair",
    "ImportFileError",
    "ImportReport",
    "InvalidInputError",
    "KeyEncryptionKey",
    "LeaseError",
    "Ledger",
    "Lineage",
    "LineageBranch",
    "LineageResume",
    "LocalKek",
    "Message",
    "NewConversation",
    "NewEvent",
    "NotFoundError",
    "Page",
    "Part",
    "Position",
    "Recompute",
    "RecordedRequest",
    "ResumeConflictError",
    "Retention",
    "RetentionPolicy",
    "RetentionReport",
    "Run",
    "RunCursor",
    "RunStateError",
    "Runs",
    "SanitizeReport",
    "SchemaError",
    "StorageError",
    "Store",
    "TextPart",
    "ThinkingPart",
    "TimelineEntry",
    "ToolCall",
    "ToolExecution",
    "UnknownPart",
    "UnsafePart",
    "UrlPart",
    "Usage",
    "Verification",
    "__version__",
    "budget_history",
    "from_pairs",
    "new_id",
    "normalize_history",
    "resolve_conversation_id",
    "sanitize_history",
    "trim_history",
]
