"""Every error the service answers with: a status code and a JSON sentence.

Errors are translated here and nowhere else: the store's errors by kind
(another tenant's id is a 404 exactly like a missing one, because the store
already refuses both alike), a failed run by its stage, a request the
framework refused by what was wrong with it. A body always reads
`{"error": {"type": ..., "message": ...}}`; a failed run adds its stage, ids
and the run to resume.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException
from starlette.responses import JSONResponse, Response

from chatledger.engine import RunError
from chatledger.service._models import ErrorBody, ErrorDetail
from chatledger.store import (
    ChatledgerError,
    ConflictError,
    InvalidInputError,
    NotFoundError,
    SchemaError,
)

__all__ = [
    "error_response",
    "install_error_handlers",
    "run_error_detail",
    "sentence",
    "status_of_stage",
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
    status: int,
    message: str,
    *,
    type: str | None = None,
    headers: Mapping[str, str] | None = None,
    **detail: Any,
) -> JSONResponse:
    """A JSON error response: `{"error": {"type", "message", ...}}`.

    `type` defaults to the status's (`not_found`, `invalid_request`...).
    """
    kind = type or _STATUS_TYPES.get(status, "error")
    body = ErrorBody(error=ErrorDetail(type=kind, message=sentence(message), **detail))
    return JSONResponse(body.model_dump(exclude_none=True), status, headers=dict(headers or {}))


def status_of_stage(stage: str) -> int:
    """The status of a run that stopped at `stage`.

    The guard refusing the question is the request's fault (422); a model
    that failed is an upstream failure (502); a client that went away never
    reads an answer; every other stage is ours (500).
    """
    return {"guard": 422, "model": 502}.get(stage, 500)


def run_error_detail(error: RunError, resumable: bool) -> dict[str, Any]:
    """The fields that say where a run stopped, and which run to resume."""
    return {
        "stage": error.stage,
        "run_id": error.run_id,
        "conversation_id": error.conversation_id or None,
        "resume": error.run_id if resumable else None,
    }


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

    @app.exception_handler(RunError)
    async def _run(_request: Request, error: RunError) -> Response:
        # Reached only for a run refused before it began (the routes answer
        # a failed run themselves, knowing whether it can be resumed).
        return error_response(
            status_of_stage(error.stage), sentence(str(error)), **run_error_detail(error, False)
        )

    @app.exception_handler(ChatledgerError)
    async def _store(_request: Request, error: ChatledgerError) -> Response:
        status = (
            404
            if isinstance(error, NotFoundError)
            else 422
            if isinstance(error, InvalidInputError)
            else 409
            if isinstance(error, ConflictError)
            else 503
            if isinstance(error, SchemaError)
            else 500
        )
        return error_response(status, sentence(str(error)))

    @app.exception_handler(Exception)
    async def _defect(_request: Request, error: Exception) -> Response:
        return error_response(
            500,
            f"The service failed on this request ({type(error).__name__}); the log shows "
            f"what it had recorded. Retry, and report it if it persists.",
        )
