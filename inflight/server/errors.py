"""One mapping from exceptions to OpenAI-style errors: HTTP status and `error.type`."""

from __future__ import annotations

from inflight.errors import (
    EngineDeadError,
    InvalidRequestError,
    QueueFullError,
    RequestFailedError,
    RequestTimeoutError,
)


class ModelNotFoundError(InvalidRequestError):
    """The request names a model this server does not serve."""


def error_status(e: BaseException) -> tuple[int, str]:
    if isinstance(e, ModelNotFoundError):
        return 404, "NotFoundError"
    if isinstance(e, InvalidRequestError):
        return 400, "BadRequestError"
    if isinstance(e, QueueFullError):
        return 429, "RateLimitError"
    if isinstance(e, RequestTimeoutError):
        return 408, "TimeoutError"
    if isinstance(e, RequestFailedError):
        return 500, "InternalServerError"
    if isinstance(e, EngineDeadError):
        return 503, "ServiceUnavailableError"
    return 500, "InternalServerError"
