"""Typed errors that cross the public API.

Every error a caller can cause is one of these, raised before the request reaches the core, so
the engine keeps serving everything else. `param` names the offending field (the HTTP layer maps
it to OpenAI's `error.param`).
"""

from __future__ import annotations


class InflightError(Exception):
    """Base of every error inflight raises on purpose."""


class InvalidRequestError(InflightError, ValueError):
    """A request (prompt or sampling parameters) that can never be served as given."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param


class ConfigError(InflightError, ValueError):
    """An engine knob that is unknown or out of range."""


class ModelLoadError(InflightError):
    """A model folder or file that cannot be loaded; the message names the file and the problem."""


class ModelFailedError(InflightError):
    """The model cannot run a step at all (not one request's fault); the engine stops."""
