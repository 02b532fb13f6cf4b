"""Shared pieces of the OpenAI handlers: model check, SamplingParams, stream merging, SSE.

A request with several prompts, or `n` > 1, runs as one engine request per prompt (each with
`n` samples); choice index = prompt index * n + sample index, as OpenAI numbers them.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from typing import Any

from inflight.engine.client import EngineClient
from inflight.errors import InflightError, InvalidRequestError
from inflight.outputs import RequestOutput
from inflight.request import SLOTarget
from inflight.sampling_params import SamplingParams, StructuredOutputs
from inflight.server import protocol as p
from inflight.server.errors import ModelNotFoundError, error_status, error_type
from inflight.server.tenants import request_tenant
from inflight.tokenizer import token_bytes

DONE = "data: [DONE]\n\n"


class OpenAIServing:
    def __init__(self, engine: EngineClient, served_model_name: str) -> None:
        self.engine = engine
        self.model_name = served_model_name

    @property
    def tokenizer(self):
        return self.engine.tokenizer

    def check_model(self, model: str | None) -> None:
        if model is not None and model != self.model_name:
            raise ModelNotFoundError(
                f"the model {model!r} does not exist; this server serves {self.model_name!r}",
                param="model",
            )

    def sampling_params(
        self,
        req: p.SamplingFields,
        max_tokens: int,
        logprobs: int | None,
        constraint: StructuredOutputs | None = None,
    ) -> SamplingParams:
        """`constraint`: one a handler derived (a tool choice); with one from the request's own
        `response_format` or `structured_outputs` as well, the request is refused."""
        requested = requested_constraint(req)
        if constraint is not None and requested is not None:
            raise InvalidRequestError(
                f"{requested.param} cannot be combined with a required or named tool_choice",
                requested.param, "invalid_combination",
            )  # fmt: skip
        # the keys are decimal token ids (`protocol.LogitBias`)
        bias = {int(k): v for k, v in req.logit_bias.items()} if req.logit_bias else None
        # fields the request leaves unset take the model's recommended values, then OpenAI's
        return self.engine.sampling_defaults.sampling_params(
            n=req.n,
            temperature=req.temperature,
            top_p=req.top_p,
            top_k=req.top_k,
            min_p=req.min_p,
            presence_penalty=req.presence_penalty,
            frequency_penalty=req.frequency_penalty,
            repetition_penalty=req.repetition_penalty,
            logit_bias=bias,
            seed=req.seed,
            max_tokens=max_tokens,
            min_tokens=req.min_tokens,
            stop=[req.stop] if isinstance(req.stop, str) else req.stop or [],
            stop_token_ids=req.stop_token_ids or [],
            ignore_eos=req.ignore_eos,
            include_stop_str_in_output=req.include_stop_str_in_output,
            logprobs=logprobs,
            prompt_logprobs=req.prompt_logprobs,
            skip_special_tokens=req.skip_special_tokens,
            structured_outputs=constraint or requested,
        )

    async def start(
        self,
        prompts: list[str | list[int]],
        params: SamplingParams,
        req: p.SamplingFields,
        add_special_tokens: bool = True,
    ) -> list[AsyncGenerator[RequestOutput, None]]:
        """Validates every prompt and checks capacity for all of them before queueing any, so a
        refusal leaves nothing half-submitted and is an HTTP status, not a broken stream.
        Tokenizing runs on the engine's tokenizer thread, never on the event loop."""

        tenant = request_tenant(req.user)
        slo = SLOTarget(req.slo_ttft, req.slo_tpot)

        def process_all():
            return [
                self.engine.process(x, params, priority=req.priority, cache_salt=req.cache_salt,
                                    add_special_tokens=add_special_tokens, tenant=tenant,
                                    slo=slo)
                for x in prompts
            ]  # fmt: skip

        # Refused before tokenizing too: under overload, 429s must cost next to nothing.
        self.engine.check_capacity(len(prompts) * params.n)
        self.engine.check_queue_slo(slo)
        processed = await self.engine.run_tokenizer(process_all)
        self.engine.check_capacity(sum(len(children) for _, children in processed))
        self.engine.check_slo(processed)
        return [self.engine.submit(x) for x in processed]

    def token_text(self, token_id: int) -> str:
        return self.tokenizer.decode([token_id])

    def prompt_logprobs(self, req: p.SamplingFields, out: RequestOutput) -> p.PromptLogprobs | None:
        """vLLM's `prompt_logprobs` of an answer, where the request asked for them."""
        if req.prompt_logprobs is None or out.prompt_logprobs is None:
            return None
        ids = out.prompt_token_ids
        scored: p.PromptLogprobs = [None]
        for token_id, entry in zip(ids[1:], out.prompt_logprobs[1:], strict=True):
            assert entry is not None  # only the first prompt token goes unscored
            alternatives = [(t, v, rank) for rank, (t, v) in enumerate(entry.top, 1)]
            scored.append({
                str(t): p.PromptLogprob(logprob=v, rank=rank, decoded_token=self.token_text(t))
                for t, v, rank in [*alternatives[: req.prompt_logprobs],
                                   (token_id, entry.logprob, entry.rank)]
            })  # fmt: skip
        return scored

    @functools.cached_property
    def token_bytes(self) -> Callable[[int], bytes]:
        """Each token's own bytes (a gateway's tokenizer exists only once it started)."""
        return token_bytes(self.tokenizer)

    def wants_usage_chunk(self, req: p.SamplingFields) -> bool:
        return bool(req.stream_options and req.stream_options.include_usage)


