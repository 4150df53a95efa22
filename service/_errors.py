"""Every error the service answers with: a status code and a JSON sentence.

Errors are translated here and nowhere else: the store's errors by kind
(another tenant's id is a 404 exactly like a missing one, because the store
already refuses both alike) and in the API's words where the store's advice
is about its Python calls (`http_message`), a failed run by its stage, a
request the framework refused by what was wrong with it. A body always reads
`{"error": {"type": ..., "message": ...}}`; a failed run adds its stage, ids
and the run to resume.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from pydantic.alias_generators import to_camel
from starlette.exceptions import HTTPException
from starlette.responses import JSONResponse, Response

from chatledger.engine import RunError
from chatledger.service._models import ErrorBody, ErrorDetail
from chatledger.store import (
    ChatledgerError,
    ConflictError,
    EncryptionError,
    InvalidInputError,
    NotFoundError,
    SchemaError,
)

__all__ = [
    "error_response",
    "http_message",
    "install_error_handlers",
    "refusal_detail",
    "run_failure",
    "sentence",
    "store_status",
]

_STATUS_TYPES = {
    400: "bad_request",
    401: "unauthorized",
    404: "not_found",
    405: "method_not_allowed",
    409: "conflict",
    413: "too_large",
    415: "unsupported_media_type",
    422: "invalid_request",
    500: "internal_error",
    502: "model_error",
    503: "unavailable",
}


def error_response(
    status: int, error: str | ErrorDetail, *, headers: Mapping[str, str] | None = None
) -> JSONResponse:
    """A JSON error response: `{"error": {"type", "message", ...}}`.

    A plain message gets the status's `type` (`not_found`, `invalid_request`...).
    """
    if isinstance(error, str):
        error = ErrorDetail(type=_STATUS_TYPES.get(status, "error"), message=sentence(error))
    body = ErrorBody(error=error)
    return JSONResponse(
        body.model_dump(mode="json", exclude_none=True), status, headers=dict(headers or {})
    )


def http_message(error: ChatledgerError) -> str:
    """What the store's `error` says to an HTTP client, in the API's own terms.

    The store's sentences name its Python calls (`store.tenant(...)`, `at=`);
    a client of the API can act only on ids, keys and fields, so the errors
    whose advice is about the Python face are worded again here.
    """
    if isinstance(error, NotFoundError):
        return (
            f"There is no {error.kind} '{error.ident}' for your API key's tenant. Check the "
            f"id; a {error.kind} made with another tenant's key is not visible with this one."
        )
    if isinstance(error, EncryptionError):
        # The store's sentence is for whoever runs the service (a key, a package).
        return (
            "The service cannot open or seal this content: it is not running with the "
            "key-encryption key the content was sealed under. Nothing was written; ask its "
            "operator to start it with that key (CHATLEDGER_KEK)."
        )
    return sentence(str(error))


def store_status(error: ChatledgerError) -> int:
    """The status of a request the store refused, by the kind of its error.

    Another tenant's id is a 404 exactly like a missing one, because the
    store refuses both alike; a database without chatledger's tables, and a
    store without the key its sealed content needs, are a 503, as they are no
    fault of the request.
    """
    for kind, status in (
        (NotFoundError, 404),
        (InvalidInputError, 422),
        (ConflictError, 409),
        (SchemaError, 503),
        (EncryptionError, 503),
    ):
        if isinstance(error, kind):
            return status
    return 500


def refusal_detail(error: ChatledgerError) -> dict[str, Any]:
    """The error fields of a request refused before its run began (a stream's `error`)."""
    detail = ErrorDetail(type=_STATUS_TYPES[store_status(error)], message=http_message(error))
    return detail.model_dump(mode="json", exclude_none=True)


def run_failure(error: RunError, resumable: bool) -> tuple[int, ErrorDetail]:
    """The status and error fields of a run that stopped: where, and which run to resume.

    The guard refusing the question is the request's fault (422); a model
    that failed is an upstream failure (502); a run that completed after
    another writer moved the head is a conflict (409: ask again); a
    database that lost chatledger's tables is unavailable (503), wherever
    the run was, and so is a store without the key the conversation's sealed
    content needs; every other stage is ours (500). `resume` only when
    `resumable` (the log holds the run, and a resume can move the head).
    """
    cause = error.__cause__
    if isinstance(cause, SchemaError | EncryptionError):
        status = 503
    else:
        status = {"guard": 422, "model": 502, "conflict": 409}.get(error.stage, 500)
    return status, ErrorDetail(
        type={409: "conflict", 503: "unavailable"}.get(status, "run_failed"),
        message=http_message(cause) if isinstance(cause, EncryptionError) else sentence(str(error)),
        stage=error.stage,
        run_id=error.run_id,
        conversation_id=error.conversation_id or None,
        resume=error.run_id if resumable and status != 409 else None,
    )


def sentence(text: str) -> str:
    """`text` on one line, ending as a sentence ends."""
    text = " ".join(text.split())
    return text if text.endswith((".", "?", "!")) else text + "."


def _validation_message(error: RequestValidationError) -> tuple[int, str]:
    """The status and one sentence for the first thing wrong with the request."""
    first: dict[str, Any] = dict(error.errors()[0]) if error.errors() else {}
    kind = str(first.get("type", ""))
    loc = [str(p) for p in first.get("loc", ())]
    if kind == "json_invalid":
        reason = (first.get("ctx") or {}).get("error", "it does not parse")
        return 400, f"The body is not valid JSON: {reason}. Send one JSON object."
    if loc == ["body"]:
        if kind == "missing":
            return 422, "The body is missing: send a JSON object (Content-Type: application/json)."
        return 422, sentence(f"The body must be a JSON object: {first.get('msg', '')}")
    where = ".".join(loc[1:] if loc and loc[0] in ("body", "query", "path") else loc)
    message = str(first.get("msg", "is invalid")).removeprefix("Value error, ")
    if kind == "missing":
        return 422, f"The field {where!r} is required."
    if kind == "extra_forbidden":
        if to_camel(where) != where and where.count(".") == 0:
            return 422, (
                f"The field {to_camel(where)!r} is sent twice, also as {where!r}: send it "
                f"once, spelled either way."
            )
        return 422, f"The field {where!r} is not a field of this request; remove it."
    return 422, sentence(f"{where}: {message}")


def install_error_handlers(app: FastAPI) -> None:
    """Answer every error with a status code and a JSON sentence."""

    @app.exception_handler(RequestValidationError)
    async def _invalid(_request: Request, error: RequestValidationError) -> Response:
        status, message = _validation_message(error)
        return error_response(status, message)

    @app.exception_handler(HTTPException)
    async def _http(_request: Request, error: HTTPException) -> Response:
        if error.status_code == 404:
            message = "There is no such endpoint; /docs lists them."
        elif error.status_code == 405:
            message = "The endpoint does not take this method; /docs lists what it takes."
        else:
            message = sentence(str(error.detail))
        return error_response(error.status_code, message, headers=error.headers)

    @app.exception_handler(ChatledgerError)
    async def _store(_request: Request, error: ChatledgerError) -> Response:
        return error_response(store_status(error), http_message(error))

    @app.exception_handler(Exception)
    async def _defect(_request: Request, error: Exception) -> Response:
        return error_response(
            500,
            f"The service failed on this request ({type(error).__name__}); the log shows "
            f"what it had recorded. Retry, and report it if it persists.",
        )
