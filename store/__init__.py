"""chatledger's persistence half: the message contract, history algorithms and the event log.

The contract and the pure algorithms (`store.messages`, `store.history`, the
values and errors) import at once and load no database code. The event-log
faces (`Store`, `Ledger`, their async twins, `Audit`, `Page`,
`Verification`) load SQLAlchemy, psycopg and Alembic, so they are imported on
first use (PEP 562): `from store import Store` works as ever, and
`import store.messages` stays cheap.
"""

import importlib as _importlib
import importlib.util as _importlib_util
import typing as _typing

from store._errors import (
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
from store._values import (
    Appended,
    Branch,
    Conversation,
    Entry,
    Event,
    ForkPoint,
    Lineage,
    LineageBranch,
    LineageResume,
    NewEvent,
    Position,
    RecordedRequest,
    Run,
    RunCursor,
    TimelineEntry,
    ToolExecution,
)
from store.history import (
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
from store.ids import new_id
from store.messages import (
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

if _typing.TYPE_CHECKING:
    from store._async import AsyncLedger, AsyncStore
    from store._audit import AsyncAudit, Audit
    from store._crypto import KeyEncryptionKey, LocalKek
    from store._retention import RetentionReport
    from store._sql.erasure import Erasure
    from store._sql.pages import Page
    from store._sql.retention import RetentionPolicy
    from store._sql.transfer import ExportReport, ImportFileError, ImportReport
    from store._sql.verify import Recompute, Verification
    from store._store import Ledger, Store

# The names that need the database layer, and the module each comes from.
_LAZY = {
    "AsyncAudit": "store._audit",
    "AsyncLedger": "store._async",
    "AsyncStore": "store._async",
    "Audit": "store._audit",
    "Erasure": "store._sql.erasure",
    "ExportReport": "store._sql.transfer",
    "ImportFileError": "store._sql.transfer",
    "ImportReport": "store._sql.transfer",
    "KeyEncryptionKey": "store._crypto",
    "LocalKek": "store._crypto",
    "Ledger": "store._store",
    "Page": "store._sql.pages",
    "Recompute": "store._sql.verify",
    "RetentionPolicy": "store._sql.retention",
    "RetentionReport": "store._retention",
    "Store": "store._store",
    "Verification": "store._sql.verify",
}


def __getattr__(name: str) -> _typing.Any:
    module = _LAZY.get(name)
    if module is not None:
        value = getattr(_importlib.import_module(module), name)
    elif not name.startswith("_") and _importlib_util.find_spec(f"{__name__}.{name}"):
        value = _importlib.import_module(f"{__name__}.{name}")  # a submodule, as `store.schema`
    else:
        raise AttributeError(f"module 'store' has no attribute {name!r}")
    globals()[name] = value  # once loaded, a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


__version__ = "0.1.0"

__all__ = [
    "Appended",
    "AsyncAudit",
    "AsyncLedger",
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
    "NewEvent",
    "NotFoundError",
    "Page",
    "Part",
    "Position",
    "Recompute",
    "RecordedRequest",
    "ResumeConflictError",
    "RetentionPolicy",
    "RetentionReport",
    "Run",
    "RunCursor",
    "RunStateError",
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
