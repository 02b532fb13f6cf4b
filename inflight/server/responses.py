"""POST /v1/responses (and GET / DELETE of stored ones): OpenAI's Responses API over the chat path.

A request becomes a chat completion: `instructions` a system message, `input` (a text, or items:
messages, earlier `function_call`s and their `function_call_output`s) the conversation, after the
stored conversation of `previous_response_id`; function `tools`, `tool_choice`, `text.format`
(a JSON schema through structured outputs) and `max_output_tokens` map onto their chat fields.
The chat result becomes the Response's output items: a `reasoning` item where the model thinks,
a `message` with `output_text`, and one `function_call` per call. Streamed, the chat chunks
become the Responses events, in the order the spec gives: created, in_progress, then per item
added / deltas / done, then completed (or incomplete, at `max_output_tokens`).
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncGenerator
from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field, ValidationError

from inflight.errors import InvalidRequestError
from inflight.sampling_params import MAX_INT64
from inflight.server import protocol as p
from inflight.server.response_store import ResponseStore
from inflight.server.serving_chat import ChatServing

MAX_INPUT_ITEMS = 4096


class FunctionTool(BaseModel):
    model_config = p.STRICT
    type: Literal["function"]
    name: p.FunctionName
    description: p.Text | None = None
    parameters: dict[str, Any] = Field(default_factory=lambda: {"type": "object"})
    strict: bool | None = None


class NamedFunctionChoice(BaseModel):
    model_config = p.STRICT
    type: Literal["function"]
    name: p.FunctionName


class TextFormat(BaseModel):
    model_config = p.STRICT
    type: Literal["text", "json_object", "json_schema"] = "text"
    name: p.Text | None = None
    schema_: dict[str, Any] | None = Field(alias="schema", default=None)
    description: p.Text | None = None
    strict: bool | None = None


class TextOptions(BaseModel):
    model_config = p.STRICT
    format: TextFormat = Field(default_factory=TextFormat)


class ResponsesRequest(BaseModel):
    model_config = p.STRICT
    model: p.Text | None = None
    input: p.Text | Annotated[list[dict[str, Any]], Field(max_length=MAX_INPUT_ITEMS)]
    instructions: p.Text | None = None
    max_output_tokens: int | None = Field(default=None, ge=1, le=MAX_INT64)
    temperature: float | None = Field(default=None, ge=0, le=2, allow_inf_nan=False)
    top_p: float | None = Field(default=None, gt=0, le=1, allow_inf_nan=False)
    tools: Annotated[list[FunctionTool], Field(max_length=128)] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedFunctionChoice | None = None
    parallel_tool_calls: bool = True
    text: TextOptions | None = None
    stream: bool = False
    store: bool = True
    previous_response_id: p.Text | None = None
    # accepted and not acted on: a reasoning budget, what to include, truncation
    reasoning: dict[str, Any] | None = None
    include: list[p.Text] | None = None
    truncation: Literal["auto", "disabled"] | None = None


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def _text_of(content: Any, param: str) -> str:
    """A message's content: a string, or a list of text parts."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise InvalidRequestError("content must be a string or a list of parts", param)
    texts = []
    for i, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in ("input_text", "output_text", "text") or not isinstance(
            part.get("text"), str
        ):
            raise InvalidRequestError(
                f"content parts must be text (input_text or output_text), got {kind!r}",
                f"{param}.{i}",
            )
        texts.append(part["text"])
    return "".join(texts)


