"""The Responses API's request, and how it becomes a chat completion request.

`instructions` become a system message; `input` (a text, or items: messages, earlier
`function_call`s and their `function_call_output`s) the conversation, after the stored one of
`previous_response_id`; function `tools`, `tool_choice`, `text.format` (a JSON schema, through
structured outputs) and `max_output_tokens` map onto their chat fields.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from inflight.errors import InvalidRequestError
from inflight.sampling_params import FLOAT32_TINY, MAX_INT64
from inflight.server import protocol as p
from inflight.server import schema_rules as rules
from inflight.server.errors import field_path, validation_message

MAX_INPUT_ITEMS = 4096


def _item(kind: str, required: list[str], properties: dict[str, Any]) -> dict[str, Any]:
    return {"type": "object", "required": ["type", *required],
            "properties": {"type": {"const": kind}, **properties}}  # fmt: skip


_STRING = {"type": "string"}
_TEXT_PART = {"type": "object", "required": ["type", "text"], "properties": {
    "type": {"enum": ["input_text", "output_text", "text"]}, "text": _STRING,
}}  # fmt: skip
_MESSAGE = {"type": "object", "required": ["role", "content"], "properties": {
    "type": {"const": "message"},
    "role": {"enum": ["user", "system", "developer", "assistant"]},
    "content": {"anyOf": [_STRING, {"type": "array", "items": _TEXT_PART}]},
}}  # fmt: skip
# What `input_messages` reads from a list input, for the OpenAPI document (the items are read
# by hand: they are a union the client tags by `type`, with `message` when it has none)
INPUT_ITEM_SCHEMA = {"anyOf": [
    _MESSAGE,
    _item("function_call", ["call_id", "name", "arguments"],
          {"call_id": _STRING, "name": _STRING, "arguments": _STRING}),
    _item("function_call_output", [], {"call_id": {"anyOf": [_STRING, {"type": "null"}]}}),
    _item("reasoning", [], {}),
]}  # fmt: skip


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


def _input_item_schema(schema: dict[str, Any]) -> None:
    schema["items"] = INPUT_ITEM_SCHEMA


InputItems = Field(min_length=1, max_length=MAX_INPUT_ITEMS, json_schema_extra=_input_item_schema)


class ResponsesRequest(BaseModel):
    model_config = ConfigDict(**p.STRICT, json_schema_extra=rules.tools_for_tool_choice("tools"))
    model: p.Text | None = None
    input: p.Text | Annotated[list[dict[str, Any]], InputItems]
    instructions: p.Text | None = None
    max_output_tokens: p.OptionalInt = Field(default=None, ge=1, le=MAX_INT64)
    temperature: float | None = Field(default=None, ge=0, le=2, allow_inf_nan=False)
    top_p: float | None = Field(default=None, ge=FLOAT32_TINY, le=1, allow_inf_nan=False)
    tools: Annotated[list[FunctionTool], Field(max_length=128)] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedFunctionChoice | None = None
    parallel_tool_calls: bool = True
    text: TextOptions | None = None
    stream: bool = False
    store: bool = True
    previous_response_id: p.Text | None = None
    # accepted and not acted on: a reasoning budget, what to include, stream options, truncation
    reasoning: dict[str, Any] | None = None
    include: list[p.Text] | None = None
    stream_options: dict[str, Any] | None = None
    truncation: Literal["auto", "disabled"] | None = None


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
    return [message for message, _ in _messages_and_sources(items)]


def _messages_and_sources(
    items: str | list[dict[str, Any]],
) -> list[tuple[dict[str, Any], list[str]]]:
    """Each chat message with the input fields it came from: the item's own (`input.3`), or
    one per call where parallel `function_call` items make one assistant turn."""
    if isinstance(items, str):
        return [({"role": "user", "content": items}, ["input"])]
    pairs: list[tuple[dict[str, Any], list[str]]] = []
    for i, item in enumerate(items):
        param = f"input.{i}"
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "system", "developer", "assistant"):
                raise InvalidRequestError(f"unknown role {role!r}", f"{param}.role")
            content = _text_of(item.get("content"), f"{param}.content")
            pairs.append(({"role": role, "content": content}, [param]))
        elif kind == "function_call":
            call = {
                "id": item.get("call_id"),
                "type": "function",
                "function": {"name": item.get("name"), "arguments": item.get("arguments")},
            }
            last = pairs[-1] if pairs else None
            if last and last[0]["role"] == "assistant" and last[0].get("tool_calls"):
                last[0]["tool_calls"].append(call)  # parallel calls: one assistant turn
                last[1].append(param)
            else:
                pairs.append(({"role": "assistant", "content": None, "tool_calls": [call]},
                              [param]))  # fmt: skip
        elif kind == "function_call_output":
            output = item.get("output")
            message = {
                "role": "tool",
                "tool_call_id": item.get("call_id"),
                "content": output if isinstance(output, str) else json.dumps(output),
            }
            pairs.append((message, [param]))
        elif kind != "reasoning":  # earlier reasoning is not sent back to the model
            raise InvalidRequestError(f"input items of type {kind!r} are not supported", param)
    return pairs


# A chat message's field by the name its input item gives it
_ITEM_FIELDS = {"content": "content", "role": "role", "tool_call_id": "call_id", "id": "call_id",
                "name": "name", "arguments": "arguments"}  # fmt: skip


def _input_location(path: list[str], pairs: list[tuple[dict[str, Any], list[str]]]) -> list[str]:
    """A chat message's error location (`messages.2.tool_calls.1.function.arguments`) as the
    Responses request's own field (`input.5.arguments`)."""
    if len(path) < 2 or path[0] != "messages" or not path[1].isdigit():
        return path
    message, sources = pairs[int(path[1])]
    where, rest = sources[0], path[2:]
    if rest[:1] == ["tool_calls"] and len(rest) > 1 and rest[1].isdigit():
        where, rest = sources[min(int(rest[1]), len(sources) - 1)], rest[2:]
    if not where.startswith("input."):
        return [where]  # instructions, the stored conversation, or a text input
    field = [_ITEM_FIELDS[f] for f in rest if f in _ITEM_FIELDS][:1]
    if field == ["content"] and message["role"] == "tool":
        field = ["output"]
    return [where, *field]


def chat_request(req: ResponsesRequest, history: list[dict[str, Any]]) -> p.ChatCompletionRequest:
    pairs = [(message, ["previous_response_id"]) for message in history]
    if req.instructions is not None:  # instructions are not carried over to continuations
        pairs.insert(0, ({"role": "system", "content": req.instructions}, ["instructions"]))
    pairs += _messages_and_sources(req.input)
    messages = [message for message, _ in pairs]
    if not messages:  # a rule the OpenAPI document states in words
        raise InvalidRequestError("input holds no message to answer (earlier reasoning alone is "
                                  "not one)", "input", "invalid_combination")  # fmt: skip
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
        errors = [{**error, "loc": _input_location(field_path(error["loc"]), pairs)}
                  for error in e.errors()]  # fmt: skip
        param, message = validation_message(errors)
        raise InvalidRequestError(message, param) from None
