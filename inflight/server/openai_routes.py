"""The OpenAI routes: completions, chat completions, models, and the tokenizer's /tokenize and
/detokenize. Each handler validates through pydantic, then hands the request to its serving
class; a refusal is a typed exception that the app's handlers turn into OpenAI's error body."""

# No `from __future__ import annotations`: FastAPI reads these signatures again in a Ray Serve
# gateway, from functions pickled by value whose globals hold only the names their code uses.

from collections.abc import AsyncGenerator
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import StreamingResponse

from inflight.engine.client import EngineClient
from inflight.errors import InvalidRequestError
from inflight.server import protocol as p
from inflight.server.auth import Guard
from inflight.server.embeddings import EmbeddingRequest, EmbeddingResponse, EmbeddingServing
from inflight.server.errors import documented_errors, streamed
from inflight.server.request_fields import check_extra_fields
from inflight.server.response_store import ResponseStore, owner_of
from inflight.server.responses import ResponsesRequest, ResponsesServing
from inflight.server.serving import sse_stream
from inflight.server.serving_chat import ChatServing
from inflight.server.serving_completion import CompletionServing


def _streaming(chunks: AsyncGenerator[dict[str, Any], None]) -> StreamingResponse:
    return StreamingResponse(sse_stream(chunks), media_type="text/event-stream")


def request_owner(request: Request) -> str:
    """Who a stored response belongs to: a digest of the request's credentials."""
    return owner_of(request.headers.get("authorization"))


Owner = Annotated[str, Depends(request_owner)]
# the request bodies whose fields beyond their own `request_fields` judges
CHECKED_REQUESTS = (p.CompletionRequest, p.ChatCompletionRequest, ResponsesRequest,
                    EmbeddingRequest)  # fmt: skip


def openai_router(
    engine: EngineClient, model_name: str, guard: Guard, tool_call_parser: str,
    reasoning_parser: str, allow_unknown_fields: bool = False,
) -> APIRouter:  # fmt: skip
    completions = CompletionServing(engine, model_name)
    chat = ChatServing(engine, model_name, tool_call_parser, reasoning_parser)
    responses = ResponsesServing(chat, ResponseStore())
    embeddings = EmbeddingServing(engine, model_name)
    router = APIRouter(dependencies=[Depends(guard)])
    generation_errors = documented_errors(401, 404, 408, 429, 500)

    async def answer(serving: Any, req: Any, *args: Any) -> Any:
        """A generation route's answer: its fields checked, then whole or as a stream."""
        check_extra_fields(req, allow_unknown_fields)
        if req.stream:
            return _streaming(await serving.stream(req, *args))
        return await serving.create(req, *args)

    @router.post("/v1/completions", response_model=p.CompletionResponse,
                 responses={**streamed(p.CompletionResponse), **generation_errors})  # fmt: skip
    async def create_completion(req: p.CompletionRequest) -> Any:
        return await answer(completions, req)

    @router.post("/v1/chat/completions", response_model=p.ChatCompletionResponse,
                 responses={**streamed(p.ChatCompletionResponse), **generation_errors})  # fmt: skip
    async def create_chat_completion(req: p.ChatCompletionRequest) -> Any:
        return await answer(chat, req)

    @router.post("/v1/responses", responses={200: {"content": {"text/event-stream": {}}},
                                             **generation_errors})  # fmt: skip
    async def create_response(req: ResponsesRequest, owner: Owner) -> Any:
        """OpenAI's Responses API (`server/responses.py`); stored by default, for the key that
        created it."""
        return await answer(responses, req, owner)

    @router.get("/v1/responses/{response_id}", responses=documented_errors(401, 404))
    async def retrieve_response(response_id: str, owner: Owner) -> Any:
        return responses.retrieve(owner, response_id)

    @router.delete("/v1/responses/{response_id}", responses=documented_errors(401, 404))
    async def delete_response(response_id: str, owner: Owner) -> Any:
        return responses.delete(owner, response_id)

    @router.post("/v1/embeddings", responses=documented_errors(401, 404, 408, 429, 500))
    async def create_embeddings(req: EmbeddingRequest) -> EmbeddingResponse:
        """An embedding model's vectors (`server/embeddings.py`); a generative model's 400."""
        check_extra_fields(req, allow_unknown_fields)
        return await embeddings.create(req)

    @router.get("/v1/models", responses=documented_errors(401))
    async def list_models() -> p.ModelList:
        return p.ModelList(data=[p.ModelCard(id=model_name, max_model_len=engine.max_model_len)])

    @router.get("/v1/models/{model_id:path}", responses=documented_errors(401, 404))
    async def retrieve_model(model_id: str) -> p.ModelCard:
        completions.check_model(model_id)
        return p.ModelCard(id=model_name, max_model_len=engine.max_model_len)

    @router.post("/tokenize", responses=documented_errors(401, 404))
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

    @router.post("/detokenize", responses=documented_errors(401, 404))
    async def detokenize(req: p.DetokenizeRequest) -> p.DetokenizeResponse:
        completions.check_model(req.model)
        vocab = engine.vocab_size
        if any(not 0 <= t < vocab for t in req.tokens):
            raise InvalidRequestError(f"tokens must be in [0, {vocab})", "tokens",
                                          "outside_vocabulary")  # fmt: skip
        text = await engine.run_tokenizer(engine.tokenizer.decode, req.tokens)
        return p.DetokenizeResponse(prompt=text)

    return router