def prompt_list(given: str | list[int] | list[str] | list[list[int]]) -> list[str | list[int]]:
    """A request's prompts (completions' `prompt`, embeddings' `input`) as a list: one text,
    one list of token ids, or several of either."""
    if isinstance(given, str):
        return [given]
    if not given:
        raise InvalidRequestError("prompt must not be empty", param="prompt")
    if all(isinstance(x, int) for x in given):
        return [given]  # type: ignore[list-item]
    return list(given)  # type: ignore[arg-type]


def requested_constraint(req: p.SamplingFields) -> StructuredOutputs | None:
    """The constraint of `response_format` (OpenAI) or `structured_outputs` (vLLM), if any."""
    fmt, extra = req.response_format, req.structured_outputs
    if fmt is not None and fmt.type != "text" and extra is not None:
        raise InvalidRequestError(
            "response_format and structured_outputs cannot both constrain the output",
            "structured_outputs", "invalid_combination",
        )  # fmt: skip
    if extra is not None:
        return StructuredOutputs(
            json=extra.json_, json_object=bool(extra.json_object), regex=extra.regex,
            choice=extra.choice, grammar=extra.grammar,
        )  # fmt: skip
    if fmt is None or fmt.type == "text":
        return None
    if fmt.type == "json_object":
        return StructuredOutputs(json_object=True, param="response_format")
    if fmt.json_schema is None:
        raise InvalidRequestError(
            "response_format of type json_schema needs json_schema", "response_format.json_schema"
        )
    return StructuredOutputs(json=fmt.json_schema.schema_, param="response_format.json_schema")


async def merge_streams(
    streams: list[AsyncGenerator[RequestOutput, None]],
) -> AsyncGenerator[tuple[int, RequestOutput], None]:
    """Interleaves request streams, tagging outputs with their stream's index. Closing this
    iterator closes (and so aborts) every stream still open."""
    queue: asyncio.Queue[tuple[int, RequestOutput | BaseException | None]] = asyncio.Queue()

    async def pump(i: int, stream: AsyncGenerator[RequestOutput, None]) -> None:
        try:
            async with contextlib.aclosing(stream) as s:
                async for out in s:
                    await queue.put((i, out))
            await queue.put((i, None))
        except Exception as e:
            await queue.put((i, e))

    tasks = [asyncio.create_task(pump(i, s)) for i, s in enumerate(streams)]
    try:
        remaining = len(tasks)
        while remaining:
            i, item = await queue.get()
            if item is None:
                remaining -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield i, item
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def final_outputs(streams: list[AsyncGenerator[RequestOutput, None]]) -> list[RequestOutput]:
    finals: dict[int, RequestOutput] = {}
    async with contextlib.aclosing(merge_streams(streams)) as merged:
        async for i, out in merged:
            finals[i] = out
    return [finals[i] for i in range(len(streams))]


def sse(payload: dict[str, Any]) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"


async def sse_stream(chunks: AsyncGenerator[dict[str, Any], None]) -> AsyncIterator[str]:
    """SSE framing: every chunk, an error chunk if the stream breaks, then [DONE]."""
    try:
        async with contextlib.aclosing(chunks) as it:
            async for chunk in it:
                yield sse(chunk)
    except Exception as e:
        code = e.code if isinstance(e, InflightError) else None
        yield sse(
            p.error_body(str(e), error_type(error_status(e)), code, getattr(e, "param", None))
        )
    yield DONE


def usage_of(outputs: list[RequestOutput], reasoning_tokens: int | None = None) -> p.UsageInfo:
    """Tokens in and out; `reasoning_tokens` (chat's) where counted."""
    prompt = sum(len(o.prompt_token_ids) for o in outputs)
    completion = sum(len(c.token_ids) for o in outputs for c in o.outputs)
    cached = p.PromptTokensDetails(cached_tokens=sum(o.num_cached_tokens for o in outputs))
    details = None if reasoning_tokens is None else p.CompletionTokensDetails(
        reasoning_tokens=reasoning_tokens)  # fmt: skip
    return p.UsageInfo(prompt_tokens=prompt, completion_tokens=completion,
                       total_tokens=prompt + completion, prompt_tokens_details=cached,
                       completion_tokens_details=details)  # fmt: skip


class DeltaTracker:
    """Turns cumulative snapshots into per-choice deltas (text, logprobs, finish) for streams."""

    def __init__(self) -> None:
        self._sent: dict[int, tuple[int, int, bool]] = {}  # index -> (chars, logprobs, finished)

    def deltas(self, out: RequestOutput, first_index: int):
        """Yields (choice index, completion, new text, new logprobs, is first) per change."""
        for c in out.outputs:
            index = first_index + c.index
            is_first = index not in self._sent
            chars, n_lp, done = self._sent.get(index, (0, 0, False))
            if done:
                continue
            text = c.text[chars:]
            logprobs = (c.logprobs or [])[n_lp:]
            if not (text or logprobs or c.finish_reason or is_first):
                continue
            self._sent[index] = (len(c.text), len(c.logprobs or []), c.finish_reason is not None)
            yield index, c, text, logprobs, is_first
