"""Tool calls on chat completions: the constraint a `tool_choice` implies, and the parsers that
turn generated text into OpenAI `tool_calls`, whole or streamed.

- `required`: the output is constrained to a JSON array of `{"name": ..., "arguments": {...}}`
  (one item unless `parallel_tool_calls`), each item matching one function's parameter schema,
  so it works with any model. Streamed one complete call at a time. That array is this server's
  wrapper and never reaches a client: an output cut by `max_tokens` ends with the cut call, its
  arguments as far as they got (finish "length"), whole or streamed alike.
- a named function: the output is constrained to that function's parameter schema and is its
  arguments. Streamed as OpenAI streams it: a first delta with the call's id and name, then the
  arguments text as it is generated. Finishes with "stop", as OpenAI's forced calls do.
- `auto`: unconstrained; the tools are rendered by the model's chat template, and the calls the
  model writes in its family's format (`tool_parsers`: Hermes blocks, Llama 3's JSON, Mistral's
  markers, Python calls; chosen from the template or by `--tool-call-parser`) become calls; the
  rest is the message's content.
- `none`: tools are not rendered; plain text.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from inflight.errors import InvalidRequestError
from inflight.sampling_params import StructuredOutputs
from inflight.server import protocol as p
from inflight.server.tool_parsers import PARSERS, as_call, make_call, new_call_id
from inflight.structured.compiler import check_json_schema


def resolve_tool_choice(req: p.ChatCompletionRequest) -> str:
    """'none', 'auto', 'required' or 'named'; checks tools and tool_choice agree (400s)."""
    choice = req.tool_choice
    if not req.tools:
        if choice not in (None, "none"):
            raise InvalidRequestError("tool_choice needs tools", param="tool_choice")
        return "none"
    for i, tool in enumerate(req.tools):
        check_json_schema(tool.function.parameters, f"tools.{i}.function.parameters")
    names = [t.function.name for t in req.tools]
    if len(set(names)) != len(names):
        raise InvalidRequestError("tools must have distinct function names", "tools",
                                  "invalid_combination")  # fmt: skip
    if isinstance(choice, p.NamedToolChoice):
        if choice.function.name not in names:
            raise InvalidRequestError(
                f"tool_choice names {choice.function.name!r}, which is not in tools",
                "tool_choice", "invalid_combination",
            )  # fmt: skip
        return "named"
    return choice or "auto"


def tool_constraint(req: p.ChatCompletionRequest, mode: str) -> StructuredOutputs | None:
    """The output constraint of `required` and named tool choices (None for the others)."""
    tools = req.tools or []  # `resolve_tool_choice` gave "none" to a request without tools
    if mode == "named":
        name = req.tool_choice.function.name  # type: ignore[union-attr]
        params = next(t.function.parameters for t in tools if t.function.name == name)
        return StructuredOutputs(json=params, param="tool_choice")
    if mode == "required":
        items = [
            {"type": "object", "required": ["name", "arguments"],
             "properties": {"name": {"const": t.function.name},
                            "arguments": t.function.parameters}}
            for t in tools
        ]  # fmt: skip
        schema: dict[str, Any] = {"type": "array", "minItems": 1, "items": {"anyOf": items}}
        if not req.parallel_tool_calls:
            schema["maxItems"] = 1
        return StructuredOutputs(json=schema, param="tools")
    return None


def _array_items(text: str) -> tuple[list[Any], str]:
    """The complete items of a JSON array whose text may still be growing, and the text after
    them (an item still being written)."""
    decoder, items = json.JSONDecoder(), list[Any]()
    pos = text.find("[")
    if pos < 0:
        return items, ""
    pos += 1
    while True:
        while pos < len(text) and text[pos] in " \t\r\n,":
            pos += 1
        if pos >= len(text) or text[pos] == "]":
            return items, ""
        try:
            item, end = decoder.raw_decode(text, pos)
        except ValueError:
            return items, text[pos:]  # incomplete: more text to come
        items.append(item)
        pos = end


# an item of the `required` array cut after its name: the constraint writes "name" first
_CUT_ITEM = re.compile(r'\{\s*"name"\s*:\s*("(?:[^"\\]|\\.)*")\s*,\s*"arguments"\s*:\s*(.*)', re.S)


def _cut_call(rest: str) -> p.ToolCall | None:
    """The call an unfinished item holds, its arguments as far as they were written; None
    when the output was cut before the function's name was whole."""
    match = _CUT_ITEM.match(rest)
    if match is None:
        return None
    return make_call(json.loads(match.group(1)), match.group(2).rstrip())


