"""What a body may carry beyond the fields the handlers read, and the edges clients lean on:
`GET /v1/models/{id}`, `x-request-id`, CORS preflights. Unknown fields are OpenAI's 400 (a
misspelt `max_token` must not pass as another request), unsupported ones a 400 naming them,
ignorable ones and legacy `functions` accepted; the official client retrieves the model."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from inflight.engine.async_engine import AsyncLLM
from tests.server.live import LiveServer

MODEL = "tiny"
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
COMPLETION = {"model": MODEL, "prompt": "The quick", "max_tokens": 2}


@pytest.fixture(scope="module")
def server(tiny_llama):
    engine = AsyncLLM(str(tiny_llama), dtype="float32", max_model_len=128, num_kv_blocks=64)
    with LiveServer(engine, served_model_name=MODEL, allowed_origins=["https://app.example"]) as s:
        yield s


@pytest.fixture(scope="module")
def lenient(tiny_llama):
    engine = AsyncLLM(str(tiny_llama), dtype="float32", max_model_len=128, num_kv_blocks=64)
    with LiveServer(engine, served_model_name=MODEL, allow_unknown_fields=True) as s:
        yield s


def post(server, path, body, **kw) -> httpx.Response:
    return httpx.post(server.url + path, json=body, timeout=60, **kw)


def error_of(response: httpx.Response, status: int) -> dict:
    assert response.status_code == status, response.text
    return response.json()["error"]


@pytest.mark.parametrize(("path", "body"), [("/v1/chat/completions", CHAT),
                                            ("/v1/completions", COMPLETION)])  # fmt: skip
@pytest.mark.parametrize("field", ["max_token", "temprature"])
def test_a_misspelt_field_is_a_400_naming_it(server, path, body, field):
    error = error_of(post(server, path, {**body, field: 5}), 400)
    assert error["message"] == f"Unrecognized request argument supplied: {field}"
    assert error["param"] == field


@pytest.mark.parametrize(("path", "field", "value", "says"), [
    ("/v1/completions", "suffix", "end", "suffix"),
    ("/v1/chat/completions", "audio", {"voice": "alloy", "format": "wav"}, "audio"),
    ("/v1/chat/completions", "modalities", ["text", "audio"], "'audio'"),
    ("/v1/chat/completions", "web_search_options", {}, "web search"),
])  # fmt: skip
def test_fields_this_server_cannot_honour_are_400s_naming_them(server, path, field, value, says):
    body = COMPLETION if path == "/v1/completions" else CHAT
    error = error_of(post(server, path, {**body, field: value}), 400)
    assert error["param"] == field and says in error["message"]


def test_fields_openai_lets_a_server_ignore_are_accepted(server):
    ignorable = {"user": "u-1", "metadata": {"k": "v"}, "store": False, "service_tier": "auto",
                 "reasoning_effort": "low", "prediction": {"type": "content", "content": "x"},
                 "verbosity": "low", "safety_identifier": "s", "prompt_cache_key": "p",
                 "modalities": ["text"]}  # fmt: skip
    response = post(server, "/v1/chat/completions", {**CHAT, **ignorable})
    assert response.status_code == 200, response.text
    assert response.json()["usage"]["completion_tokens"] == 2


def test_allow_unknown_fields_accepts_extras(lenient):
    assert post(lenient, "/v1/completions", {**COMPLETION, "my_extra": 1}).status_code == 200
    # unsupported fields stay refused: accepting them would answer another question
    assert post(lenient, "/v1/completions", {**COMPLETION, "suffix": "x"}).status_code == 400


def test_legacy_functions_become_tools(server):
    weather = {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    }
    body = {**CHAT, "max_tokens": 40, "functions": [weather],
            "function_call": {"name": "get_weather"}}  # fmt: skip
    response = post(server, "/v1/chat/completions", body)
    assert response.status_code == 200, response.text
    calls = response.json()["choices"][0]["message"]["tool_calls"]  # whole or cut by max_tokens
    assert [c["function"]["name"] for c in calls] == ["get_weather"]
    both = {**body, "tools": [{"type": "function", "function": weather}]}
    error = error_of(post(server, "/v1/chat/completions", both), 400)
    assert "functions (legacy) and tools" in error["message"]


def test_the_official_client_retrieves_the_model(server):
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    model = client.models.retrieve(MODEL)
    assert model.id == MODEL and model.object == "model"
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gpt-4o")


def test_every_response_carries_a_request_id(server):
    mine = httpx.get(server.url + "/v1/models", headers={"x-request-id": "abc-123"})
    assert mine.headers["x-request-id"] == "abc-123"
    made = httpx.get(server.url + "/v1/models").headers["x-request-id"]
    other = httpx.get(server.url + "/v1/models").headers["x-request-id"]
    assert len(made) == 32 and made != other
    # an id that could forge log lines is replaced, and an error carries one too
    forged = httpx.get(server.url + "/v1/models", headers={"x-request-id": "a b\tc"})
    assert forged.headers["x-request-id"] != "a b\tc"
    assert "x-request-id" in post(server, "/v1/completions", {"prompt": 3}).headers


def test_cors_preflight_for_allowed_origins_only(server):
    preflight = {"Access-Control-Request-Method": "POST",
                 "Access-Control-Request-Headers": "authorization,content-type"}  # fmt: skip
    ok = httpx.options(server.url + "/v1/chat/completions",
                       headers={"Origin": "https://app.example", **preflight})  # fmt: skip
    assert ok.status_code == 200
    assert ok.headers["access-control-allow-origin"] == "https://app.example"
    refused = httpx.options(server.url + "/v1/chat/completions",
                            headers={"Origin": "https://evil.example", **preflight})  # fmt: skip
    assert "access-control-allow-origin" not in refused.headers
    answer = post(server, "/v1/completions", COMPLETION, headers={"Origin": "https://app.example"})
    assert answer.headers["access-control-allow-origin"] == "https://app.example"


def sse(server, path, body) -> list[dict]:
    with httpx.stream("POST", server.url + path, json={**body, "stream": True}, timeout=60) as r:
        lines = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    return [json.loads(line) for line in lines[:-1]]


def test_shapes_follow_openais_spec(server):
    """Nullable fields are present as null, optional ones absent, never null: code generated
    from the spec reads `finish_reason` on every chunk and iterates `tool_calls` if present."""
    whole = post(server, "/v1/chat/completions", {**CHAT, "logprobs": True}).json()
    message, logprobs = whole["choices"][0]["message"], whole["choices"][0]["logprobs"]
    assert message["refusal"] is None and "tool_calls" not in message
    assert logprobs["refusal"] is None and len(logprobs["content"]) == 2
    for chunk in sse(server, "/v1/chat/completions", CHAT):
        (choice,) = chunk["choices"]
        assert "finish_reason" in choice and None not in choice["delta"].values()
    for chunk in sse(server, "/v1/completions", COMPLETION):
        (choice,) = chunk["choices"]
        assert {"finish_reason", "logprobs", "text", "index"} <= set(choice)
