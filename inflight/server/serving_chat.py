"""POST /v1/chat/completions: messages rendered through the model's chat template."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from inflight.core.outputs import Logprobs
from inflight.errors import InvalidRequestError
from inflight.server import protocol as p
from inflight.server import tool_calls as tc
from inflight.server.serving import (
    DeltaTracker,
    OpenAIServing,
    final_outputs,
    merge_streams,
    usage_of,
)


def template_message(m: p.ChatMessage) -> dict[str, Any]:
    """A message as chat templates read it: tool calls' arguments as objects, not text."""
    message: dict[str, Any] = {"role": m.role, "content": m.text()}
    if m.tool_calls:
        calls = []
        for call in m.tool_calls:
            try:
                arguments = json.loads(call.function.arguments)
            except ValueError:
                arguments = call.function.arguments
            function = {"name": call.function.name, "arguments": arguments}
            calls.append({"id": call.id, "type": "function", "function": function})
        message["tool_calls"] = calls
    for key in ("tool_call_id", "name"):
        if getattr(m, key) is not None:
            message[key] = getattr(m, key)
    return message


class ChatServing(OpenAIServing):
    def render(self, messages: list[p.ChatMessage], tools: list[p.Tool] | None = None) -> list[int]:
        """Prompt token ids of a conversation; `tools` for templates that render them."""
        tool_dicts = [t.model_dump(exclude_none=True) for t in tools] if tools else None
        text = self.engine.render_chat([template_message(m) for m in messages], tool_dicts)
        return self.tokenizer(text, add_special_tokens=False).input_ids

    async def _start(self, req: p.ChatCompletionRequest):
        self.check_model(req.model)
        if req.top_logprobs is not None and not req.logprobs:
            raise InvalidRequestError("top_logprobs needs logprobs=true", param="top_logprobs")
        mode = tc.resolve_tool_choice(req)
        constraint = tc.tool_constraint(req, mode)
        tools = req.tools if mode != "none" else None
        prompt_ids = await self.engine.run_tokenizer(self.render, req.messages, tools)
        max_tokens = req.max_completion_tokens or req.max_tokens
        if max_tokens is None:  # OpenAI's default: as much as the context leaves
            max_tokens = max(1, self.engine.max_model_len - len(prompt_ids))
        logprobs = (req.top_logprobs or 0) if req.logprobs else None
        params = self.sampling_params(req, max_tokens, logprobs, constraint)
        return await self.start([prompt_ids], params, req), mode

    @staticmethod
    def _function_name(req: p.ChatCompletionRequest) -> str | None:
        choice = req.tool_choice
        return choice.function.name if isinstance(choice, p.NamedToolChoice) else None

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
        streams, mode = await self._start(req)
        (out,) = await final_outputs(streams)
        choices = []
        for c in out.outputs:
            content, calls = c.text, []
            if mode != "none" and (c.finish_reason != "length" or mode == "auto"):
                content, calls = tc.parse_tool_calls(mode, c.text, self._function_name(req))
            choices.append(
                p.ChatChoice(
                    index=c.index,
                    message=p.ChatResponseMessage(content=content, tool_calls=calls or None),
                    logprobs=self._logprobs(c.logprobs),
                    finish_reason=tc.finish_reason(mode, len(calls), c.finish_reason),
                    stop_reason=c.stop_reason,
                )
            )
        return p.ChatCompletionResponse(
            id=p.new_id("chatcmpl"), model=self.model_name, choices=choices, usage=usage_of([out])
        )

    async def stream(self, req: p.ChatCompletionRequest) -> AsyncIterator[dict[str, Any]]:
        """Starts the request now (errors raise before any byte is sent), streams later."""
        streams, mode = await self._start(req)
        return self._chunks(req, streams, mode)

    async def _chunks(
        self, req: p.ChatCompletionRequest, streams, mode: str
    ) -> AsyncIterator[dict[str, Any]]:
        rid, tracker, final = p.new_id("chatcmpl"), DeltaTracker(), None
        calls: dict[int, tc.ToolCallStream] = {}

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
                finish_reason, tool_deltas = c.finish_reason, None
                if mode != "none":
                    stream = calls.setdefault(
                        index, tc.ToolCallStream(mode, self._function_name(req))
                    )
                    text, tool_deltas = stream.feed(c.text, c.finish_reason is not None)
                    finish_reason = tc.finish_reason(mode, stream.num_calls, finish_reason)
                if text or tool_deltas or logprobs or finish_reason:
                    yield chunk(
                        p.ChatStreamChoice(
                            index=index,
                            delta=p.DeltaMessage(
                                content=text or None, tool_calls=tool_deltas or None
                            ),
                            logprobs=self._logprobs(logprobs) if c.logprobs is not None else None,
                            finish_reason=finish_reason,
                        )
                    )
            if out.finished:
                final = out
        if self.wants_usage_chunk(req) and final is not None:
            usage = usage_of([final])
            yield p.ChatCompletionChunk(
                id=rid, model=self.model_name, choices=[], usage=usage
            ).model_dump()
