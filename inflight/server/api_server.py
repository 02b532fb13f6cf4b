"""The FastAPI app: routes, API-key guard, request limits, OpenAI-shaped errors.

Every error leaves as `{"error": {"message", "type", "param", "code"}}` with the status from
`server.errors.error_status`; validation failures are 400 and name the field. The OpenAPI
document declares each route's error statuses and the event-stream content of streamed
responses, so schema-driven clients and fuzzers know every answer the server can give.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.responses import HTMLResponse, JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.exceptions import HTTPException as StarletteHTTPException

from inflight import __version__
from inflight.engine.async_engine import AsyncLLM
from inflight.errors import EngineDeadError, InflightError, InvalidRequestError
from inflight.metrics.doctor import History
from inflight.server import protocol as p
from inflight.server import reasoning, tool_parsers
from inflight.server.dashboard import Broadcaster, page_html
from inflight.server.errors import error_status
from inflight.server.middleware import (
    AllowedHosts,
    Draining,
    RequestLimits,
    default_allowed_hosts,
    error_response,
)
from inflight.server.serving import sse_stream
from inflight.server.serving_chat import ChatServing
from inflight.server.serving_completion import CompletionServing

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
    # seconds a client may take to send a request's head, or stall its body
    read_timeout: float = 10.0
    # seconds in-flight requests get to finish after SIGTERM before they are aborted
    shutdown_timeout: float = 30.0
    # the format of `auto` tool calls (`tool_parsers.PARSERS`); auto: the chat template's
    tool_call_parser: str = "auto"
    # think: a think block returned as reasoning_content; auto: where the template has one
    reasoning_parser: str = "auto"

    def __post_init__(self) -> None:
        for name, known in (("tool_call_parser", tool_parsers.PARSERS),
                            ("reasoning_parser", reasoning.REASONING_PARSERS)):  # fmt: skip
            value = getattr(self, name)
            if value != "auto" and value not in known:
                raise ValueError(f"unknown {name} {value!r}; known: auto, {', '.join(known)}")


SHOWN_KNOBS = (
    "dtype", "device", "max_model_len", "max_num_seqs", "max_num_batched_tokens",
    "prefill_chunk_size", "kv_block_size", "num_kv_blocks", "batching",
)  # fmt: skip

_ERROR_DESCRIPTIONS = {
    400: "Invalid request: the message names the field (`error.param`)",
    401: "Missing or invalid API key",
    404: "Unknown model",
    408: "Request timed out (the request body stalled, or generation ran past the timeout)",
    413: "Request body too large",
    429: "Waiting queue full; retry after `Retry-After` seconds",
    500: "The engine failed on this request alone (other requests are unaffected)",
    503: "The engine has failed, or the server is shutting down",
}


def _errors(*statuses: int) -> dict[int | str, dict[str, Any]]:
    every = (400, 413, 503, *statuses)
    return {s: {"model": p.ErrorResponse, "description": _ERROR_DESCRIPTIONS[s]} for s in every}


def _streamed(model: type) -> dict[int | str, dict[str, Any]]:
    """200 as JSON, or as server-sent events (`data: {chunk}` lines) when `stream` is true."""
    event = {"type": "object", "required": ["data"], "properties": {
        "data": {"type": "string", "description": "a JSON chunk, or [DONE] at the end"},
        "event": {"type": "string"}}}  # fmt: skip
    sse = {"schema": event, "description": "one server-sent event per chunk"}
    return {200: {"model": model, "content": {"text/event-stream": sse}}}


def _field_path(loc: tuple) -> list[str]:
    """A pydantic error location as field names and indices, without "body" and without the
    names pydantic gives the members of a union ("list[int]", "function-after[...]")."""
    return [str(x) for x in loc if x != "body" and not (isinstance(x, str) and "[" in x)]


def validation_message(errors: list[dict[str, Any]]) -> tuple[str | None, str]:
    """(param, message) for a 400: the first bad field, with every reason pydantic gives for
    it (a union field fails once per allowed form)."""
    if not errors:
        return None, "invalid request"
    paths = [_field_path(e.get("loc", ())) for e in errors]
    same = [(path, e) for path, e in zip(paths, errors, strict=True) if path[:1] == paths[0][:1]]
    common = same[0][0]
    for path, _ in same[1:]:
        n = 0
        while n < min(len(common), len(path)) and common[n] == path[n]:
            n += 1
        common = common[:n]
    reasons = dict.fromkeys(f"{'.'.join(path) or 'body'}: {e.get('msg')}" for path, e in same)
    return ".".join(common) or None, "; or ".join(list(reasons)[:4])


def build_app(engine: AsyncLLM, config: ServerConfig) -> FastAPI:
    path = engine.model_path
    model_name = config.served_model_name or (path.stem if path.is_file() else path.name)
    completions = CompletionServing(engine, model_name)
    chat = ChatServing(engine, model_name, config.tool_call_parser, config.reasoning_parser)

    history = History(seconds=60)
    broadcaster = Broadcaster(engine, history)
    replica_broadcasters: dict[str, Broadcaster] = {}  # behind a gateway: one per engine
    tasks: list[asyncio.Task] = []

    async def sample_metrics() -> None:
        """One snapshot a second for /doctor."""
        while True:
            history.take(time.monotonic(), engine.metrics.render().decode())
            await asyncio.sleep(1)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await engine.start()
        knobs = engine.knobs()
        shown = ", ".join(f"{k}={knobs[k]}" for k in SHOWN_KNOBS)
        logger.info("serving %r on http://%s:%d (%s)", model_name, config.host, config.port, shown)
        tasks.extend([asyncio.create_task(sample_metrics()),
                      asyncio.create_task(broadcaster.run())])  # fmt: skip
        yield
        for task in tasks:
            task.cancel()
        await engine.shutdown()

    app = FastAPI(title="inflight", version=__version__, lifespan=lifespan)
    # the last added runs first: hosts, then draining, then body limits
    app.add_middleware(RequestLimits, max_bytes=config.max_body_bytes,
                       read_timeout=config.read_timeout)  # fmt: skip
    app.add_middleware(Draining, is_draining=lambda: engine.draining)
    hosts = config.allowed_hosts or default_allowed_hosts(config.host, config.api_key)
    app.add_middleware(AllowedHosts, hosts=hosts)

    async def require_api_key(request: Request) -> None:
        if config.api_key is None:
            return
        given = request.headers.get("authorization", "")
        expected = f"Bearer {config.api_key}"
        if not hmac.compare_digest(given.encode(), expected.encode()):
            raise _Unauthorized

    guarded = [Depends(require_api_key)]

    async def require_api_key_or_query(request: Request) -> None:
        """The dashboard's guard: a browser cannot add a header to a page or an EventSource,
        so the key may also come as `?api_key=`."""
        if config.api_key is None:
            return
        given = request.query_params.get("api_key", "")
        if not hmac.compare_digest(given.encode(), config.api_key.encode()):
            await require_api_key(request)

    @app.exception_handler(_Unauthorized)
    async def unauthorized(_: Request, __: Exception) -> JSONResponse:
        return error_response(401, "missing or invalid API key", "AuthenticationError")

    @app.exception_handler(RequestValidationError)
    async def invalid(_: Request, e: RequestValidationError) -> JSONResponse:
        first = e.errors()[0] if e.errors() else {}
        if first.get("type") == "json_invalid":  # loc holds a character offset, not a field
            detail = first.get("ctx", {}).get("error", "")
            position = first.get("loc", ("body", "?"))[-1]
            message = f"the body is not valid JSON (at character {position}: {detail})"
            return error_response(400, message, "BadRequestError")
        param, message = validation_message(e.errors())
        return error_response(400, message, "BadRequestError", param)

    @app.exception_handler(InflightError)
    async def inflight_error(_: Request, e: InflightError) -> JSONResponse:
        status, type_ = error_status(e)
        return error_response(status, str(e), type_, getattr(e, "param", None))

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, e: StarletteHTTPException) -> JSONResponse:
        type_ = "NotFoundError" if e.status_code == 404 else "BadRequestError"
        response = error_response(e.status_code, str(e.detail), type_)
        response.headers.update(e.headers or {})  # 405's Allow
        return response

    @app.exception_handler(Exception)
    async def crash(_: Request, e: Exception) -> JSONResponse:
        logger.exception("unhandled error")
        return error_response(500, f"internal error: {type(e).__name__}", "InternalServerError")

    def streaming(chunks: AsyncIterator[dict[str, Any]]) -> StreamingResponse:
        return StreamingResponse(sse_stream(chunks), media_type="text/event-stream")

    @app.post(
        "/v1/completions",
        dependencies=guarded,
        response_model=p.CompletionResponse,
        responses={**_streamed(p.CompletionResponse), **_errors(401, 404, 408, 429, 500)},
    )
    async def create_completion(req: p.CompletionRequest) -> Any:
        if req.stream:
            return streaming(await completions.stream(req))
        return await completions.create(req)

    @app.post(
        "/v1/chat/completions",
        dependencies=guarded,
        response_model=p.ChatCompletionResponse,
        responses={**_streamed(p.ChatCompletionResponse), **_errors(401, 404, 408, 429, 500)},
    )
    async def create_chat_completion(req: p.ChatCompletionRequest) -> Any:
        if req.stream:
            return streaming(await chat.stream(req))
        return await chat.create(req)

    @app.get("/v1/models", dependencies=guarded, responses=_errors(401))
    async def list_models() -> p.ModelList:
        return p.ModelList(data=[p.ModelCard(id=model_name, max_model_len=engine.max_model_len)])

    @app.post("/tokenize", dependencies=guarded, responses=_errors(401, 404))
    async def tokenize(req: p.TokenizeRequest) -> p.TokenizeResponse:
        completions.check_model(req.model)
        if req.messages is not None:
            tokens, _ = await engine.run_tokenizer(chat.render, req.messages)
        elif req.prompt is not None:
            tokens = await engine.run_tokenizer(engine.tokenize, req.prompt, req.add_special_tokens)
        else:
            raise InvalidRequestError("prompt or messages is required", "prompt")
        return p.TokenizeResponse(
            tokens=tokens, count=len(tokens), max_model_len=engine.max_model_len
        )

    @app.post("/detokenize", dependencies=guarded, responses=_errors(401, 404))
    async def detokenize(req: p.DetokenizeRequest) -> p.DetokenizeResponse:
        completions.check_model(req.model)
        vocab = engine.vocab_size
        if any(not 0 <= t < vocab for t in req.tokens):
            raise InvalidRequestError(f"tokens must be in [0, {vocab})", "tokens")
        text = await engine.run_tokenizer(engine.tokenizer.decode, req.tokens)
        return p.DetokenizeResponse(prompt=text)

    @app.get("/health", response_class=Response,
             responses={200: {"description": "The engine is stepping (empty body)"},
                        **_errors()})  # fmt: skip
    async def health() -> Response:
        if not engine.is_alive:
            error = engine.dead_error or EngineDeadError("the engine is not running")
            return error_response(503, f"engine is dead: {error}", "ServiceUnavailableError")
        replicas = getattr(engine, "replicas_up", None)  # a gateway in front of replicas
        if replicas is None:
            return Response(status_code=200)
        return JSONResponse({"replicas_up": replicas()})

    @app.get("/metrics", response_class=Response, responses={
        200: {"content": {CONTENT_TYPE_LATEST.split(";")[0]: {"schema": {"type": "string"}}},
              "description": "Prometheus text format"}, **_errors()})  # fmt: skip
    async def metrics() -> Response:
        return Response(engine.metrics.render(), media_type=CONTENT_TYPE_LATEST)

    @app.get("/doctor", dependencies=guarded, responses=_errors(401))
    async def doctor() -> dict[str, Any]:
        """Hints from the last 60 s of metrics: each names a flag and carries its evidence."""
        return history.report()

    @app.get(
        "/dashboard", dependencies=[Depends(require_api_key_or_query)], include_in_schema=False
    )
    async def dashboard() -> HTMLResponse:
        return HTMLResponse(page_html())

    @app.get(
        "/dashboard/events",
        dependencies=[Depends(require_api_key_or_query)],
        include_in_schema=False,
    )  # an endless stream: not for schema-driven clients
    async def dashboard_events(replica: str | None = None) -> StreamingResponse:
        """`replica` picks one engine behind a gateway (`--replicas`); the first by default."""
        hello = {"model": model_name, "knobs": {k: str(v) for k, v in engine.knobs().items()},
                 "num_blocks": engine.num_kv_blocks}  # fmt: skip
        chosen = broadcaster
        views = getattr(engine, "replica_views", None)
        if views is not None:
            replicas = sorted(views())
            replica = replica if replica in replicas else (replicas[0] if replicas else "")
            if replica not in replica_broadcasters:
                view = views().get(replica) or engine
                replica_broadcasters[replica] = Broadcaster(view, history)
                tasks.append(asyncio.create_task(replica_broadcasters[replica].run()))
            chosen = replica_broadcasters[replica]
            hello |= {"replicas": replicas, "replica": replica}
        return StreamingResponse(chosen.stream(hello), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache"})  # fmt: skip

    @app.get("/version", responses=_errors())
    async def version() -> dict[str, str]:
        return {"version": __version__}

    def openapi() -> dict[str, Any]:
        """FastAPI's document, less the 422 it adds to every route (this server answers 400)."""
        if app.openapi_schema is None:
            schema = get_openapi(title=app.title, version=app.version, routes=app.routes)
            for path in schema.get("paths", {}).values():
                for operation in path.values():
                    operation.get("responses", {}).pop("422", None)
            for name in ("HTTPValidationError", "ValidationError"):
                schema.get("components", {}).get("schemas", {}).pop(name, None)
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
    return app


class _Unauthorized(Exception):
    pass
