"""chatledger's ask service: `/v1/ask` and `/v1/ask/stream` over the engine.

Install with `pip install 'chatledger[serve]'`; run with `chatledger serve
--agent module:attribute --keys keys.json`, or mount `create_app(...)` in
any ASGI server.
"""

from chatledger.service._app import SourceFilter, create_app, drop_restricted_sources
from chatledger.service._keys import KEYS_ENV, ApiKeys, key_digest, new_api_key
from chatledger.service._models import AskRequest, AskResponse

__all__ = [  # noqa: RUF022 (sorted as the test sorts: plain str order)
    "ApiKeys",
    "AskRequest",
    "AskResponse",
    "KEYS_ENV",
    "SourceFilter",
    "create_app",
    "drop_restricted_sources",
    "key_digest",
    "new_api_key",
]
