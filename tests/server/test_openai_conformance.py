"""Every route's answers against OpenAI's own published OpenAPI document: whole responses,
each streamed chunk or event, and error bodies, on the tiny model. The schemas are the part of
the document these routes answer with (`data/openai_openapi_subset.json`, written from
https://github.com/openai/openai-openapi by `scripts/openai_spec_subset.py`; MIT licence beside
it). Where the document still marks a schema `nullable: true` (an OpenAPI 3.0 keyword its 3.1
validators ignore), null is allowed there, as the document means."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from jsonschema import Draft202012Validator

from inflight.engine.async_engine import AsyncLLM
from tests.server.live import LiveServer

SPEC = Path(__file__).parent / "data" / "openai_openapi_subset.json"
WEATHER_TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string", "maxLength": 8}},
    "required": ["city"]}}}  # fmt: skip


def _nullable_as_3_1(node: Any) -> Any:
    if isinstance(node, dict):
        node = {k: _nullable_as_3_1(v) for k, v in node.items()}
        if node.pop("nullable", False):
            return {"anyOf": [node, {"type": "null"}]}
        return node
    if isinstance(node, list):
        return [_nullable_as_3_1(v) for v in node]
    return node


@pytest.fixture(scope="module")
def spec() -> dict[str, Any]:
    document = json.loads(SPEC.read_text())
    return {"components": _nullable_as_3_1(document["components"])}


_validators: dict[tuple[int, str], Draft202012Validator] = {}


def conforms(spec: dict[str, Any], schema: str, body: Any) -> None:
    key = (id(spec), schema)  # a spec lives as long as its module's fixture or cache
    if key not in _validators:
        _validators[key] = Draft202012Validator({"$ref": f"#/components/schemas/{schema}", **spec})
    validator = _validators[key]
    errors = sorted(validator.iter_errors(body), key=lambda e: list(e.absolute_path))
    assert not errors, "\n".join(
        f"{schema} at {list(e.absolute_path)}: {e.message[:300]}" for e in errors[:5]
    )


@pytest.fixture(scope="module")
def server(tiny_llama):
    engine = AsyncLLM(str(tiny_llama), dtype="float32", max_model_len=256, num_kv_blocks=64)
    with LiveServer(engine, served_model_name="tiny") as s:
        yield s


def post(server, path: str, body: dict[str, Any], status: int = 200) -> Any:
    r = httpx.post(server.url + path, json={"model": "tiny", **body}, timeout=60)
    assert r.status_code == status, r.text
    return r.json()


def stream(server, path: str, body: dict[str, Any]) -> list[Any]:
    with httpx.stream("POST", server.url + path, json={"model": "tiny", **body, "stream": True},
                      timeout=60) as r:  # fmt: skip
        assert r.status_code == 200
        data = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    assert data[-1] == "[DONE]"
    return [json.loads(d) for d in data[:-1]]


GREEDY = {"max_tokens": 6, "temperature": 0, "ignore_eos": True}
MESSAGES = [{"role": "user", "content": "Hello there"}]
CHATS = {
    "plain": {"messages": MESSAGES, **GREEDY},
    "logprobs_n": {"messages": MESSAGES, "max_tokens": 4, "n": 2, "seed": 3, "logprobs": True,
                   "top_logprobs": 2},
    "named_tool": {"messages": MESSAGES, "max_tokens": 24, "tools": [WEATHER_TOOL],
                   "tool_choice": {"type": "function", "function": {"name": "get_weather"}}},
    "json_schema": {"messages": MESSAGES, "max_tokens": 24, "response_format": {
        "type": "json_schema", "json_schema": {"name": "x", "schema": {
            "type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}}}},
    "stopped_by_length": {"messages": MESSAGES, "max_tokens": 1},
}  # fmt: skip


@pytest.mark.parametrize("case", list(CHATS))
def test_chat_completions_whole_and_streamed(server, spec, case):
    body = CHATS[case]
    conforms(spec, "CreateChatCompletionResponse", post(server, "/v1/chat/completions", body))
    chunks = stream(server, "/v1/chat/completions",
                    {**body, "stream_options": {"include_usage": True}})  # fmt: skip
    assert chunks[-1]["usage"] is not None
    for chunk in chunks:
        conforms(spec, "CreateChatCompletionStreamResponse", chunk)


COMPLETIONS = {
    "plain": {"prompt": "The quick", **GREEDY},
    "echo_logprobs": {"prompt": "The quick", "echo": True, "logprobs": 2, **GREEDY},
    "prompts_n": {"prompt": ["a b", "c d"], "n": 2, "seed": 1, "max_tokens": 3},
}


def _or_null(schema: dict[str, Any]) -> dict[str, Any]:
    return {"anyOf": [schema, {"type": "null"}]}


_patched: dict[tuple[int, bool], dict[str, Any]] = {}


def _completion_schema(spec: dict[str, Any], streamed: bool) -> dict[str, Any]:
    if (id(spec), streamed) not in _patched:
        _patched[id(spec), streamed] = _patched_completion_schema(spec, streamed)
    return _patched[id(spec), streamed]


def _patched_completion_schema(spec: dict[str, Any], streamed: bool) -> dict[str, Any]:
    """The legacy completions schema where OpenAI's API answers what the document does not
    foresee, and clients rely on it: with `echo`, the first prompt token's `token_logprobs`
    and `top_logprobs` are null (nothing before it scores it; lm-eval-harness skips it); and
    streamed chunks, given the whole response's shape, carry `finish_reason` null until a
    choice ends. Those fields may be null; nothing else changes."""
    patched = json.loads(json.dumps(spec))
    schema = patched["components"]["schemas"]["CreateCompletionResponse"]
    choice = schema["properties"]["choices"]["items"]["properties"]
    logprobs = choice["logprobs"]["anyOf"][0]["properties"]
    for name in ("token_logprobs", "top_logprobs"):
        logprobs[name]["items"] = _or_null(logprobs[name]["items"])
    if streamed:
        choice["finish_reason"] = _or_null(choice["finish_reason"])
    return patched


@pytest.mark.parametrize("case", list(COMPLETIONS))
def test_completions_whole_and_streamed(server, spec, case):
    body = COMPLETIONS[case]
    whole = post(server, "/v1/completions", body)
    conforms(_completion_schema(spec, streamed=False), "CreateCompletionResponse", whole)
    streamed = {**body, "stream_options": {"include_usage": True}}
    if body.get("echo"):  # echo streams with n = 1 only, as here
        streamed["n"] = 1
    chunks = stream(server, "/v1/completions", streamed)
    assert chunks[-1]["usage"] is not None and chunks[-1]["choices"] == []
    for chunk in chunks:
        conforms(_completion_schema(spec, streamed=True), "CreateCompletionResponse", chunk)


def test_models_list_and_retrieve(server, spec):
    conforms(spec, "ListModelsResponse", httpx.get(server.url + "/v1/models").json())
    conforms(spec, "Model", httpx.get(server.url + "/v1/models/tiny").json())


@pytest.mark.parametrize(
    ("method", "path", "body", "status"),
    [
        ("POST", "/v1/chat/completions", {"model": "nope", "messages": MESSAGES}, 404),
        (
            "POST",
            "/v1/chat/completions",
            {"model": "tiny", "messages": MESSAGES, "temprature": 1},
            400,
        ),
        ("POST", "/v1/completions", {"model": "tiny", "prompt": "x", "max_tokens": 2**64}, 400),
        ("POST", "/v1/completions", {"model": "tiny", "prompt": "x" * 5000}, 400),
        ("POST", "/v1/responses", {"model": "tiny", "input": []}, 400),
        ("GET", "/v1/models/nope", None, 404),
        ("GET", "/v1/responses/resp_nope", None, 404),
        ("GET", "/v1/nothing/here", None, 404),
        ("DELETE", "/v1/chat/completions", None, 405),
    ],
)
def test_errors_are_openai_error_objects(server, spec, method, path, body, status):
    r = httpx.request(method, server.url + path, json=body, timeout=60)
    assert r.status_code == status, r.text
    conforms(spec, "ErrorResponse", r.json())


RESPONSES = {
    "text": {"input": "Hello there", "max_output_tokens": 8},
    "instructions": {"input": [{"role": "user", "content": "Hi"}], "instructions": "Be brief",
                     "max_output_tokens": 4},
    "function_call": {"input": "weather?", "max_output_tokens": 24, "tools": [
        {"type": "function", "name": "get_weather",
         "parameters": WEATHER_TOOL["function"]["parameters"]}],
        "tool_choice": {"type": "function", "name": "get_weather"}},
    "json_schema": {"input": "x", "max_output_tokens": 24, "store": False, "text": {"format": {
        "type": "json_schema", "name": "x", "schema": {
            "type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}}}},
}  # fmt: skip


def event_schemas(spec: dict[str, Any]) -> dict[str, str]:
    """Each stream event's `type` -> its schema's name (`ResponseStreamEvent` is a union of
    them; validating against the one named gives errors that say what is wrong)."""
    schemas = spec["components"]["schemas"]
    names = {}
    for option in schemas["ResponseStreamEvent"]["anyOf"]:
        name = option["$ref"].rsplit("/", 1)[-1]
        for event_type in schemas[name]["properties"]["type"]["enum"]:
            names[event_type] = name
    return names


@pytest.mark.parametrize("case", list(RESPONSES))
def test_responses_whole_and_streamed(server, spec, case):
    body = RESPONSES[case]
    conforms(spec, "Response", post(server, "/v1/responses", body))
    events = stream(server, "/v1/responses", body)
    assert events[0]["type"] == "response.created" and events[-1]["type"].startswith("response.")
    names = event_schemas(spec)
    for event in events:
        conforms(spec, names[event["type"]], event)
        conforms(spec, "ResponseStreamEvent", event)
