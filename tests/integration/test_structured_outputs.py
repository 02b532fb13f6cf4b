"""Structured outputs and tool calls on the default model, through the official `openai` client.

Sampled at temperature 1 with seeds (so a failure replays), 32 requests at once: the grammar, not
the model, is what makes every answer valid.
"""

from __future__ import annotations

import asyncio
import json
import re
from enum import StrEnum

import jsonschema
import openai
import pytest
from pydantic import BaseModel, Field

from inflight.engine.async_engine import AsyncLLM
from tests.server.live import LiveServer

pytestmark = pytest.mark.integration
MODEL = "smollm2"


class Color(StrEnum):
    RED = "red"
    GREEN = "green"
    BLUE = "blue"


class Address(BaseModel):
    city: str = Field(max_length=24)
    zip_code: int = Field(ge=10000, le=99999)


class Pet(BaseModel):
    name: str = Field(max_length=16)
    age: int = Field(ge=0, le=30)


class Person(BaseModel):
    name: str = Field(max_length=24)
    height_m: float = Field(ge=0.5, le=2.5)
    favorite: Color
    address: Address
    pets: list[Pet] = Field(max_length=3)


WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 24},
                "unit": {"enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city", "unit"],
        },
    },
}
TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "parameters": {
            "type": "object",
            "properties": {"timezone": {"type": "string", "maxLength": 24}},
            "required": ["timezone"],
        },
    },
}
ASK_WEATHER = [{"role": "user", "content": "What is the weather like in Paris?"}]


@pytest.fixture(scope="module")
def server(default_model):
    engine = AsyncLLM(max_num_seqs=64, kv_cache_memory_bytes=512 * 2**20)
    with LiveServer(engine, served_model_name=MODEL) as s:
        yield s


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


@pytest.mark.slow
def test_32_concurrent_parse_with_a_nested_schema(server):
    client = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)

    async def one(seed: int):
        return await client.beta.chat.completions.parse(
            model=MODEL,
            messages=[{"role": "user", "content": "Invent a person and describe them."}],
            response_format=Person,
            temperature=1.0,
            seed=seed,
            max_tokens=400,
        )

    async def all_of_them():
        return await asyncio.gather(*(one(seed) for seed in range(32)))

    completions = asyncio.run(all_of_them())
    schema = Person.model_json_schema()
    people = []
    for completion in completions:
        choice = completion.choices[0]
        assert choice.finish_reason == "stop"
        person = choice.message.parsed
        assert isinstance(person, Person)  # parsed by the client, so validated by pydantic
        jsonschema.validate(json.loads(choice.message.content), schema)
        people.append(person)
    assert len({p.model_dump_json() for p in people}) > 16  # sampled, not one fixed answer


def test_regex_choice_and_grammar_hold(client):
    for seed in range(4):
        r = client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "Give me a phone number."}],
            temperature=1.0, seed=seed, max_tokens=30,
            extra_body={"structured_outputs": {"regex": r"\+33 [1-9]( \d\d){4}"}},
        )  # fmt: skip
        assert re.fullmatch(r"\+33 [1-9]( \d\d){4}", r.choices[0].message.content)
        r = client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "Is the sky blue?"}],
            temperature=1.0, seed=seed, max_tokens=10,
            extra_body={"structured_outputs": {"choice": ["yes", "no", "it depends"]}},
        )  # fmt: skip
        assert r.choices[0].message.content in ("yes", "no", "it depends")
        grammar = 'root ::= "[" [0-9] ("," [0-9]){0,3} "]"'
        r = client.completions.create(
            model=MODEL, prompt="Count:", temperature=1.0, seed=seed, max_tokens=30,
            extra_body={"structured_outputs": {"grammar": grammar}},
        )  # fmt: skip
        assert re.fullmatch(r"\[\d(,\d){0,3}\]", r.choices[0].text)


