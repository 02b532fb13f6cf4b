"""The FastAPI app: routes, API-key guard, body-size limit, OpenAI-shaped errors.

Every error leaves as `{"error": {"message", "type", "param", "code"}}` with the status from
`server.errors.error_status`; validation failures are 400 and name the field.
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from inflight import __version__
from inflight.engine.async_engine import AsyncLLM, EngineDeadError
from inflight.errors import InflightError, InvalidRequestError
from inflight.server import protocol as p
from inflight.server.errors import error_status
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


SHOWN_KNOBS = (
    "dtype", "device", "max_model_len", "max_num_seqs", "max_num_batched_tokens",
    "prefill_chunk_size", "kv_block_size", "num_kv_blocks", "batching",
)  # fmt: skip


def error_response(status: int, message: str, type_: str, param: str | None = None) -> JSONResponse:
    headers = {"Retry-After": "1"} if status == 429 else None
    return JSONResponse(p.error_body(message, type_, status, param), status, headers=headers)


class BodySizeLimit:
    """Refuses request bodies over `max_bytes` (413), declared or streamed."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = dict(scope.get("headers", [])).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            return await self._refuse(scope, receive, send)
        seen = 0

        async def counting_receive() -> Message:
            nonlocal seen
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > self.max_bytes:
                raise _BodyTooLarge
            return message

        try:
            await self.app(scope, counting_receive, send)
        except _BodyTooLarge:
            await self._refuse(scope, receive, send)

    async def _refuse(self, scope: Scope, receive: Receive, send: Send) -> None:
        response = error_response(
            413, f"request body exceeds {self.max_bytes} bytes", "BadRequestError"
        )
        await response(scope, receive, send)


class _BodyTooLarge(Exception):
    pass


def build_app(engine: AsyncLLM, config: ServerConfig) -> FastAPI:
    path = engine.core.loaded.path
    model_name = config.served_model_name or (path.stem if path.is_file() else path.name)
    completions = CompletionServing(engine, model_name)
    chat = ChatServing(engine, model_name)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await engine.start()
        knobs = engine.knobs()
        shown = ", ".join(f"{k}={knobs[k]}" for k in SHOWN_KNOBS)
        logger.info("serving %r on http://%s:%d (%s)", model_name, config.host, config.port, shown)
        yield
        await engine.shutdown()

    app = FastAPI(title="inflight", version=__version__, lifespan=lifespan)
    app.add_middleware(BodySizeLimit, max_bytes=config.max_body_bytes)

    async def require_api_key(request: Request) -> None:
        if config.api_key is None:
            return
        given = request.headers.get("authorization", "")
        expected = f"Bearer {config.api_key}"
        if not hmac.compare_digest(given.encode(), expected.encode()):
            raise _Unauthorized

    guarded = [Depends(require_api_key)]

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
        loc = [str(x) for x in first.get("loc", ()) if x != "body"]
        param = ".".join(loc) or None
        message = f"{param or 'body'}: {first.get('msg', 'invalid request')}"
        return error_response(400, message, "BadRequestError", param)

    @app.exception_handler(InflightError)
    async def inflight_error(_: Request, e: InflightError) -> JSONResponse:
        status, type_ = error_status(e)
        return error_response(status, str(e), type_, getattr(e, "param", None))

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, e: StarletteHTTPException) -> JSONResponse:
        type_ = "NotFoundError" if e.status_code == 404 else "BadRequestError"
        return error_response(e.status_code, str(e.detail), type_)

    @app.exception_handler(Exception)
    async def crash(_: Request, e: Exception) -> JSONResponse:
        logger.exception("unhandled error")
        return error_response(500, f"internal error: {type(e).__name__}", "InternalServerError")

    def streaming(chunks: AsyncIterator[dict[str, Any]]) -> StreamingResponse:
        return StreamingResponse(sse_stream(chunks), media_type="text/event-stream")

    @app.post("/v1/completions", dependencies=guarded)
    async def create_completion(req: p.CompletionRequest) -> Any:
        if req.stream:
            return streaming(await completions.stream(req))
        return await completions.create(req)

    @app.post("/v1/chat/completions", dependencies=guarded)
    async def create_chat_completion(req: p.ChatCompletionRequest) -> Any:
        if req.stream:
            return streaming(await chat.stream(req))
        return await chat.create(req)

    @app.get("/v1/models", dependencies=guarded)
    async def list_models() -> p.ModelList:
        return p.ModelList(
            data=[p.ModelCard(id=model_name, max_model_len=engine.core.max_model_len)]
        )

    @app.post("/tokenize", dependencies=guarded)
    async def tokenize(req: p.TokenizeRequest) -> dict[str, Any]:
        completions.check_model(req.model)
        if req.messages is not None:
            tokens = await engine.run_tokenizer(chat.render, req.messages)
        elif req.prompt is not None:
            tokens = await engine.run_tokenizer(engine.tokenize, req.prompt, req.add_special_tokens)
        else:
            raise InvalidRequestError("prompt or messages is required", "prompt")
        return {"tokens": tokens, "count": len(tokens), "max_model_len": engine.core.max_model_len}

    @app.post("/detokenize", dependencies=guarded)
    async def detokenize(req: p.DetokenizeRequest) -> dict[str, Any]:
        completions.check_model(req.model)
        vocab = engine.core.arch.vocab_size
        if any(not 0 <= t < vocab for t in req.tokens):
            raise InvalidRequestError(f"tokens must be in [0, {vocab})", "tokens")
        return {"prompt": await engine.run_tokenizer(engine.tokenizer.decode, req.tokens)}

    @app.get("/health")
    async def health() -> Response:
        if not engine.is_alive:
            error = engine.dead_error or EngineDeadError("the engine is not running")
            return error_response(503, f"engine is dead: {error}", "ServiceUnavailableError")
        return Response(status_code=200)

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(engine.metrics.render(), media_type=CONTENT_TYPE_LATEST)

    @app.get("/version")
    async def version() -> dict[str, str]:
        return {"version": __version__}

    return app


class _Unauthorized(Exception):
    pass
