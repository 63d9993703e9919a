"""Typed agentmem errors -> JSON error bodies with the right HTTP status (400, 401, 403, 404, 409, 413; 500 for
anything unexpected, counted and logged like the rest).

Bodies have the OpenAI shape, so OpenAI clients raise their own typed errors:
``{"error": {"message": "...", "type": "invalid_input", "param": "user_id", "code": 400}}``.

Example:
    >>> from agentmem.errors import NotFoundError
    >>> status_for(NotFoundError("no memory entry with id 'x'"))
    404
"""

from __future__ import annotations

import logging
import re
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from agentmem import errors as am_errors

__all__ = ["error_body", "install_error_handlers", "status_for"]

log = logging.getLogger("agentmem.server")

# most specific first; names looked up so errors added later by other parts map without an edit here
_STATUS_BY_NAME: tuple[tuple[str, int], ...] = (
    ("PayloadTooLargeError", 413), ("TooLargeError", 413), ("QuotaExceededError", 413),
    ("ConflictError", 409), ("VersionConflictError", 409), ("StaleEntryError", 409),
    ("FingerprintMismatchError", 409),
    ("NotFoundError", 404),
    ("SecretDetectedError", 400), ("InvalidInputError", 400),
)
_TYPES = {400: "invalid_input", 401: "unauthorized", 403: "forbidden", 404: "not_found", 409: "conflict",
          413: "too_large", 500: "internal_error"}
_FIELD = re.compile(r"^([a-z_][a-z_ ]*?) (?:is|must|has|needs)\b")


def status_for(exc: BaseException) -> int:
    """The HTTP status of an agentmem error (500 for anything unexpected)."""
    for name, status in _STATUS_BY_NAME:
        cls = getattr(am_errors, name, None)
        if cls is not None and isinstance(exc, cls):
            return status
    return 500


def error_body(status: int, message: str, *, param: str | None = None, kind: str | None = None) -> dict[str, Any]:
    """An OpenAI-shaped error body."""
    return {"error": {"message": message, "type": kind or _TYPES.get(status, "error"), "param": param,
                      "code": status}}


def _param(message: str) -> str | None:
    """The field a message names first ("user_id is required" -> user_id), if it names one."""
    m = _FIELD.match(message)
    return m.group(1).replace(" ", "_") if m else None


def install_error_handlers(app: FastAPI, on_error: Any = None) -> None:
    """Map agentmem errors, request validation and HTTP errors to JSON; ``on_error(status, type)`` counts them."""

    def respond(status: int, message: str, param: str | None = None, kind: str | None = None) -> JSONResponse:
        if on_error is not None:
            on_error(status, kind or _TYPES.get(status, "error"))
        return JSONResponse(error_body(status, message, param=param, kind=kind), status_code=status)

    @app.exception_handler(am_errors.AgentMemError)
    async def _agentmem(_: Request, exc: am_errors.AgentMemError) -> JSONResponse:
        status = status_for(exc)
        if status == 500:
            log.error("unexpected %s: %s", type(exc).__name__, exc)
        return respond(status, str(exc), _param(str(exc)), kind=type(exc).__name__)

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {}
        loc = [str(x) for x in first.get("loc", ()) if x not in ("body", "query", "path", "header")]
        field = ".".join(loc) or None
        return respond(400, f"{field or 'request'}: {first.get('msg', 'invalid')}", field)

    @app.exception_handler(Exception)
    async def _unexpected(_: Request, exc: Exception) -> JSONResponse:
        # a bug, not the client's fault: counted like every other error response, logged with its traceback here
        # (the message may quote request content, so the client gets none of it)
        log.error("unhandled %s", type(exc).__name__, exc_info=exc)
        return respond(500, "internal server error (logged on the server)")

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        response = respond(exc.status_code, str(exc.detail))
        for key, value in (exc.headers or {}).items():
            response.headers[key] = value
        return response