def input_messages(items: str | list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The request's input as chat messages (OpenAI's chat shapes)."""
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    messages: list[dict[str, Any]] = []
    for i, item in enumerate(items):
        param = f"input.{i}"
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "system", "developer", "assistant"):
                raise InvalidRequestError(f"unknown role {role!r}", f"{param}.role")
            messages.append(
                {"role": role, "content": _text_of(item.get("content"), f"{param}.content")}
            )
        elif kind == "function_call":
            call = {
                "id": item.get("call_id"),
                "type": "function",
                "function": {"name": item.get("name"), "arguments": item.get("arguments")},
            }
            if messages and messages[-1]["role"] == "assistant" and messages[-1].get("tool_calls"):
                messages[-1]["tool_calls"].append(call)  # parallel calls: one assistant turn
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            output = item.get("output")
            messages.append(
                {
                    "role": "tool",
                    "tool_call_id": item.get("call_id"),
                    "content": output if isinstance(output, str) else json.dumps(output),
                }
            )
        elif kind != "reasoning":  # earlier reasoning is not sent back to the model
            raise InvalidRequestError(f"input items of type {kind!r} are not supported", param)
    return messages


def chat_request(req: ResponsesRequest, history: list[dict[str, Any]]) -> p.ChatCompletionRequest:
    messages = list(history)
    if req.instructions is not None:  # instructions are not carried over to continuations
        messages.insert(0, {"role": "system", "content": req.instructions})
    messages += input_messages(req.input)
    body: dict[str, Any] = {
        "model": req.model,
        "messages": messages,
        "max_completion_tokens": req.max_output_tokens,
        "temperature": req.temperature,
        "top_p": req.top_p,
        "parallel_tool_calls": req.parallel_tool_calls,
    }
    if req.tools:
        body["tools"] = [
            {"type": "function", "function": t.model_dump(exclude={"type"}, exclude_none=True)}
            for t in req.tools
        ]
    if isinstance(req.tool_choice, NamedFunctionChoice):
        body["tool_choice"] = {"type": "function", "function": {"name": req.tool_choice.name}}
    elif req.tool_choice is not None:
        body["tool_choice"] = req.tool_choice
    fmt = req.text.format if req.text else None
    if fmt is not None and fmt.type == "json_schema":
        body["response_format"] = {
            "type": "json_schema",
            "json_schema": {
                "name": fmt.name or "response",
                "schema": fmt.schema_ or {},
                "strict": fmt.strict,
            },
        }
    elif fmt is not None and fmt.type == "json_object":
        body["response_format"] = {"type": "json_object"}
    try:
        return p.ChatCompletionRequest.model_validate(body)
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(x) for x in first["loc"])
        param = "input" if where.startswith("messages") else where
        raise InvalidRequestError(f"{where}: {first['msg']}", param) from None


class ResponsesServing:
    def __init__(self, chat: ChatServing, store: ResponseStore) -> None:
        self.chat, self.store = chat, store

    def _history(self, req: ResponsesRequest, owner: str) -> list[dict[str, Any]]:
        if req.previous_response_id is None:
            return []
        return self.store.get(owner, req.previous_response_id, "previous_response_id").messages

    def _response(
        self,
        req: ResponsesRequest,
        rid: str,
        created: int,
        status: str,
        output: list[dict[str, Any]],
        usage: p.UsageInfo | None,
    ) -> dict[str, Any]:
        fmt = req.text.format if req.text else TextFormat()
        choice = req.tool_choice or "auto"
        return {
            "id": rid,
            "object": "response",
            "created_at": created,
            "status": status,
            "model": self.chat.model_name,
            "output": output,
            "error": None,
            "incomplete_details": {"reason": "max_output_tokens"}
            if status == "incomplete"
            else None,
            "instructions": req.instructions,
            "max_output_tokens": req.max_output_tokens,
            "parallel_tool_calls": req.parallel_tool_calls,
            "previous_response_id": req.previous_response_id,
            "store": req.store,
            "temperature": req.temperature,
            "top_p": req.top_p,
            "text": {"format": fmt.model_dump(by_alias=True, exclude_none=True)},
            "tool_choice": choice.model_dump() if isinstance(choice, BaseModel) else choice,
            "tools": [t.model_dump(exclude_none=True) for t in req.tools or []],
            "usage": None
            if usage is None
            else {
                "input_tokens": usage.prompt_tokens,
                "output_tokens": usage.completion_tokens,
                "total_tokens": usage.total_tokens,
                "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
                "output_tokens_details": {"reasoning_tokens": 0},
            },
            "metadata": {},
        }

    def _keep(
        self,
        req: ResponsesRequest,
        owner: str,
        response: dict[str, Any],
        messages: list[dict[str, Any]],
        reply: dict[str, Any],
    ) -> None:
        if req.store:
            self.store.put(owner, response, [*messages, reply])

    async def create(self, req: ResponsesRequest, owner: str) -> dict[str, Any]:
        chat_req = chat_request(req, self._history(req, owner))
        chat = await self.chat.create(chat_req)
        choice = chat.choices[0]
        message = choice.message
        output = []
        if message.reasoning_content:
            output.append(reasoning_item(message.reasoning_content))
        if message.content or not message.tool_calls:
            status = "incomplete" if choice.finish_reason == "length" else "completed"
            output.append(message_item(new_id("msg"), message.content or "", status))
        for call in message.tool_calls or []:
            output.append(call_item(call.id, call.function.name, call.function.arguments))
        status = "incomplete" if choice.finish_reason == "length" else "completed"
        response = self._response(req, new_id("resp"), int(time.time()), status, output, chat.usage)
        reply = message.model_dump(exclude_none=True, exclude={"reasoning_content", "refusal"})
        self._keep(req, owner, response, _dumped(chat_req.messages), reply)
        return response

    async def stream(
        self, req: ResponsesRequest, owner: str
    ) -> AsyncGenerator[dict[str, Any], None]:
        """Starts now (errors raise before any byte is sent); the events come later."""
        chat_req = chat_request(req, self._history(req, owner))
        chat_req.stream = True
        chat_req.stream_options = p.StreamOptions(include_usage=True)
        chunks = await self.chat.stream(chat_req)
        return self._events(req, owner, chat_req, chunks)

    async def _events(
        self,
        req: ResponsesRequest,
        owner: str,
        chat_req: p.ChatCompletionRequest,
        chunks: AsyncGenerator[dict[str, Any], None],
    ) -> AsyncGenerator[dict[str, Any], None]:
        rid, created, events = new_id("resp"), int(time.time()), _Events()
        yield events.make(
            "response.created", response=self._response(req, rid, created, "in_progress", [], None)
        )
        yield events.make(
            "response.in_progress",
            response=self._response(req, rid, created, "in_progress", [], None),
        )
        text, thought, finish = "", "", None
        calls: dict[int, dict[str, Any]] = {}  # tool-call index -> its item
        message_id: str | None = None
        usage = None
        async for chunk in chunks:
            if chunk.get("usage"):
                usage = p.UsageInfo(**chunk["usage"])
            for choice in chunk["choices"]:
                delta, finish = choice["delta"], choice.get("finish_reason") or finish
                thought += delta.get("reasoning_content") or ""
                if delta.get("content"):
                    if message_id is None:
                        message_id = new_id("msg")
                        for event in events.open_message(message_id):
                            yield event
                    text += delta["content"]
                    yield events.make(
                        "response.output_text.delta",
                        item_id=message_id,
                        output_index=events.index_of(message_id),
                        content_index=0,
                        delta=delta["content"],
                        logprobs=[],
                    )
                for call in delta.get("tool_calls") or []:
                    item = calls.get(call["index"])
                    if item is None:
                        item = calls[call["index"]] = call_item(
                            call["id"], call["function"]["name"], "", "in_progress"
                        )
                        yield events.added(item)
                    piece = call["function"].get("arguments") or ""
                    item["arguments"] += piece
                    if piece:
                        yield events.make(
                            "response.function_call_arguments.delta",
                            item_id=item["id"],
                            output_index=events.index_of(item["id"]),
                            delta=piece,
                        )
        status = "incomplete" if finish == "length" else "completed"
        output = []
        if thought:
            output.append(reasoning_item(thought))
        if message_id is not None:
            done = message_item(message_id, text, status)
            for event in events.close_message(done):
                yield event
            output.append(done)
        for item in calls.values():
            item["status"] = "completed"
            yield events.make(
                "response.function_call_arguments.done",
                item_id=item["id"],
                output_index=events.index_of(item["id"]),
                arguments=item["arguments"],
            )
            yield events.make(
                "response.output_item.done", output_index=events.index_of(item["id"]), item=item
            )
            output.append(item)
        response = self._response(req, rid, created, status, output, usage)
        reply: dict[str, Any] = {"role": "assistant", "content": text or None}
        if calls:
            reply["tool_calls"] = [
                {
                    "id": c["call_id"],
                    "type": "function",
                    "function": {"name": c["name"], "arguments": c["arguments"]},
                }
                for c in calls.values()
            ]
        self._keep(req, owner, response, _dumped(chat_req.messages), reply)
        yield events.make(f"response.{status}", response=response)

    def retrieve(self, owner: str, response_id: str) -> dict[str, Any]:
        return self.store.get(owner, response_id).response

    def delete(self, owner: str, response_id: str) -> dict[str, Any]:
        self.store.delete(owner, response_id)
        return {"id": response_id, "object": "response.deleted", "deleted": True}


def _dumped(messages: list[p.ChatMessage]) -> list[dict[str, Any]]:
    return [m.model_dump(exclude_none=True) for m in messages]


def message_item(item_id: str, text: str, status: str) -> dict[str, Any]:
    return {
        "id": item_id,
        "type": "message",
        "role": "assistant",
        "status": status,
        "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}],
    }


def call_item(call_id: str, name: str, arguments: str, status: str = "completed") -> dict[str, Any]:
    return {
        "id": new_id("fc"),
        "type": "function_call",
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
        "status": status,
    }


def reasoning_item(text: str) -> dict[str, Any]:
    return {
        "id": new_id("rs"),
        "type": "reasoning",
        "summary": [{"type": "summary_text", "text": text}],
    }


class _Events:
    """Numbers events in order and keeps each output item's index."""

    def __init__(self) -> None:
        self.sequence = 0
        self._indices: dict[str, int] = {}

    def make(self, kind: str, **fields: Any) -> dict[str, Any]:
        event = {"type": kind, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        return event

    def index_of(self, item_id: str) -> int:
        return self._indices[item_id]

    def added(self, item: dict[str, Any]) -> dict[str, Any]:
        self._indices[item["id"]] = len(self._indices)
        return self.make(
            "response.output_item.added", output_index=self._indices[item["id"]], item=item
        )

    def open_message(self, item_id: str) -> list[dict[str, Any]]:
        item = message_item(item_id, "", "in_progress")
        item["content"] = []
        part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
        return [
            self.added(item),
            self.make(
                "response.content_part.added",
                item_id=item_id,
                output_index=self._indices[item_id],
                content_index=0,
                part=part,
            ),
        ]

    def close_message(self, item: dict[str, Any]) -> list[dict[str, Any]]:
        index, part = self._indices[item["id"]], item["content"][0]
        return [
            self.make(
                "response.output_text.done",
                item_id=item["id"],
                output_index=index,
                content_index=0,
                text=part["text"],
                logprobs=[],
            ),
            self.make(
                "response.content_part.done",
                item_id=item["id"],
                output_index=index,
                content_index=0,
                part=part,
            ),
            self.make("response.output_item.done", output_index=index, item=item),
        ]
