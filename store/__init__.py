"""chatledger's persistence half: the message contract, history algorithms and the event log."""

from store._errors import (
    ChatledgerError,
    ConflictError,
    HistoryError,
    InvalidInputError,
    LeaseError,
    NotFoundError,
    ResumeConflictError,
    RunStateError,
    SchemaError,
    StorageError,
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

__version__ = "0.1.0"

__all__ = [
    "ChatledgerError",
    "ConflictError",
    "DataPart",
    "HistoryError",
    "HistoryProcessor",
    "HistoryRepair",
    "InvalidInputError",
    "LeaseError",
    "Message",
    "NotFoundError",
    "Part",
    "ResumeConflictError",
    "RunStateError",
    "SanitizeReport",
    "SchemaError",
    "StorageError",
    "TextPart",
    "ThinkingPart",
    "ToolCall",
    "UnknownPart",
    "UnsafePart",
    "UrlPart",
    "Usage",
    "__version__",
    "budget_history",
    "from_pairs",
    "new_id",
    "normalize_history",
    "resolve_conversation_id",
    "sanitize_history",
    "trim_history",
]