def _required_calls(text: str, cut: bool) -> list[p.ToolCall]:
    """The calls of a `required` output; `cut`: the output ended early, so an unfinished
    item is a call too."""
    items, rest = _array_items(text)
    calls = [c for c in map(as_call, items) if c is not None]
    if cut and (last := _cut_call(rest)) is not None:
        calls.append(last)
    return calls


def parse_tool_calls(
    mode: str, text: str, function_name: str | None, parser: str = "hermes"
) -> tuple[str | None, list[p.ToolCall]]:
    """Whole output -> (content, tool calls) for a non-streamed response; `parser` names the
    format of `auto` calls (`tool_parsers.PARSERS`)."""
    if mode == "named":
        return None, [make_call(function_name, text)]  # type: ignore[arg-type]
    if mode == "required":  # the array is never content, even cut before its first call
        return None, _required_calls(text, cut=True)
    if mode == "auto":
        content, calls, _ = PARSERS[parser](text, True)
        if not calls:
            return text, []
        return content.strip() or None, calls
    return text, []


def finish_reason(mode: str, calls: int, reason: str | None) -> str | None:
    """OpenAI's: "tool_calls" when the model chose to call; forced (named) calls end "stop"."""
    if reason == "stop" and calls and mode in ("required", "auto"):
        return "tool_calls"
    return reason


@dataclass
class ToolCallStream:
    """One choice's streamed tool calls: fed the cumulative text, returns what is new."""

    mode: str
    function_name: str | None = None
    parser: str = "hermes"  # the format of `auto` calls
    _sent_chars: int = 0  # of content (auto) or arguments (named)
    _num_calls: int = 0
    _call_id: str = field(default_factory=new_call_id)

    @property
    def num_calls(self) -> int:
        return self._num_calls

    def feed(self, text: str, finished: bool) -> tuple[str, list[p.DeltaToolCall]]:
        """(new content, new tool-call deltas) since the last call."""
        if self.mode == "named":
            new, self._sent_chars = text[self._sent_chars :], len(text)
            if self._num_calls == 0:  # the first delta names the call
                self._num_calls = 1
                function = p.DeltaFunctionCall(name=self.function_name, arguments=new)
                return "", [p.DeltaToolCall(index=0, id=self._call_id, type="function",
                                            function=function)]  # fmt: skip
            if not new:
                return "", []
            return "", [p.DeltaToolCall(index=0, function=p.DeltaFunctionCall(arguments=new))]
        if self.mode == "required":
            return "", self._new_calls(_required_calls(text, cut=finished))
        # auto
        content, calls, _ = PARSERS[self.parser](text, finished)
        new_content = content[self._sent_chars :]
        self._sent_chars = len(content)
        return new_content, self._new_calls(calls)

    def _new_calls(self, calls: list[p.ToolCall]) -> list[p.DeltaToolCall]:
        deltas = [
            p.DeltaToolCall(
                index=i, id=c.id, type="function",
                function=p.DeltaFunctionCall(name=c.function.name, arguments=c.function.arguments),
            )
            for i, c in enumerate(calls) if i >= self._num_calls
        ]  # fmt: skip
        self._num_calls = max(self._num_calls, len(calls))
        return deltas
