"""Structured outputs and tool calls over HTTP on the tiny model: bad constraints are 400s naming
the field, found before anything is queued; tool-call text parses into OpenAI's shapes, whole and
streamed."""

from __future__ import annotations

import json

import httpx
import pytest

from inflight.engine.async_engine import AsyncLLM
from inflight.server import protocol as p
from inflight.server import tool_calls as tc
from inflight.server import tool_parsers
from tests.server.live import LiveServer

WEATHER = {"type": "function", "function": {
    "name": "get_weather",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 8}},
                   "required": ["city"]},
}}  # fmt: skip
USER = [{"role": "user", "content": "hi"}]
DEEP = json.loads('{"items": ' * 100 + "{}" + "}" * 100)  # parses; too deep to check


@pytest.fixture(scope="module")
def server(tiny_llama):
    engine = AsyncLLM(str(tiny_llama), dtype="float32", max_model_len=256, num_kv_blocks=64)
    with LiveServer(engine, served_model_name="tiny") as s:
        yield s


def chat(server, **body):
    """Sent as JSON text with escapes (`\\ud800`) and `NaN` as a hostile client writes them."""
    text = json.dumps({"messages": USER, "max_tokens": 60, **body})
    return httpx.post(server.url + "/v1/chat/completions", content=text,
                      headers={"content-type": "application/json"}, timeout=60)  # fmt: skip


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "x",
          "schema": {"type": "object", "properties": {"a": {"type": "strng"}}}}}},
         "response_format.json_schema"),
        ({"response_format": {"type": "json_schema"}}, "response_format.json_schema"),
        ({"response_format": {"type": "yaml"}}, "response_format.type"),
        ({"structured_outputs": {"regex": "(("}}, "structured_outputs"),
        ({"structured_outputs": {"grammar": "root ::= nowhere"}}, "structured_outputs"),
        ({"structured_outputs": {"json": "{broken"}}, "structured_outputs"),
        ({"structured_outputs": {"regex": "a", "choice": ["a"]}}, "structured_outputs"),
        ({"structured_outputs": {"choice": []}}, "structured_outputs.choice"),
        ({"structured_outputs": {"regex": "a"}, "response_format": {"type": "json_object"}},
         "structured_outputs"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}},
         "tool_choice"),
        ({"tools": [WEATHER, WEATHER]}, "tools"),
        ({"tools": [{"type": "function", "function": {"name": "f",
          "parameters": {"type": "object", "required": "city"}}}]},
         "tools.0.function.parameters"),
        ({"tools": [{"type": "function", "function": {"name": "bad name!"}}]},
         "tools.0.function.name"),
        ({"tools": [WEATHER], "tool_choice": "required",
          "response_format": {"type": "json_object"}}, "response_format"),
        ({"structured_outputs": {"regex": "a"}, "min_tokens": 3}, "min_tokens"),
        ({"structured_outputs": {"json": "[" * 50_000}}, "structured_outputs"),
        ({"structured_outputs": {"json": DEEP}}, "structured_outputs"),
        ({"tools": [{"type": "function", "function": {"name": "f", "parameters": DEEP}}]},
         "tools.0.function.parameters"),
        ({"structured_outputs": {"json": {"type": "integer", "minimum": -(10**30)}}},
         "structured_outputs"),
        ({"structured_outputs": {"json": {"type": "object", "properties": {
          "\ud800": {"type": "string"}}}}}, "structured_outputs"),
        ({"structured_outputs": {"json": '{"enum": ["\\udfff"]}'}}, "structured_outputs"),
        ({"tools": [{"type": "function", "function": {"name": "f",
          "parameters": {"type": "object", "description": "\udfff"}}}]},
         "tools.0.function.parameters"),
        ({"structured_outputs": {"json": {"type": "string", "maxLength": 2**64}}},
         "structured_outputs"),
        ({"structured_outputs": {"json": {"type": "number", "minimum": float("nan")}}},
         "structured_outputs"),
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "big", "schema": {
          "type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(20_000)}}}}},
         "response_format.json_schema"),
    ],
)  # fmt: skip
def test_bad_constraints_are_400s_naming_the_field(server, body, param):
    r = chat(server, **body)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and error["type"] == "invalid_request_error"
    server.wait_idle()
    assert not server.engine.core.has_unfinished_requests()


def test_constrained_completion_and_chat(server):
    r = httpx.post(server.url + "/v1/completions", json={
        "prompt": "x", "max_tokens": 20, "temperature": 1.0, "seed": 2,
        "structured_outputs": {"choice": ["left", "right"]}}, timeout=60)  # fmt: skip
    assert r.status_code == 200 and r.json()["choices"][0]["text"] in ("left", "right")
    r = chat(server, response_format={"type": "json_object"}, temperature=1.0, seed=1,
             max_tokens=200)  # fmt: skip
    choice = r.json()["choices"][0]
    if choice["finish_reason"] == "stop":
        assert isinstance(json.loads(choice["message"]["content"]), dict)
    else:  # the tiny model may ramble until max_tokens: then it is a prefix
        assert choice["finish_reason"] == "length" and choice["message"]["content"][0] == "{"


