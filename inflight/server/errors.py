"""One mapping from exceptions to OpenAI's errors (HTTP status, `error.type`; `error.code` is the
exception's own), and the error statuses each route declares in the OpenAPI document."""

from __future__ import annotations

from typing import Any

from inflight.errors import (
    EngineDeadError,
    InvalidRequestError,
    QueueFullError,
    RequestTimeoutError,
)
from inflight.server import protocol as p

_ERROR_DESCRIPTIONS = {
    400: "Invalid request: the message names the field (`error.param`)",
    401: "Missing or invalid API key",
    404: "Unknown model, or a stored response that does not exist for this key",
    408: "Request timed out (the request body stalled, or generation ran past the timeout)",
    413: "Request body too large",
    429: "Waiting queue full, or the request would miss its TTFT target (`slo_unmet`); retry "
    "after `Retry-After` seconds",
    500: "The engine failed on this request alone (other requests are unaffected)",
    503: "The engine has failed, or the server is shutting down",
}


class NotFoundError(InvalidRequestError):
    """The request names something this server does not have (a 404)."""


class ModelNotFoundError(NotFoundError):
    """The request names a model this server does not serve."""

    def __init__(self, message: str, param: str | None = "model") -> None:
        super().__init__(message, param, code="model_not_found")


class ResponseNotFoundError(NotFoundError):
    """A stored response that does not exist, was evicted, or belongs to another API key."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message, param, code="response_not_found")


# OpenAI's `error.type` by status: the caller's mistakes, rate limits, the server's failures
ERROR_TYPES = {429: "requests", 500: "server_error", 503: "server_error"}


def error_type(status: int) -> str:
    return ERROR_TYPES.get(status, "invalid_request_error" if status < 500 else "server_error")


def error_status(e: BaseException) -> int:
    if isinstance(e, NotFoundError):
        return 404
    if isinstance(e, InvalidRequestError):
        return 400
    if isinstance(e, QueueFullError):
        return 429
    if isinstance(e, RequestTimeoutError):
        return 408
    if isinstance(e, EngineDeadError):
        return 503
    return 500


def documented_errors(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """A route's error answers for the OpenAPI document: 400, 413 and 503 are every route's."""
    every = (400, 413, 503, *statuses)
    return {s: {"model": p.ErrorResponse, "description": _ERROR_DESCRIPTIONS[s]} for s in every}


def streamed(model: type) -> dict[int | str, dict[str, Any]]:
    """200 as JSON, or as server-sent events (`data: {chunk}` lines) when `stream` is true."""
    event = {"type": "object", "required": ["data"], "properties": {
        "data": {"type": "string", "description": "a JSON chunk, or [DONE] at the end"},
        "event": {"type": "string"}}}  # fmt: skip
    sse = {"schema": event, "description": "one server-sent event per chunk"}
    return {200: {"model": model, "content": {"text/event-stream": sse}}}


def field_path(loc: tuple) -> list[str]:
    """A pydantic error location as field names and indices, without "body", without the
    names pydantic gives the members of a union ("list[int]", "function-after[...]"), and
    without a bad dict key (it is the client's text: "[key]" follows it)."""
    path: list[str] = []
    for x in loc:
        if x == "[key]":
            path.pop()
        elif x != "body" and not (isinstance(x, str) and "[" in x):
            path.append(str(x))
    return path


def validation_message(errors: list[dict[str, Any]]) -> tuple[str | None, str]:
    """(param, message) for a 400: the first bad field, with every reason pydantic gives for
    it (a union field fails once per allowed form)."""
    if not errors:
        return None, "invalid request"
    paths = [field_path(e.get("loc", ())) for e in errors]
    same = [(path, e) for path, e in zip(paths, errors, strict=True) if path[:1] == paths[0][:1]]
    common = same[0][0]
    for path, _ in same[1:]:
        n = 0
        while n < min(len(common), len(path)) and common[n] == path[n]:
            n += 1
        common = common[:n]
    reasons = dict.fromkeys(f"{'.'.join(path) or 'body'}: {e.get('msg')}" for path, e in same)
    return ".".join(common) or None, "; or ".join(list(reasons)[:4])
