"""POST /v1/embeddings: an embedding model's vector of each input (a string, strings, token ids
or lists of token ids), pooled as the model pools and L2-normalized; `encoding_format` float
or base64 (little-endian float32, as OpenAI's); `dimensions` where the model was trained for
shorter vectors (Matryoshka: the leading dimensions, normalized again). A generative model
refuses with a 400."""

from __future__ import annotations

import base64
import math
import struct
from typing import Annotated, Literal

from pydantic import BaseModel, Field

from inflight.engine.llm import EMBEDDING_PARAMS
from inflight.errors import InvalidRequestError, RequestFailedError
from inflight.server import protocol as p
from inflight.server.serving import OpenAIServing, final_outputs, prompt_list
from inflight.server.tenants import request_tenant

MAX_INPUTS = 2048  # OpenAI's bound on the inputs of one request


class EmbeddingRequest(BaseModel):
    model_config = p.STRICT
    model: p.Text | None = None
    input: (
        p.PromptText
        | Annotated[list[p.PromptText], Field(min_length=1, max_length=MAX_INPUTS)]
        | p.PromptIds
        | Annotated[list[p.PromptIds], Field(min_length=1, max_length=MAX_INPUTS)]
    )
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: p.OptionalInt = Field(default=None, ge=1, le=p.MAX_INT64)
    user: p.Text | None = None  # a tenant's name under --tenant-from-user; otherwise unread


class Embedding(BaseModel):
    object: Literal["embedding"] = "embedding"
    index: int
    embedding: list[float] | str


class EmbeddingUsage(BaseModel):
    prompt_tokens: int
    total_tokens: int


class EmbeddingResponse(BaseModel):
    object: Literal["list"] = "list"
    data: list[Embedding]
    model: str
    usage: EmbeddingUsage


def shortened(vector: list[float], dimensions: int) -> list[float]:
    """A Matryoshka vector's first `dimensions` values, normalized again."""
    head = vector[:dimensions]
    norm = math.sqrt(sum(v * v for v in head)) or 1.0
    return [v / norm for v in head]


def encoded(vector: list[float], encoding_format: str) -> list[float] | str:
    if encoding_format == "float":
        return vector
    return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode("ascii")


class EmbeddingServing(OpenAIServing):
    def _check_dimensions(self, dimensions: int | None) -> None:
        size = self.engine.embedding_size
        if dimensions is None or size is None:
            return
        if not self.engine.shorter_embeddings and dimensions != size:
            raise InvalidRequestError(
                f"this model gives vectors of {size} dimensions only (it was not trained for "
                "shorter ones)", "dimensions",
            )  # fmt: skip
        if dimensions > size:
            raise InvalidRequestError(f"dimensions must be at most the model's {size}",
                                      "dimensions")  # fmt: skip

    async def create(self, req: EmbeddingRequest) -> EmbeddingResponse:
        """Every input validated (and the model checked to embed) before any is queued."""
        self.check_model(req.model)
        inputs = prompt_list(req.input)

        tenant = request_tenant(req.user)

        def process_all():
            return [self.engine.process(x, EMBEDDING_PARAMS, embed=True, tenant=tenant)
                    for x in inputs]  # fmt: skip

        try:
            processed = await self.engine.run_tokenizer(process_all)
        except InvalidRequestError as e:  # the engine's name for what this route calls input
            raise InvalidRequestError(e.message, "input" if e.param == "prompt" else e.param,
                                      e.code) from e  # fmt: skip
        self._check_dimensions(req.dimensions)
        self.engine.check_capacity(len(processed))
        outputs = await final_outputs([self.engine.submit(x) for x in processed])
        data, num_tokens = [], 0
        for index, out in enumerate(outputs):
            vector = out.embedding
            if vector is None:  # the engine failed on this input alone
                raise RequestFailedError(out.outputs[0].stop_reason or "no embedding came back")
            if req.dimensions is not None:
                vector = shortened(vector, req.dimensions)
            data.append(Embedding(index=index, embedding=encoded(vector, req.encoding_format)))
            num_tokens += len(out.prompt_token_ids)
        usage = EmbeddingUsage(prompt_tokens=num_tokens, total_tokens=num_tokens)
        return EmbeddingResponse(data=data, model=self.model_name, usage=usage)