def test_required_tool_call_shapes(server):
    r = chat(server, tools=[WEATHER], tool_choice="required", temperature=1.0, seed=5,
             max_tokens=100, parallel_tool_calls=False)  # fmt: skip
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] is None
    (call,) = choice["message"]["tool_calls"]
    assert call["type"] == "function" and call["id"].startswith("call_")
    assert call["function"]["name"] == "get_weather"
    assert set(json.loads(call["function"]["arguments"])) == {"city"}
    p.ChatCompletionResponse.model_validate(r.json())


def test_named_tool_call_streams_name_then_arguments(server):
    body = {"messages": USER, "tools": [WEATHER], "stream": True, "temperature": 1.0, "seed": 3,
            "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
            "max_tokens": 100}  # fmt: skip
    with httpx.stream("POST", server.url + "/v1/chat/completions", json=body, timeout=60) as r:
        events = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    deltas = [c["choices"][0]["delta"] for c in chunks]
    assert deltas[0] == {"role": "assistant", "content": ""}
    calls = [d["tool_calls"][0] for d in deltas if "tool_calls" in d]
    assert calls[0]["id"].startswith("call_") and calls[0]["type"] == "function"
    assert calls[0]["function"]["name"] == "get_weather"
    assert all(set(c) == {"index", "function"} and c["index"] == 0 for c in calls[1:])
    arguments = "".join(c["function"]["arguments"] for c in calls)
    assert set(json.loads(arguments)) == {"city"}
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
    assert not any(d.get("content") for d in deltas)


def test_array_items_are_returned_only_once_complete():
    text = '[{"name": "a", "arguments": {"x": [1, "]"]}}, {"name": "b", "argu'
    assert tc._array_items(text) == ([{"name": "a", "arguments": {"x": [1, "]"]}}],
                                     '{"name": "b", "argu')  # fmt: skip
    assert tc._array_items(text + 'ments": {}}]')[0][1] == {"name": "b", "arguments": {}}
    assert tc._array_items("") == ([], "") and tc._array_items("[") == ([], "")


CUT = '[{"name": "a", "arguments": {"x": 1}}, {"name": "get_weather", "arguments": {"city": "Pa'


@pytest.mark.parametrize(("mode", "text", "expected"), [
    ("required", CUT, [("a", '{"x": 1}'), ("get_weather", '{"city": "Pa')]),
    ("required", '[{"name": "get_wea', []),  # cut inside the name: no call, and no wrapper
    ("named", '{"city": "Pa', [("get_weather", '{"city": "Pa')]),
])  # fmt: skip
def test_a_call_cut_by_max_tokens_is_a_call_whole_and_streamed_alike(mode, text, expected):
    content, whole = tc.parse_tool_calls(mode, text, "get_weather")
    assert content is None
    assert [(c.function.name, c.function.arguments) for c in whole] == expected
    stream, streamed = tc.ToolCallStream(mode, "get_weather"), {}
    for end in range(1, len(text) + 1):  # one character a step, then the cut
        for d in stream.feed(text[:end], finished=end == len(text))[1]:
            name, args = streamed.get(d.index, (None, ""))
            streamed[d.index] = (name or d.function.name, args + (d.function.arguments or ""))
    assert [streamed[i] for i in sorted(streamed)] == expected


def test_a_named_call_cut_by_max_tokens_comes_back_in_tool_calls(server):
    r = chat(server, tools=[WEATHER], max_tokens=3, temperature=1.0, seed=1,
             tool_choice={"type": "function", "function": {"name": "get_weather"}})  # fmt: skip
    choice = r.json()["choices"][0]
    assert choice["finish_reason"] == "length" and choice["message"]["content"] is None
    (call,) = choice["message"]["tool_calls"]
    assert call["function"]["name"] == "get_weather" and call["function"]["arguments"]


def test_hermes_blocks_split_from_content_and_partial_tags_held_back():
    text = 'Sure. <tool_call>{"name": "f", "arguments": {"a": 1}}</tool_call> Done <tool'
    content, calls, _ = tool_parsers.hermes(text, final=False)
    assert content == "Sure.  Done " and [c.function.name for c in calls] == ["f"]
    assert json.loads(calls[0].function.arguments) == {"a": 1}
    assert tool_parsers.hermes(text, final=True)[0] == "Sure.  Done <tool"
    content, calls, _ = tool_parsers.hermes("a <tool_call>not json</tool_call>", final=True)
    assert content == "a <tool_call>not json</tool_call>" and not calls
    assert tc.parse_tool_calls("auto", "no calls here", None) == ("no calls here", [])


def test_auto_stream_feeds_content_then_calls():
    stream = tc.ToolCallStream("auto")
    pieces = ["Hi <", "tool_call>", '{"name": "f", "arguments": {}}', "</tool_call>", " bye"]
    text, content, calls = "", "", []
    for i, piece in enumerate(pieces):
        text += piece
        new_content, deltas = stream.feed(text, finished=i == len(pieces) - 1)
        content += new_content
        calls += deltas
    assert content == "Hi  bye"
    assert [(d.index, d.function.name, d.function.arguments) for d in calls] == [(0, "f", "{}")]
    assert tc.finish_reason("auto", stream.num_calls, "stop") == "tool_calls"
    assert tc.finish_reason("auto", 0, "stop") == "stop"
    assert tc.finish_reason("named", 1, "stop") == "stop"
