"""POST /v1/chat/completions: messages rendered through the model's chat template."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from inflight.core.outputs import Logprobs
from inflight.errors import InvalidRequestError
from inflight.server import protocol as p
from inflight.server.serving import (
    DeltaTracker,
    OpenAIServing,
    final_outputs,
    merge_streams,
    usage_of,
)


class ChatServing(OpenAIServing):
    def render(self, messages: list[p.ChatMessage]) -> list[int]:
        text = self.engine.llm.render_chat(
            [{"role": m.role, "content": m.text()} for m in messages]
        )
        return self.tokenizer(text, add_special_tokens=False).input_ids

    async def _start(self, req: p.ChatCompletionRequest):
        self.check_model(req.model)
        if req.top_logprobs is not None and not req.logprobs:
            raise InvalidRequestError("top_logprobs needs logprobs=true", param="top_logprobs")
        prompt_ids = await self.engine.run_tokenizer(self.render, req.messages)
        max_tokens = req.max_completion_tokens or req.max_tokens
        if max_tokens is None:  # OpenAI's default: as much as the context leaves
            max_tokens = max(1, self.engine.core.max_model_len - len(prompt_ids))
        logprobs = (req.top_logprobs or 0) if req.logprobs else None
        params = self.sampling_params(req, max_tokens, logprobs)
        return await self.start([prompt_ids], params, req)

    def _logprobs(self, entries: list[Logprobs] | None) -> p.ChatLogprobs | None:
        if entries is None:
            return None

        def item(token_id: int, logprob: float) -> dict[str, Any]:
            text = self.token_text(token_id)
            return {"token": text, "logprob": logprob, "bytes": list(text.encode())}

        content = [
            p.ChatTokenLogprob(
                **item(e.token_id, e.logprob),
                top_logprobs=[p.TopLogprob(**item(t, v)) for t, v in e.top],
            )
            for e in entries
        ]
        return p.ChatLogprobs(content=content)

    async def create(self, req: p.ChatCompletionRequest) -> p.ChatCompletionResponse:
        (out,) = await final_outputs(await self._start(req))
        choices = [
            p.ChatChoice(
                index=c.index,
                message=p.ChatResponseMessage(content=c.text),
                logprobs=self._logprobs(c.logprobs),
                finish_reason=c.finish_reason,
                stop_reason=c.stop_reason,
            )
            for c in out.outputs
        ]
        return p.ChatCompletionResponse(
            id=p.new_id("chatcmpl"), model=self.model_name, choices=choices, usage=usage_of([out])
        )

    async def stream(self, req: p.ChatCompletionRequest) -> AsyncIterator[dict[str, Any]]:
        """Starts the request now (errors raise before any byte is sent), streams later."""
        return self._chunks(req, await self._start(req))

    async def _chunks(self, req: p.ChatCompletionRequest, streams) -> AsyncIterator[dict[str, Any]]:
        rid, tracker, final = p.new_id("chatcmpl"), DeltaTracker(), None

        def chunk(choice: p.ChatStreamChoice) -> dict[str, Any]:
            return p.ChatCompletionChunk(
                id=rid, model=self.model_name, choices=[choice]
            ).model_dump(exclude_none=True)

        async for _, out in merge_streams(streams):
            for index, c, text, logprobs, first in tracker.deltas(out, 0):
                if first:  # OpenAI opens every choice with the role
                    yield chunk(
                        p.ChatStreamChoice(
                            index=index, delta=p.DeltaMessage(role="assistant", content="")
                        )
                    )
                if text or logprobs or c.finish_reason:
                    yield chunk(
                        p.ChatStreamChoice(
                            index=index,
                            delta=p.DeltaMessage(content=text) if text else p.DeltaMessage(),
                            logprobs=self._logprobs(logprobs) if c.logprobs is not None else None,
                            finish_reason=c.finish_reason,
                        )
                    )
            if out.finished:
                final = out
        if self.wants_usage_chunk(req) and final is not None:
            usage = usage_of([final])
            yield p.ChatCompletionChunk(
                id=rid, model=self.model_name, choices=[], usage=usage
            ).model_dump()
