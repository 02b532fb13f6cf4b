"""The FastAPI app: the routers (`openai_routes`, `ops_routes`), middleware, lifespan, and
OpenAI-shaped errors.

Every error leaves as `{"error": {"message", "type", "param", "code"}}` with the status from
`server.errors.error_status`; validation failures are 400 and name the field. The OpenAPI
document declares each route's error statuses and the event-stream content of streamed
responses, so schema-driven clients and fuzzers know every answer the server can give.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

from inflight import __version__
from inflight.engine.client import EngineClient
from inflight.errors import InflightError
from inflight.server import reasoning, tool_parsers
from inflight.server.auth import Unauthorized, api_key_guard, api_key_or_query_guard
from inflight.server.errors import error_status, validation_message
from inflight.server.middleware import (
    AllowedHosts,
    Draining,
    RequestId,
    RequestLimits,
    default_allowed_hosts,
    error_response,
)
from inflight.server.openai_routes import openai_router
from inflight.server.openapi import openapi_document
from inflight.server.ops_routes import Monitoring, ops_router
from inflight.server.tenants import Tenancy, read_api_keys

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = 8000
    api_key: str | None = None
    served_model_name: str | None = None
    max_body_bytes: int = 8 * 2**20
    # Host header names accepted (None: `middleware.default_allowed_hosts`); "*" accepts any
    allowed_hosts: list[str] | None = field(default=None)
    # seconds a client may take to send a request's head and body (`http_edge`)
    read_timeout: float = 10.0
    # open connections; past it a new one gets 503 and is closed at once
    max_connections: int = 1000
    # a request's head (request line and header fields) in bytes, and its header fields: 431
    max_header_bytes: int = 32 * 1024
    max_headers: int = 100
    # seconds in-flight requests get to finish after SIGTERM before they are aborted
    shutdown_timeout: float = 30.0
    # the format of `auto` tool calls (`tool_parsers.PARSERS`); auto: the chat template's
    tool_call_parser: str = "auto"
    # think: a think block returned as reasoning_content; auto: where the template has one
    reasoning_parser: str = "auto"
    # accept request fields OpenAI does not define (default: a 400 naming the field)
    allow_unknown_fields: bool = False
    # origins whose browsers may call the API (CORS); None: no CORS headers
    allowed_origins: list[str] | None = None
    # tenants (`server/tenants.py`): API keys and their tenants, and what clients may say
    api_keys_file: str | None = None
    tenant_header: bool = False
    tenant_from_user: bool = False
    tenancy: Tenancy = field(init=False, repr=False)

    def __post_init__(self) -> None:
        for name, known in (("tool_call_parser", tool_parsers.PARSERS),
                            ("reasoning_parser", reasoning.REASONING_PARSERS)):  # fmt: skip
            value = getattr(self, name)
            if value != "auto" and value not in known:
                raise ValueError(f"unknown {name} {value!r}; known: auto, {', '.join(known)}")
        keys, weights = read_api_keys(self.api_keys_file) if self.api_keys_file else ({}, {})
        tenancy = Tenancy(keys, weights, self.tenant_header, self.tenant_from_user)
        object.__setattr__(self, "tenancy", tenancy)  # (frozen: set once, here)
        if not self.read_timeout > 0:
            raise ValueError(f"read_timeout must be > 0, got {self.read_timeout}")
        for name in ("max_connections", "max_header_bytes", "max_headers"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")


SHOWN_KNOBS = (
    "dtype", "device", "max_model_len", "max_num_seqs", "max_num_batched_tokens",
    "prefill_chunk_size", "kv_block_size", "num_kv_blocks", "batching",
)  # fmt: skip


def build_app(engine: EngineClient, config: ServerConfig) -> FastAPI:
    path = engine.model_path
    model_name = config.served_model_name or (path.stem if path.is_file() else path.name)
    monitoring = Monitoring(engine)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await engine.start()
        knobs = engine.knobs()
        shown = ", ".join(f"{k}={knobs[k]}" for k in SHOWN_KNOBS)
        logger.info("serving %r on http://%s:%d (%s)", model_name, config.host, config.port, shown)
        monitoring.start()
        yield
        monitoring.stop()
        await engine.shutdown()

    app = FastAPI(title="inflight", version=__version__, lifespan=lifespan)
    # the last added runs first: request id, CORS, hosts, then draining, then body limits
    app.add_middleware(RequestLimits, max_bytes=config.max_body_bytes,
                       read_timeout=config.read_timeout)  # fmt: skip
    app.add_middleware(Draining, is_draining=lambda: engine.draining)
    hosts = config.allowed_hosts or default_allowed_hosts(config.host, config.api_key)
    app.add_middleware(AllowedHosts, hosts=hosts)
    if config.allowed_origins:  # browsers' preflights and CORS headers, outside every refusal
        app.add_middleware(CORSMiddleware, allow_origins=config.allowed_origins,
                           allow_methods=["*"], allow_headers=["*"],
                           expose_headers=["x-request-id"])  # fmt: skip
    app.add_middleware(RequestId)
    add_error_handlers(app)

    guard = api_key_guard(config.api_key, config.tenancy)
    app.include_router(openai_router(engine, model_name, guard, config.tool_call_parser,
                                     config.reasoning_parser,
                                     config.allow_unknown_fields))  # fmt: skip
    app.include_router(ops_router(engine, model_name, monitoring, guard,
                                  api_key_or_query_guard(config.api_key)))  # fmt: skip
    app.openapi = lambda: openapi_document(app, config.allow_unknown_fields)  # type: ignore[method-assign]
    return app


def add_error_handlers(app: FastAPI) -> None:
    """Every error as OpenAI's body: a validation failure is a 400 naming the field."""

    @app.exception_handler(Unauthorized)
    async def unauthorized(_: Request, __: Exception) -> JSONResponse:
        return error_response(401, "missing or invalid API key", "invalid_api_key")

    @app.exception_handler(RequestValidationError)
    async def invalid(_: Request, e: RequestValidationError) -> JSONResponse:
        first = e.errors()[0] if e.errors() else {}
        if first.get("type") == "json_invalid":  # loc holds a character offset, not a field
            detail = first.get("ctx", {}).get("error", "")
            position = first.get("loc", ("body", "?"))[-1]
            message = f"the body is not valid JSON (at character {position}: {detail})"
            return error_response(400, message)
        param, message = validation_message(list(e.errors()))
        return error_response(400, message, None, param)

    @app.exception_handler(InflightError)
    async def inflight_error(_: Request, e: InflightError) -> JSONResponse:
        return error_response(error_status(e), str(e), e.code, getattr(e, "param", None),
                              getattr(e, "retry_after", 1))  # fmt: skip

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, e: StarletteHTTPException) -> JSONResponse:
        code = "unknown_url" if e.status_code == 404 else None
        response = error_response(e.status_code, str(e.detail), code)
        response.headers.update(e.headers or {})
        if e.status_code == 405:  # Starlette names the first route's methods; a path may have more
            response.headers["allow"] = ", ".join(allowed_methods(app, request))
        return response

    @app.exception_handler(Exception)
    async def crash(_: Request, e: Exception) -> JSONResponse:
        logger.exception("unhandled error")
        return error_response(500, f"internal error: {type(e).__name__}")


def allowed_methods(app: FastAPI, request: Request) -> list[str]:
    """Every method some route serves at the request's path (a 405's `Allow`), found by asking
    the router, which also holds the routers it included."""
    allowed = []
    for method in ("GET", "POST", "PUT", "PATCH", "DELETE"):
        probe = {**request.scope, "method": method}
        if any(route.matches(probe)[0] is Match.FULL for route in app.router.routes):
            allowed.append(method)
    return allowed
