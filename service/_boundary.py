"""The service's boundary, before any route runs: API keys and body size.

Both are plain ASGI middleware so they answer before the framework reads or
parses a body: a 10 MB question is refused while it streams in, and a request
without a valid key learns nothing else about itself (not even that its
JSON is malformed). A request with more than one `Authorization` header is
refused before its keys are looked at (400): no choice between them is made.
The tenant a key opens is put in the request's scope; no route takes a
tenant from anywhere else. Under `/ui/`, where a browser follows links and
cannot send a bearer token, the key may also come as the password of HTTP
Basic (any user name), and a 401 there asks the browser for it (ADR 0041).
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from starlette.exceptions import HTTPException

from chatledger.service._errors import error_response
from chatledger.service._keys import ApiKeys

__all__ = ["TENANT_SCOPE_KEY", "Boundary"]

TENANT_SCOPE_KEY = "chatledger.tenant"
"""Where the boundary leaves the tenant of the request's key, in the ASGI scope."""

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

_OPEN = ("/openapi.json", "/docs", "/healthz")
"""The paths open without a key; so is everything under `/docs/` (Swagger UI's assets)."""


class _TooLarge(HTTPException):
    """A body that grew past the limit while it was read.

    An `HTTPException`, so that the framework, which turns other errors of a
    body read into a 400, passes it on to the 413 handler.
    """

    def __init__(self, limit: int) -> None:
        super().__init__(413, _too_large_text(limit))


def _too_large_text(limit: int) -> str:
    return (
        f"The body is over {limit:,} bytes, the service's limit; nothing was read or "
        f"written. Send a shorter question or history."
    )


class Boundary:
    """Refuse ambiguous credentials (400), requests without a known key (401) and
    bodies over `max_body_bytes` (413)."""

    def __init__(self, app: ASGIApp, *, keys: ApiKeys, max_body_bytes: int) -> None:
        self.app = app
        self.keys = keys
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        if scope["type"] != "http" or path in _OPEN or path.startswith("/docs/"):
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        authorizations = [
            v.decode("latin-1") for k, v in scope["headers"] if k.lower() == b"authorization"
        ]
        if len(authorizations) > 1:
            # Ambiguous credentials are refused, never resolved: a gateway in
            # front that checked one of them must not have the service serve
            # the other.
            await error_response(
                400,
                f"The request carries {len(authorizations)} Authorization headers, and none "
                f"of them was used: send exactly one, 'Authorization: Bearer <key>'.",
            )(scope, receive, send)
            return
        page = path == "/ui" or path.startswith("/ui/")
        tenant = self._tenant(authorizations[0] if authorizations else "", basic=page)
        if tenant is None:
            await error_response(
                401,
                "The request has no valid API key: send 'Authorization: Bearer <key>' with a "
                "key the service's key file lists"
                + (" (or, in a browser, the key as the password it asks for)." if page else "."),
                headers={"WWW-Authenticate": 'Basic realm="chatledger"' if page else "Bearer"},
            )(scope, receive, send)
            return
        declared = headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_body_bytes:
            await self._too_large(scope, receive, send)
            return
        scope[TENANT_SCOPE_KEY] = tenant
        received = 0
        started = False

        async def counted() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_body_bytes:
                    raise _TooLarge(self.max_body_bytes)
            return message

        async def tracked(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counted, tracked)
        except _TooLarge:
            if started:
                raise
            await self._too_large(scope, receive, send)

    def _tenant(self, authorization: str, *, basic: bool) -> str | None:
        scheme, _, key = authorization.partition(" ")
        if basic and scheme.lower() == "basic":
            try:
                user, _, password = (
                    base64.b64decode(key.strip(), validate=True).decode().partition(":")
                )
                key = password or user  # `curl -u KEY` sends the key as the user name
            except (binascii.Error, UnicodeDecodeError):
                return None
        elif scheme.lower() != "bearer":
            return None
        return self.keys.tenant(key.strip()) if key.strip() else None

    async def _too_large(self, scope: Scope, receive: Receive, send: Send) -> None:
        await error_response(413, _too_large_text(self.max_body_bytes))(scope, receive, send)
