"""The tool-call formats of each family (`server/tool_parsers.py`): whole outputs split into
content and OpenAI calls; streamed outputs, fed a character at a time, give the same content
and calls and never show the start of a call as content; text that never becomes a call is
content; the format is chosen from a chat template, or named (`--tool-call-parser`)."""

from __future__ import annotations

import json

import pytest

from inflight.server import tool_calls as tc
from inflight.server import tool_parsers as tp
from inflight.server.api_server import ServerConfig
from inflight.server.serving_chat import ChatServing

WEATHER = {"city": "Paris", "days": [1, 2], "unit": None}

# (parser, output, the content it leaves, the calls as (name, arguments))
CASES = [
    ("hermes", 'Let me look. <tool_call>{"name": "get_weather", "arguments": '
               '{"city": "Paris", "days": [1, 2], "unit": null}}</tool_call>',
     "Let me look. ", [("get_weather", WEATHER)]),
    ("llama3_json", '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris", '
                    '"days": [1, 2], "unit": null}}; {"name": "now", "parameters": {}}',
     "", [("get_weather", WEATHER), ("now", {})]),
    ("llama3_json", '{"name": "now", "parameters": {}}', "", [("now", {})]),
    ("mistral", 'Sure.[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris", '
                '"days": [1, 2], "unit": null}}, {"name": "now", "arguments": {}}]',
     "Sure.", [("get_weather", WEATHER), ("now", {})]),
    ("mistral", '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris", "days": [1, 2], "unit": null}'
                '[TOOL_CALLS]now[ARGS]{}',
     "", [("get_weather", WEATHER), ("now", {})]),
    ("pythonic", '[get_weather(city="Paris", days=[1, 2], unit=None), now()]',
     "", [("get_weather", WEATHER), ("now", {})]),
    ("pythonic", '```tool_code\nget_weather(city="Paris", days=[1, 2], unit=None)\n```',
     "", [("get_weather", WEATHER)]),
]  # fmt: skip


def _named(calls) -> list[tuple[str, object]]:
    return [(c.function.name, json.loads(c.function.arguments)) for c in calls]


@pytest.mark.parametrize(("parser", "text", "content", "calls"), CASES)
def test_a_whole_output_splits_into_content_and_calls(parser, text, content, calls):
    got_content, got_calls = tc.parse_tool_calls("auto", text, None, parser)
    assert (got_content or "") == content.strip() and _named(got_calls) == calls
    assert all(c.id.startswith("call_") for c in got_calls)


@pytest.mark.parametrize(("parser", "text", "content", "calls"), CASES)
def test_a_streamed_output_gives_the_same_and_never_shows_a_call_as_content(
    parser, text, content, calls
):
    stream = tc.ToolCallStream("auto", parser=parser)
    streamed, deltas = "", []
    for end in range(1, len(text) + 1):  # a character at a time
        new, new_deltas = stream.feed(text[:end], end == len(text))
        streamed += new
        deltas += new_deltas
    assert streamed == content
    assert [(d.function.name, json.loads(d.function.arguments)) for d in deltas] == calls
    assert [d.index for d in deltas] == list(range(len(calls)))
    assert tc.finish_reason("auto", stream.num_calls, "stop") == "tool_calls"


@pytest.mark.parametrize("parser", list(tp.PARSERS))
@pytest.mark.parametrize(
    "text", ["The weather in Paris is mild.", "{not a call", "[1, 2, 3] are numbers", "Sure"]
)
def test_text_that_never_becomes_a_call_is_content(parser, text):
    assert tc.parse_tool_calls("auto", text, None, parser) == (text, [])
    stream = tc.ToolCallStream("auto", parser=parser)
    streamed = ""
    for end in range(1, len(text) + 1):
        new, deltas = stream.feed(text[:end], end == len(text))
        streamed += new
        assert not deltas
    assert streamed == text


def test_hostile_python_is_parsed_never_run():
    """Only literals are read: a call in an argument, a name, a huge exponent or nesting past
    Python's limit leave the text as content."""
    for text in ('[f(x=__import__("os").system("true"))]', "[f(x=y)]", "[f(x=9**9**9)]",
                 "[f(x=" + "[" * 5000 + "]" * 5000 + ")]", "[f(1)]"):  # fmt: skip
        assert tp.pythonic(text, True) == (text, [], len(text))


@pytest.mark.parametrize(
    ("template", "architecture", "parser"),
    [
        ("{{ '<tool_call>' }}", "qwen3", "hermes"),
        ("{{ '[TOOL_CALLS]' }}", "llama", "mistral"),
        ("<|python_tag|>", "llama", "llama3_json"),
        ('Respond in the format {"name": function name, "parameters": dictionary of argument '
         "name and its value}", "llama", "llama3_json"),
        ({"default": "plain", "tool_use": "{{ '<tool_call>' }}"}, "llama", "hermes"),
        (None, "gemma3", "pythonic"),
        ("plain", "llama", "hermes"),
    ],
)  # fmt: skip
def test_the_format_is_chosen_from_the_chat_template(template, architecture, parser):
    assert tp.choose(tp.template_text(template), architecture) == parser


def test_the_server_takes_a_named_parser_and_refuses_an_unknown_one():
    class Engine:  # a named parser needs nothing of the engine
        pass

    assert ChatServing(Engine(), "tiny", tool_call_parser="mistral").tool_parser == "mistral"
    with pytest.raises(ValueError, match="unknown tool_call_parser 'xml'"):
        ServerConfig(tool_call_parser="xml")
    assert ServerConfig().tool_call_parser == "auto"


def test_the_cli_offers_every_parser():
    from inflight.cli import build_parser

    serve = build_parser()._subparsers._group_actions[0].choices["serve"]
    action = next(a for a in serve._actions if a.dest == "tool_call_parser")
    assert action.choices == ["auto", *tp.PARSERS]
