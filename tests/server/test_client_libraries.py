"""The server driven by client libraries nobody here wrote, called as their users call them:
litellm (its OpenAI-compatible provider) and langchain-openai (Chat Completions and the
Responses API): a chat, the same chat streamed, a named tool call and structured output. The
tiny model's text is noise; what must hold is the shape each library parses, and greedy
streams equal to the whole."""

from __future__ import annotations

import json
import os

import pytest

from inflight.engine.async_engine import AsyncLLM
from tests.server.live import LiveServer

KEY = "sk-test"
WEATHER = {"name": "get_weather", "description": "the weather in a city", "parameters": {
    "type": "object", "properties": {"city": {"type": "string", "maxLength": 8}},
    "required": ["city"], "additionalProperties": False}}  # fmt: skip
VERDICT = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
           "additionalProperties": False, "title": "Verdict"}  # fmt: skip
HI = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def server(tiny_llama):
    engine = AsyncLLM(str(tiny_llama), dtype="float32", max_model_len=256, num_kv_blocks=64)
    with LiveServer(engine, served_model_name="tiny", api_key=KEY) as s:
        yield s


def test_litellm(server):
    # imported here, not at the top: litellm takes ~9 s to import, in every worker's collection
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no fetch of its price table
    import litellm

    call = {"model": "openai/tiny", "api_base": server.url + "/v1", "api_key": KEY,
            "temperature": 0}  # fmt: skip
    whole = litellm.completion(messages=HI, max_tokens=6, **call)
    text = whole.choices[0].message.content
    assert whole.choices[0].finish_reason == "length" and whole.usage.completion_tokens == 6
    chunks = litellm.completion(messages=HI, max_tokens=6, stream=True, **call)
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == text
    named = litellm.completion(messages=HI, max_tokens=40, tools=[{"type": "function",
                               "function": WEATHER}], tool_choice={"type": "function",
                               "function": {"name": "get_weather"}}, **call)  # fmt: skip
    (tool_call,) = named.choices[0].message.tool_calls
    assert tool_call.function.name == "get_weather"
    assert set(json.loads(tool_call.function.arguments)) == {"city"}
    structured = litellm.completion(
        messages=HI,
        max_tokens=20,
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "verdict", "schema": VERDICT},
        },
        **call,
    )
    assert set(json.loads(structured.choices[0].message.content)) == {"ok"}


def test_langchain_openai(server):
    from langchain_openai import ChatOpenAI

    def chat(max_tokens: int, **options) -> ChatOpenAI:
        return ChatOpenAI(model="tiny", base_url=server.url + "/v1", api_key=KEY, temperature=0,
                          max_tokens=max_tokens, max_retries=0, **options)  # fmt: skip

    whole = chat(6).invoke("hi")
    assert whole.response_metadata["finish_reason"] == "length"
    assert "".join(chunk.content for chunk in chat(6).stream("hi")) == whole.content
    tools = chat(40).bind_tools([{"type": "function", "function": WEATHER}],
                                tool_choice="get_weather")  # fmt: skip
    (tool_call,) = tools.invoke("hi").tool_calls
    assert tool_call["name"] == "get_weather" and set(tool_call["args"]) == {"city"}
    verdict = chat(20).with_structured_output(VERDICT, method="json_schema").invoke("hi")
    assert set(verdict) == {"ok"}
    reply = chat(6, use_responses_api=True).invoke("hi")
    assert reply.response_metadata["id"].startswith("resp_") and reply.text == whole.content
