"""The Responses API through the official client: text and item input, instructions, function
tools and their outputs, `text.format`, streaming in the spec's event order, continuations from
a stored response, and the store's bounds and per-key visibility. Every Response and event is
validated against openai-python's own types (generated from OpenAI's spec)."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

import httpx
import openai
import pytest
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

from inflight.engine.async_engine import AsyncLLM
from inflight.errors import InvalidRequestError
from inflight.model.generation_config import SamplingDefaults
from inflight.server import protocol as p
from inflight.server.response_store import ResponseStore
from inflight.server.responses import ResponsesServing
from inflight.server.responses_input import ResponsesRequest, input_messages
from tests.server.live import LiveServer, slow_steps

MODEL = "tiny"
KEY = "sk-test"
WEATHER = {"type": "function", "name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string", "maxLength": 8}},
    "required": ["city"]}}  # fmt: skip
EVENTS = TypeAdapter(ResponseStreamEvent)


@pytest.fixture(scope="module")
def server(tiny_llama):
    engine = AsyncLLM(str(tiny_llama), dtype="float32", max_model_len=256, num_kv_blocks=64)
    with LiveServer(engine, served_model_name=MODEL, api_key=KEY) as s:
        yield s


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0)


def raw(server, body, key=KEY, method="POST", path="/v1/responses") -> httpx.Response:
    """The body as JSON text, lone surrogates escaped as a hostile client would send them."""
    headers = {"authorization": f"Bearer {key}", "content-type": "application/json"}
    content = None if body is None else json.dumps(body)
    return httpx.request(method, server.url + path, content=content, headers=headers, timeout=60)


def test_text_input_gives_a_message_and_usage(client):
    r = client.responses.create(model=MODEL, input="hi", instructions="Be brief.",
                                max_output_tokens=4, temperature=0)  # fmt: skip
    Response.model_validate(r.model_dump())
    assert r.object == "response" and r.id.startswith("resp_") and r.model == MODEL
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    (message,) = r.output
    assert message.type == "message" and message.content[0].type == "output_text"
    assert r.output_text == message.content[0].text and r.usage.output_tokens == 4
    assert r.instructions == "Be brief."


def test_a_named_function_call_and_its_output_continue_the_conversation(client):
    first = client.responses.create(model=MODEL, input="weather?", tools=[WEATHER],
                                    tool_choice={"type": "function", "name": "get_weather"},
                                    max_output_tokens=40, temperature=0)  # fmt: skip
    (call,) = [item for item in first.output if item.type == "function_call"]
    assert call.name == "get_weather" and call.call_id.startswith("call_")
    second = client.responses.create(
        model=MODEL,
        previous_response_id=first.id,
        max_output_tokens=3,
        temperature=0,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}],
    )
    assert second.previous_response_id == first.id and second.output_text
    # the continuation saw the call and its output: more prompt than the new item alone
    assert second.usage.input_tokens > first.usage.input_tokens
    # and found the first turn's prompt blocks in the prefix cache
    cached = second.usage.input_tokens_details.cached_tokens
    assert 0 < cached <= first.usage.input_tokens and cached % 16 == 0


def test_text_format_json_schema_constrains_the_output(client):
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
              "additionalProperties": False}  # fmt: skip
    r = client.responses.create(
        model=MODEL,
        input="answer",
        max_output_tokens=30,
        temperature=0,
        text={"format": {"type": "json_schema", "name": "answer", "schema": schema}},
    )
    if r.status == "completed":  # a random model may ramble inside the string until the cap
        assert set(json.loads(r.output_text)) == {"ok"}
    assert r.output_text.startswith("{")


def test_streamed_events_in_the_spec_order_and_equal_to_the_whole(client):
    whole = client.responses.create(model=MODEL, input="hi", max_output_tokens=6, temperature=0)
    with client.responses.stream(model=MODEL, input="hi", max_output_tokens=6,
                                 temperature=0) as stream:  # fmt: skip
        events = list(stream)
    final = events[-1].response  # cut at max_output_tokens: `response.incomplete` ends it
    for e in events:
        EVENTS.validate_python(e.model_dump())
    kinds = [e.type for e in events]
    assert kinds[:4] == ["response.created", "response.in_progress",
                         "response.output_item.added", "response.content_part.added"]  # fmt: skip
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done",
                          "response.output_item.done", "response.incomplete"]  # fmt: skip
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == final.output_text == whole.output_text


def test_a_streamed_function_call_arrives_as_argument_deltas(client):
    with client.responses.stream(model=MODEL, input="weather?", tools=[WEATHER],
                                 tool_choice={"type": "function", "name": "get_weather"},
                                 max_output_tokens=40, temperature=0) as stream:  # fmt: skip
        events = list(stream)
    for e in events:
        EVENTS.validate_python(e.model_dump())
    added = [e.item for e in events if e.type == "response.output_item.added"]
    assert [i.type for i in added] == ["function_call"] and added[0].name == "get_weather"
    deltas = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    (done,) = [e for e in events if e.type == "response.function_call_arguments.done"]
    (call,) = events[-1].response.output
    assert deltas == done.arguments == call.arguments and call.call_id == added[0].call_id


def test_stored_responses_are_read_and_deleted_by_their_own_key_only(server, client):
    r = client.responses.create(model=MODEL, input="hi", max_output_tokens=2)
    assert client.responses.retrieve(r.id).id == r.id
    other = raw(server, None, key="sk-other", method="GET", path=f"/v1/responses/{r.id}")
    assert other.status_code == 401  # a key the server does not know
    client.responses.delete(r.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(r.id)
    unknown = raw(server, {"model": MODEL, "input": "x", "previous_response_id": "resp_nope"})
    assert unknown.status_code == 404
    assert unknown.json()["error"]["param"] == "previous_response_id"
    unstored = client.responses.create(model=MODEL, input="hi", max_output_tokens=2, store=False)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(unstored.id)


CALL = {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"}


@pytest.mark.parametrize(("body", "param"), [
    ({"input": [{"type": "input_image", "image_url": "x"}]}, "input.0"),
    ({"input": [{"role": "robot", "content": "x"}]}, "input.0.role"),
    ({"input": [{"role": "user", "content": [{"type": "input_audio"}]}]}, "input.0.content.0"),
    ({"input": "x", "tool_choice": {"type": "function", "name": "nope"}, "tools": [WEATHER]},
     "tool_choice"),
    ({"input": "x", "temprature": 1}, "temprature"),
    ({"input": "x", "background": True}, "background"),
    ({"input": "x", "max_output_tokens": 2**64}, "max_output_tokens"),
    # fields the chat request checks, named as the Responses request holds them
    ({"input": [{"role": "user", "content": [{"type": "input_text", "text": "\udfff"}]}]},
     "input.0.content"),
    ({"input": "x", "instructions": "\ud800"}, "instructions"),
    ({"input": [{"role": "user", "content": "a"}, CALL, {**CALL, "arguments": 5}]},
     "input.2.arguments"),
    ({"input": [{"role": "user", "content": "a"}, {**CALL, "call_id": 7}]}, "input.1.call_id"),
    ({"input": [{"type": "function_call_output", "call_id": "c1", "output": "\udc00"}]},
     "input.0.output"),
])  # fmt: skip
def test_bad_responses_requests_are_400s_naming_the_field(server, body, param):
    r = raw(server, {"model": MODEL, **body})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and "messages" not in error["message"], error
    assert httpx.get(server.url + "/health").status_code == 200


def test_the_store_is_bounded_by_count_bytes_and_owner():
    store = ResponseStore(max_count=2, max_bytes=10_000)
    for i in range(3):
        store.put("a", {"id": f"r{i}"}, [{"role": "user", "content": "x"}])
    assert len(store) == 2 and store.get("a", "r2")
    with pytest.raises(InvalidRequestError):
        store.get("a", "r0")  # evicted, oldest first
    with pytest.raises(InvalidRequestError):
        store.get("b", "r2")  # another owner's
    store.put("a", {"id": "big"}, [{"role": "user", "content": "x" * 6000}])
    store.put("a", {"id": "big2"}, [{"role": "user", "content": "x" * 6000}])
    assert len(store) == 1 and store.num_bytes <= 10_000
    store.put("a", {"id": "huge"}, [{"role": "user", "content": "x" * 20_000}])
    with pytest.raises(InvalidRequestError):
        store.get("a", "huge")  # over the whole budget: never kept, and nothing evicted for it
    assert store.get("a", "big2") and store.num_bytes <= 10_000


def test_parallel_function_calls_in_the_input_are_one_assistant_turn():
    messages = input_messages([
        {"role": "user", "content": [{"type": "input_text", "text": "two cities"}]},
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
        {"type": "function_call", "call_id": "c2", "name": "f", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "a"},
        {"type": "function_call_output", "call_id": "c2", "output": {"t": 1}},
    ])  # fmt: skip
    assert [m["role"] for m in messages] == ["user", "assistant", "tool", "tool"]
    assert [c["id"] for c in messages[1]["tool_calls"]] == ["c1", "c2"]
    assert messages[3]["content"] == '{"t": 1}'


def test_a_client_that_leaves_a_stream_aborts_its_request(tiny_llama):
    engine = AsyncLLM(str(tiny_llama), dtype="float32", max_model_len=256, num_kv_blocks=64)
    with LiveServer(engine, served_model_name=MODEL) as s:
        slow_steps(engine, 0.05)  # 200 tokens would take 10 s
        body = {"model": MODEL, "input": "hi", "max_output_tokens": 200, "stream": True}
        with httpx.stream("POST", s.url + "/v1/responses", json=body, timeout=30) as r:
            deltas = 0
            for line in r.iter_lines():
                deltas += '"response.output_text.delta"' in line
                if deltas == 3:
                    break  # and leave
        s.wait_idle(timeout=5)  # aborted within a step, not run to its 200 tokens
        pool = engine.core.kv_cache_manager.pool
        assert pool.num_free_blocks == pool.num_blocks


def test_thinking_streams_as_a_reasoning_summary_before_the_answer():
    """A chat stream that thinks, then answers: the reasoning item opens first, streams its
    summary and closes when the answer begins; the Response lists the items in that order."""

    async def chat_chunks():
        script = [
            ({"reasoning_content": "The user"}, None), ({"reasoning_content": " greets."}, None),
            ({"content": "Hello"}, None), ({"content": "!"}, "stop"),
        ]  # fmt: skip
        for delta, finish in script:
            yield {"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
        yield {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 6,
                                        "total_tokens": 9}}  # fmt: skip

    async def collect():
        engine = SimpleNamespace(sampling_defaults=SamplingDefaults())
        serving = ResponsesServing(
            SimpleNamespace(model_name=MODEL, engine=engine), ResponseStore()
        )
        req = ResponsesRequest(input="hi", store=False)
        chat_req = p.ChatCompletionRequest(messages=[{"role": "user", "content": "hi"}])
        return [e async for e in serving._events(req, "owner", chat_req, chat_chunks())]

    events = [EVENTS.validate_python(e) for e in asyncio.run(collect())]
    assert [e.type for e in events] == [
        "response.created", "response.in_progress",
        "response.output_item.added", "response.reasoning_summary_part.added",
        "response.reasoning_summary_text.delta", "response.reasoning_summary_text.delta",
        "response.reasoning_summary_text.done", "response.reasoning_summary_part.done",
        "response.output_item.done",
        "response.output_item.added", "response.content_part.added",
        "response.output_text.delta", "response.output_text.delta",
        "response.output_text.done", "response.content_part.done", "response.output_item.done",
        "response.completed",
    ]  # fmt: skip
    assert [e.output_index for e in events if e.type == "response.output_item.added"] == [0, 1]
    (summary_done,) = [e for e in events if e.type == "response.reasoning_summary_text.done"]
    assert summary_done.text == "The user greets."
    response = events[-1].response
    assert [item.type for item in response.output] == ["reasoning", "message"]
    assert response.output[0].summary[0].text == "The user greets."
    assert response.output_text == "Hello!"
