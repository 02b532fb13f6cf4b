"""POST /v1/chat/completions: messages rendered through the model's chat template."""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
from collections.abc import AsyncGenerator
from typing import Any

from inflight.core.outputs import Logprobs
from inflight.errors import InvalidRequestError
from inflight.model.loader import arch_config
from inflight.outputs import RequestOutput
from inflight.server import protocol as p
from inflight.server import reasoning, tool_parsers
from inflight.server import tool_calls as tc
from inflight.server.serving import (
    DeltaTracker,
    OpenAIServing,
    final_outputs,
    merge_streams,
    usage_of,
)

logger = logging.getLogger(__name__)


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
    def __init__(
        self,
        engine,
        served_model_name: str,
        tool_call_parser: str = "auto",
        reasoning_parser: str = "auto",
    ) -> None:
        """`tool_call_parser`: the format the model writes `auto` tool calls in
        (`tool_parsers`); `reasoning_parser`: `think` to return a think block as
        `reasoning_content`; `auto`, either: what the model's chat template says, looked up at
        the first request (a gateway knows its tokenizer once a replica reports)."""
        super().__init__(engine, served_model_name)
        self._tool_call_parser, self._reasoning_parser = tool_call_parser, reasoning_parser

    @functools.cached_property
    def tool_parser(self) -> str:
        name = self._tool_call_parser
        if name == "auto":
            architecture = arch_config(self.engine.model_path).architecture
            name = tool_parsers.choose(self._template, architecture)
            logger.info("tool calls (tool_choice auto) parsed as %s", name)
        return name

    @functools.cached_property
    def thinks(self) -> bool:
        """Whether a think block is returned as `reasoning_content`."""
        name = self._reasoning_parser
        if name == "auto":
            name = reasoning.choose(self._template)
            if name != "none":
                logger.info("think blocks returned as reasoning_content")
        return name == "think"

    @property
    def _template(self) -> str:
        return tool_parsers.template_text(self.engine.tokenizer.chat_template)

    def render(
        self,
        messages: list[p.ChatMessage],
        tools: list[p.Tool] | None = None,
        template_kwargs: dict[str, Any] | None = None,
    ) -> tuple[list[int], bool]:
        """(prompt token ids of a conversation, whether the prompt opens a think block);
        `tools` for templates that render them, `template_kwargs` their own variables."""
        tool_dicts = [t.model_dump(exclude_none=True) for t in tools] if tools else None
        text = self.engine.render_chat(
            [template_message(m) for m in messages], tool_dicts, template_kwargs
        )
        ids = self.tokenizer(text, add_special_tokens=False).input_ids
        return ids, reasoning.prompt_opens_thinking(text)

    async def _start(self, req: p.ChatCompletionRequest):
        self.check_model(req.model)
        if req.top_logprobs is not None and not req.logprobs:
            raise InvalidRequestError("top_logprobs needs logprobs=true", param="top_logprobs")
        mode = tc.resolve_tool_choice(req)
        constraint = tc.tool_constraint(req, mode)
        tools = req.tools if mode != "none" else None
        prompt_ids, opened = await self.engine.run_tokenizer(
            self.render, req.messages, tools, req.chat_template_kwargs
        )
        max_tokens = req.max_completion_tokens or req.max_tokens
        if max_tokens is None:  # OpenAI's default: as much as the context leaves
            max_tokens = max(1, self.engine.max_model_len - len(prompt_ids))
        logprobs = (req.top_logprobs or 0) if req.logprobs else None
        params = self.sampling_params(req, max_tokens, logprobs, constraint)
        if mode == "auto" and self.tool_parser in tool_parsers.KEEPS_SPECIAL_TOKENS:
            params = dataclasses.replace(params, skip_special_tokens=False)  # its markers
        return await self.start([prompt_ids], params, req), mode, opened

    @staticmethod
    def _function_name(req: p.ChatCompletionRequest) -> str | None:
        choice = req.tool_choice
        return choice.function.name if isinstance(choice, p.NamedToolChoice) else None

    def _logprobs(self, entries: list[Logprobs] | None) -> p.ChatLogprobs | None:
        if entries is None:
            return None

        def item(token_id: int, logprob: float) -> dict[str, Any]:
            text = self.token_text(token_id)
            return {"token": text, "logprob": logprob, "bytes": list(self.token_bytes(token_id))}

        content = [
            p.ChatTokenLogprob(
                **item(e.token_id, e.logprob),
                top_logprobs=[p.TopLogprob(**item(t, v)) for t, v in e.top],
            )
            for e in entries
        ]
        return p.ChatLogprobs(content=content)

    def _usage(self, out: RequestOutput, opened: bool) -> p.UsageInfo:
        """Usage with the tokens the choices spent in think blocks (none where the model's
        blocks are not parsed)."""
        thought = sum(reasoning.reasoning_tokens(self.tokenizer, c.token_ids, opened)
                      for c in out.outputs) if self.thinks else 0  # fmt: skip
        return usage_of([out], thought)

    async def create(self, req: p.ChatCompletionRequest) -> p.ChatCompletionResponse:
        streams, mode, opened = await self._start(req)
        (out,) = await final_outputs(streams)
        choices = []
        for c in out.outputs:
            thought, content = None, c.text
            if self.thinks:
                thought, content = reasoning.split_reasoning(c.text, opened, final=True)
            shown: str | None = content
            calls: list[p.ToolCall] = []
            if mode != "none":  # a call cut by max_tokens is still a call (finish "length")
                shown, calls = tc.parse_tool_calls(
                    mode, content, self._function_name(req), self.tool_parser
                )
            message = p.ChatResponseMessage(
                content=shown, reasoning_content=thought or None, tool_calls=calls or None
            )
            choices.append(
                p.ChatChoice(
                    index=c.index,
                    message=message,
                    logprobs=self._logprobs(c.logprobs),
                    finish_reason=tc.finish_reason(mode, len(calls), c.finish_reason),
                    stop_reason=c.stop_reason,
                )
            )
        return p.ChatCompletionResponse(
            id=p.new_id("chatcmpl"), model=self.model_name, choices=choices,
            usage=self._usage(out, opened), prompt_logprobs=self.prompt_logprobs(req, out),
        )  # fmt: skip

    async def stream(self, req: p.ChatCompletionRequest) -> AsyncGenerator[dict[str, Any], None]:
        """Starts the request now (errors raise before any byte is sent), streams later."""
        streams, mode, opened = await self._start(req)
        return self._chunks(req, streams, mode, opened)

    async def _chunks(
        self, req: p.ChatCompletionRequest, streams, mode: str, opened: bool
    ) -> AsyncGenerator[dict[str, Any], None]:
        rid, tracker, final = p.new_id("chatcmpl"), DeltaTracker(), None
        calls: dict[int, tc.ToolCallStream] = {}
        thoughts: dict[int, reasoning.ReasoningStream] = {}

        def chunk(
            choice: p.ChatStreamChoice, prompt_logprobs: p.PromptLogprobs | None = None
        ) -> dict[str, Any]:
            return p.ChatCompletionChunk(
                id=rid, model=self.model_name, choices=[choice], prompt_logprobs=prompt_logprobs
            ).model_dump()

        async for _, out in merge_streams(streams):
            for index, c, text, logprobs, first in tracker.deltas(out, 0):
                if first:  # OpenAI opens every choice with the role
                    yield chunk(
                        p.ChatStreamChoice(
                            index=index, delta=p.DeltaMessage(role="assistant", content="")
                        ),
                        self.prompt_logprobs(req, out) if index == 0 else None,
                    )
                finish_reason, tool_deltas, thought = c.finish_reason, None, ""
                done, content = c.finish_reason is not None, c.text
                if self.thinks:
                    split = thoughts.setdefault(index, reasoning.ReasoningStream(opened))
                    thought, text, content = split.feed(c.text, done)
                if mode != "none":
                    stream = calls.setdefault(
                        index, tc.ToolCallStream(mode, self._function_name(req), self.tool_parser)
                    )
                    text, tool_deltas = stream.feed(content, done)
                    finish_reason = tc.finish_reason(mode, stream.num_calls, finish_reason)
                if text or thought or tool_deltas or logprobs or finish_reason:
                    yield chunk(
                        p.ChatStreamChoice(
                            index=index,
                            delta=p.DeltaMessage(
                                content=text or None,
                                reasoning_content=thought or None,
                                tool_calls=tool_deltas or None,
                            ),
                            logprobs=self._logprobs(logprobs) if c.logprobs is not None else None,
                            finish_reason=finish_reason,
                        )
                    )
            if out.finished:
                final = out
        if self.wants_usage_chunk(req) and final is not None:
            usage = self._usage(final, opened)
            yield p.ChatCompletionChunk(
                id=rid, model=self.model_name, choices=[], usage=usage
            ).model_dump()
