"""Typed errors that cross the public API.

Every error a caller can cause is one of these, raised before the request reaches the core, so
the engine keeps serving everything else. `param` names the offending field and `code` says
what went wrong in a word a program can branch on (the HTTP layer maps them to OpenAI's
`error.param` and `error.code`).
"""

from __future__ import annotations


class InflightError(Exception):
    """Base of every error inflight raises on purpose."""

    code: str | None = None  # OpenAI's `error.code` for it, where one fits


class InvalidRequestError(InflightError, ValueError):
    """A request (prompt or sampling parameters) that can never be served as given."""

    def __init__(self, message: str, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code


class ConfigError(InflightError, ValueError):
    """An engine knob that is unknown or out of range."""


class ModelLoadError(InflightError):
    """A model folder or file that cannot be loaded; the message names the file and the problem."""


class ModelFailedError(InflightError):
    """The model cannot run a step at all (not one request's fault); the engine stops."""


# What a running engine answers a request it cannot serve (the HTTP layer maps each to a status)
class EngineDeadError(InflightError):
    """The engine loop has failed; no request can be served."""

    code = "engine_unavailable"


class QueueFullError(InflightError):
    """The waiting queue is at `max_queued_requests`; try again later."""

    code = "rate_limit_exceeded"


class SLOUnmetError(QueueFullError):
    """SLO admission predicts the request would miss its TTFT target: refused at once, with
    the seconds after which the queue should have room (`Retry-After`)."""

    code = "slo_unmet"

    def __init__(self, message: str, retry_after: int) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class RequestTimeoutError(InflightError):
    """A request ran past the server's request timeout and was aborted."""

    code = "request_timeout"


class ShuttingDownError(EngineDeadError):
    """The server is shutting down: new requests are refused, and requests still running when
    the shutdown timeout ends are aborted with this."""

    code = "shutting_down"


class RequestFailedError(InflightError):
    """The engine failed on this request alone and ended it; the others carry on."""

    code = "request_failed"