def test_a_grammar_cut_by_max_tokens_ends_with_length_and_what_was_generated(client):
    r = client.completions.create(
        model=MODEL, prompt="Count:", temperature=1.0, seed=0, max_tokens=6,
        extra_body={"structured_outputs": {"grammar": 'root ::= "[" [0-9] ("," [0-9])* "]"'}},
    )  # fmt: skip
    assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 6
    assert re.fullmatch(r"\[\d(,\d?)*", r.choices[0].text)


def test_json_object_mode_returns_an_object(client):
    """The grammar lets a sample end only where its object is complete: every sample that
    stops is a JSON object, every one cut by max_tokens the start of one. (The small model
    loops inside its object in about half of the samples, so several seeds are drawn.)"""
    stopped = 0
    for seed in range(6):
        r = client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "Describe a cat in JSON."}],
            response_format={"type": "json_object"}, temperature=0.7, seed=seed, max_tokens=300,
        )  # fmt: skip
        content = r.choices[0].message.content
        if r.choices[0].finish_reason == "stop":
            assert isinstance(json.loads(content), dict)
            stopped += 1
        else:
            assert r.choices[0].finish_reason == "length" and content.lstrip().startswith("{")
    assert stopped >= 1


def _check_call(call, names):
    assert call.type == "function" and call.id.startswith("call_")
    assert call.function.name in names
    arguments = json.loads(call.function.arguments)
    tool = {"get_weather": WEATHER, "get_time": TIME}[call.function.name]
    jsonschema.validate(arguments, tool["function"]["parameters"])


@pytest.mark.parametrize(
    "tool_choice", ["required", {"type": "function", "function": {"name": "get_weather"}}]
)
def test_tool_calls_validate_whole_and_streamed(client, tool_choice):
    kwargs = dict(model=MODEL, messages=ASK_WEATHER, tools=[WEATHER, TIME],
                  tool_choice=tool_choice, temperature=0, max_tokens=200)  # fmt: skip
    whole = client.chat.completions.create(**kwargs)
    choice = whole.choices[0]
    named = isinstance(tool_choice, dict)
    assert choice.finish_reason == ("stop" if named else "tool_calls")
    assert choice.message.content is None and choice.message.tool_calls
    for call in choice.message.tool_calls:
        _check_call(call, ["get_weather"] if named else ["get_weather", "get_time"])

    # The stream carries the same calls, in OpenAI's chunk shapes; the SDK's accumulator
    # rebuilds them.
    with client.beta.chat.completions.stream(**kwargs) as stream:
        for _ in stream:
            pass
        final = stream.get_final_completion()
    streamed = final.choices[0]
    assert streamed.finish_reason == choice.finish_reason
    assert [(c.function.name, c.function.arguments) for c in streamed.message.tool_calls] == [
        (c.function.name, c.function.arguments) for c in choice.message.tool_calls
    ]


def test_auto_parses_hermes_tool_call_blocks(client):
    """SmolLM2's template does not ask for tool calls, so a regex makes the model write a
    Hermes-style block; `auto` turns it into a call, whole and streamed."""
    call = {"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}
    regex = "Let me check\\. " + re.escape(f"<tool_call>{json.dumps(call)}</tool_call>")
    kwargs = dict(model=MODEL, messages=ASK_WEATHER, tools=[WEATHER], tool_choice="auto",
                  temperature=0, max_tokens=100,
                  extra_body={"structured_outputs": {"regex": regex}})  # fmt: skip
    r = client.chat.completions.create(**kwargs)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content == "Let me check."
    (call,) = choice.message.tool_calls
    assert json.loads(call.function.arguments) == {"city": "Paris", "unit": "celsius"}

    chunks = list(client.chat.completions.create(**kwargs, stream=True))
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    calls = [t for c in chunks if c.choices for t in c.choices[0].delta.tool_calls or []]
    assert content == "Let me check. " and [t.function.name for t in calls] == ["get_weather"]
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
