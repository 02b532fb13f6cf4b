"""The formats models write tool calls in, each a parser from generated text to OpenAI tool
calls (`auto` tool choice). A parser's `split(text, final)` returns (content, calls, characters
consumed); before the output is final it holds back whatever may still become a call, so a
streamed message never shows the beginning of one as content.

- `hermes`: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` blocks anywhere in the
  text (Hermes, Qwen 2.5 and 3, SmolLM3 templates).
- `llama3_json`: the whole output one or more JSON objects `{"name": ..., "parameters": {...}}`
  separated by `;`, after an optional `<|python_tag|>` (Llama 3.1-3.3's JSON tool calling).
- `mistral`: `[TOOL_CALLS]` and then a JSON array of calls (v3 tokenizers) or `name[ARGS]{...}`
  per call (v11 and later); its markers are special tokens, kept in the text for it.
- `pythonic`: a Python list of calls with literal arguments, `[get_weather(city="Paris")]`,
  optionally in a tool_code fence (Llama 3.2 and 4's pythonic templates; how Gemma 3 is
  prompted to call tools).

`choose(...)` picks one from the model's chat template where the server is not told which.
"""

from __future__ import annotations

import ast
import json
import re
import uuid
from collections.abc import Callable
from typing import Any

from inflight.server import protocol as p

Split = Callable[[str, bool], tuple[str, list[p.ToolCall], int]]

TOOL_CALL_OPEN, TOOL_CALL_CLOSE = "<tool_call>", "</tool_call>"
_HERMES_BLOCK = re.compile(re.escape(TOOL_CALL_OPEN) + r"(.*?)" + re.escape(TOOL_CALL_CLOSE), re.S)
PYTHON_TAG = "<|python_tag|>"
TOOL_CALLS, ARGS = "[TOOL_CALLS]", "[ARGS]"
_FENCE = re.compile(r"^```(?:tool_code|python)?\s*\n?(.*?)\n?```\s*$", re.S)


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def make_call(name: str, arguments: Any) -> p.ToolCall:
    text = arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
    return p.ToolCall(id=new_call_id(), function=p.FunctionCall(name=name, arguments=text))


def as_call(item: Any) -> p.ToolCall | None:
    """`{"name": str, "arguments": {...}}` (or "parameters", as Llama's templates ask) -> a
    call, or None for anything else."""
    if not isinstance(item, dict) or not isinstance(item.get("name"), str):
        return None
    arguments = item.get("arguments", item.get("parameters", {}))
    return make_call(item["name"], arguments)


def partial_tag_start(text: str, tag: str) -> int:
    """Where a suffix of `text` that may still grow into `tag` starts (its length if none)."""
    start = max(0, len(text) - len(tag) + 1)
    return next((i for i in range(start, len(text)) if tag.startswith(text[i:])), len(text))


def _held_back(rest: str, marker: str) -> int:
    """Where `marker`, or text that may still grow into it, starts in `rest` (its length if
    nowhere)."""
    cut = rest.find(marker)
    return cut if cut >= 0 else partial_tag_start(rest, marker)


def hermes(text: str, final: bool) -> tuple[str, list[p.ToolCall], int]:
    content, calls, pos = [], [], 0
    for match in _HERMES_BLOCK.finditer(text):
        content.append(text[pos : match.start()])
        try:
            call = as_call(json.loads(match.group(1)))
        except ValueError:
            call = None
        if call is None:
            content.append(match.group(0))  # not a call after all: keep it as text
        else:
            calls.append(call)
        pos = match.end()
    rest = text[pos:]
    if not final:
        rest = rest[: _held_back(rest, TOOL_CALL_OPEN)]
    content.append(rest)
    return "".join(content), calls, pos + len(rest)


def _json_calls(body: str, separators: str) -> tuple[list[p.ToolCall], bool]:
    """The calls of `body`, JSON objects one after another (`separators` between them), and
    whether the body is nothing else (False: some text is not a call, or not complete yet)."""
    decoder, pos = json.JSONDecoder(), 0
    calls: list[p.ToolCall] = []
    while True:
        while pos < len(body) and body[pos] in separators:
            pos += 1
        if pos >= len(body):
            return calls, bool(calls)
        try:
            item, pos = decoder.raw_decode(body, pos)
        except ValueError:
            return calls, False
        items = item if isinstance(item, list) else [item]
        found = [as_call(i) for i in items]
        if not items or any(c is None for c in found):
            return calls, False
        calls.extend(c for c in found if c is not None)


def llama3_json(text: str, final: bool) -> tuple[str, list[p.ToolCall], int]:
    body = text.lstrip()
    if body.startswith(PYTHON_TAG):
        body = body[len(PYTHON_TAG) :]
    elif not final and PYTHON_TAG.startswith(body):  # (empty, or the tag half written)
        return "", [], 0
    if not final and not body.strip():  # the tag, and nothing after it yet
        return "", [], 0
    if not body.lstrip().startswith("{"):
        return text, [], len(text)  # an answer, not a call
    calls, whole = _json_calls(body, " \t\r\n;")
    if whole:
        return "", calls, len(text)
    if final:  # it never became calls: the text is the answer
        return text, [], len(text)
    return "", calls, 0  # the calls complete so far; the rest may still come


def mistral(text: str, final: bool) -> tuple[str, list[p.ToolCall], int]:
    at = text.find(TOOL_CALLS)
    if at < 0:
        if final:
            return text, [], len(text)
        kept = _held_back(text, TOOL_CALLS)
        return text[:kept], [], kept
    content, calls = text[:at], []
    for part in text[at:].split(TOOL_CALLS)[1:]:
        if ARGS in part:  # v11: name[ARGS]{arguments}
            name, _, arguments = part.partition(ARGS)
            try:
                args, _ = json.JSONDecoder().raw_decode(arguments.strip())
            except ValueError:
                continue  # not complete yet (or never): no call
            calls.append(make_call(name.strip(), args))
        else:  # v3: a JSON array of calls
            calls.extend(_json_calls(part.strip(), " \t\r\n")[0])
    if final and not calls:
        return text, [], len(text)
    return content, calls, len(text)


def _literal(node: ast.expr) -> Any:
    return ast.literal_eval(node)


def _python_calls(source: str) -> list[p.ToolCall] | None:
    """A Python list of calls (or one call) with literal keyword arguments, else None."""
    try:
        tree = ast.parse(source.strip(), mode="eval").body
    except (SyntaxError, ValueError, RecursionError):
        return None
    nodes = tree.elts if isinstance(tree, ast.List) else [tree]
    calls = []
    for node in nodes:
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)) or node.args:
            return None
        try:
            arguments = {kw.arg: _literal(kw.value) for kw in node.keywords if kw.arg}
        except (ValueError, TypeError, SyntaxError, RecursionError):
            return None
        calls.append(make_call(node.func.id, arguments))
    return calls or None


def pythonic(text: str, final: bool) -> tuple[str, list[p.ToolCall], int]:
    body = text.strip()
    fenced = _FENCE.match(body)
    if fenced:
        body = fenced.group(1).strip()
    calls = _python_calls(body) if body else None
    if calls:
        return "", calls, len(text)
    if not final and _MAY_BECOME_CALLS.match(body):
        return "", [], 0
    return text, [], len(text)


# the start of a list of calls, of a fence, or of a call (an identifier and what follows it)
_MAY_BECOME_CALLS = re.compile(r"^(\[|`|[A-Za-z_][\w.]*(\(.*)?$|$)", re.S)


PARSERS: dict[str, Split] = {
    "hermes": hermes,
    "llama3_json": llama3_json,
    "mistral": mistral,
    "pythonic": pythonic,
}
# parsers whose markers are special tokens: their requests are detokenized keeping them
KEEPS_SPECIAL_TOKENS = frozenset({"mistral"})


def template_text(chat_template: str | dict[str, str] | None) -> str:
    """A tokenizer's chat template as one text (all of them, where it names several)."""
    if isinstance(chat_template, dict):
        return "\n".join(chat_template.values())
    return chat_template or ""


def choose(template: str, architecture: str) -> str:
    """The format a model's chat template (`template_text`) asks for: Hermes blocks, Mistral's
    markers, Llama 3's JSON (its templates ask for `"parameters"`); Gemma 3 is prompted to
    write Python calls; Hermes where nothing says."""
    if TOOL_CALL_OPEN in template:
        return "hermes"
    if TOOL_CALLS in template:
        return "mistral"
    if PYTHON_TAG in template or '"parameters": dictionary' in template:
        return "llama3_json"
    if architecture == "gemma3":
        return "pythonic"
    return "hermes"
