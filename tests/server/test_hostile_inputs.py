"""Hostile requests, each expecting its 4xx with OpenAI's error body; the server keeps serving.

Each of these once killed the engine, got a 500, or was accepted when it should not have been.
"""

from __future__ import annotations

import json

import httpx
import pytest

from inflight.engine.async_engine import AsyncLLM
from tests.server.live import LiveServer

MODEL = "tiny"
OK = {"model": MODEL, "prompt": "The quick", "max_tokens": 2}
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
VOCAB = 400  # the tiny tokenizer's


@pytest.fixture(scope="module")
def server(tiny_llama):
    engine = AsyncLLM(str(tiny_llama), dtype="float32", max_model_len=128, num_kv_blocks=64,
                      scheduling_policy="priority", max_queued_requests=64)  # fmt: skip
    assert engine.core.arch.vocab_size == VOCAB
    with LiveServer(engine, served_model_name=MODEL, max_body_bytes=64 * 1024) as s:
        yield s


def raw(body: dict, **replacements: str) -> bytes:
    """JSON text with placeholders replaced by what json.dumps will not write (NaN, \\ud800)."""
    text = json.dumps(body)
    for placeholder, value in replacements.items():
        text = text.replace(json.dumps(placeholder), value)
    return text.encode()


C, H = "/v1/completions", "/v1/chat/completions"
CASES = [
    # integers past what the engine can hold
    (C, {**OK, "seed": 2**64}, 400, "seed"),
    (C, {**OK, "seed": -(2**63) - 1}, 400, "seed"),
    (C, {**OK, "seed": 2**64 - 1, "n": 2}, 400, "seed"),  # the second choice's seed overflows
    (H, {**CHAT, "seed": 2**64}, 400, "seed"),
    (C, {**OK, "top_k": 2**63}, 400, "top_k"),
    (C, {**OK, "top_k": VOCAB + 1}, 400, "top_k"),
    (C, {**OK, "priority": 10**400}, 400, "priority"),
    (C, {**OK, "max_tokens": 2**63}, 400, "max_tokens"),
    (C, {**OK, "max_tokens": 2**62}, 400, "max_tokens"),  # past the context
    (C, {**OK, "min_tokens": 5, "max_tokens": 2}, 400, "min_tokens"),
    (C, {**OK, "n": 10**6}, 400, "n"),
    (C, {**OK, "logprobs": 2**64}, 400, "logprobs"),
    (C, {**OK, "best_of": 2}, 400, "best_of"),  # never silently ignored
    # token ids outside the vocabulary
    (C, {**OK, "prompt": [VOCAB]}, 400, "prompt"),
    (C, {**OK, "prompt": [-1]}, 400, "prompt"),
    (C, {**OK, "prompt": [[1, 2], [2**64]]}, 400, "prompt"),
    (C, {**OK, "stop_token_ids": [VOCAB]}, 400, "stop_token_ids"),
    (C, {**OK, "logit_bias": {str(VOCAB): 1}}, 400, "logit_bias"),
    (C, {**OK, "logit_bias": {"not a token": 1}}, 400, "logit_bias"),
    (C, {**OK, "logit_bias": {"5": 1e9}}, 400, "logit_bias.5"),
    ("/detokenize", {"tokens": [VOCAB]}, 400, "tokens"),
    ("/detokenize", {"tokens": [2**64]}, 400, "tokens.0"),
    # floats: denormals, zero in float32, non-finite
    (C, {**OK, "repetition_penalty": 5e-324}, 400, "repetition_penalty"),
    (C, {**OK, "top_p": 1e-46}, 400, "top_p"),
    (C, raw({**OK, "repetition_penalty": "inf"}, inf="Infinity"), 400, "repetition_penalty"),
    (C, raw({**OK, "temperature": "nan"}, nan="NaN"), 400, "temperature"),
    (C, raw({**OK, "presence_penalty": "-inf"}, **{"-inf": "-Infinity"}), 400, "presence_penalty"),
    # types: booleans are JSON booleans, integers are integers
    (C, {**OK, "stream": "yes"}, 400, "stream"),
    (C, {**OK, "echo": 1}, 400, "echo"),
    (H, {**CHAT, "logprobs": "true"}, 400, "logprobs"),
    (C, {**OK, "stream_options": {"include_usage": "yes"}}, 400, "stream_options.include_usage"),
    (C, {**OK, "max_tokens": "16"}, 400, "max_tokens"),
    (C, {**OK, "n": 2.5}, 400, "n"),
    # strings must be valid Unicode
    (C, raw({**OK, "prompt": "S"}, S='"\\ud800"'), 400, "prompt"),
    (
        H,
        raw({**CHAT, "messages": [{"role": "user", "content": "S"}]}, S='"a\\udfff"'),
        400,
        "messages.0.content",
    ),
    (C, raw({**OK, "stop": "S"}, S='"\\ud800"'), 400, "stop"),
    (C, {**OK, "stop": ["x"] * 65}, 400, "stop"),  # checked on every token: bounded
    (C, {**OK, "stop": "x" * 1025}, 400, "stop"),
    (C, {**OK, "stop_token_ids": [1] * 1025}, 400, "stop_token_ids"),
    ("/tokenize", raw({"prompt": "S"}, S='"\\ud800"'), 400, "prompt"),
    # bodies that are not JSON
    (C, b"{" * 10 + b"[" * 50_000, 400, None),  # deep nesting
    (C, b'{"prompt": "\xff\xfe", "max_tokens": 2}', 400, None),  # not UTF-8
    (C, b"", 400, None),
    (C, b"[]", 400, None),
    # a prompt longer than any text that fits the context, refused before tokenizing
    ("/tokenize", {"prompt": "word " * 12_000}, 400, "prompt"),
    (C, {**OK, "prompt": "word " * 12_000}, 400, "prompt"),
]


@pytest.mark.parametrize(("path", "body", "status", "param"), CASES)
def test_hostile_request_gets_its_4xx(server, path, body, status, param):
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    r = httpx.post(server.url + path, content=content, timeout=30,
                   headers={"content-type": "application/json"})  # fmt: skip
    assert r.status_code == status, r.text
    error = r.json()["error"]
    context = param == "max_tokens" and "maximum context length" in error["message"]
    assert error["type"] == "invalid_request_error"
    # refusals that depend on the model or join fields carry a code (`schemathesis_checks`)
    assert error["code"] in (("context_length_exceeded",) if context else
                             (None, "outside_vocabulary", "invalid_combination"))  # fmt: skip
    assert error["param"] == param, error
    assert httpx.get(server.url + "/health").status_code == 200


@pytest.mark.parametrize("name", ["not_an_openai_field", "\\ud800", "x" * 5000, "a\\nb"])
def test_unknown_fields_are_400s_that_echo_no_hostile_name(server, name):
    text = json.dumps({**OK}).removesuffix("}") + f', "{name}": {{"x": 1}}}}'
    r = httpx.post(server.url + C, content=text, timeout=30,
                   headers={"content-type": "application/json"})  # fmt: skip
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    if name != "\\ud800":  # a lone surrogate fails as the body's text, before any field
        assert error["message"].startswith("Unrecognized request argument supplied: ")
        assert len(error["param"]) <= 80 and error["param"].isprintable()
    assert httpx.get(server.url + "/health").status_code == 200


def test_bodies_over_the_limit_are_413_declared_or_chunked(server):
    big = json.dumps({**OK, "prompt": "x" * 70_000}).encode()
    declared = httpx.post(server.url + C, content=big, timeout=30)
    assert declared.status_code == 413
    chunked = httpx.post(server.url + C, content=iter([big[:40_000], big[40_000:]]), timeout=30)
    assert "content-length" not in chunked.request.headers
    assert chunked.status_code == 413, chunked.text
    assert chunked.json()["error"]["code"] == "request_too_large"


def test_wrong_method_is_405_with_allow(server):
    r = httpx.put(server.url + C, json=OK)
    assert r.status_code == 405 and r.headers["allow"] == "POST"
    assert r.json()["error"]["type"] == "invalid_request_error"
    # a path with two routes names both (Starlette alone names the first)
    r = httpx.put(server.url + "/v1/responses/resp_x")
    assert r.status_code == 405 and r.headers["allow"] == "GET, DELETE"


def test_a_foreign_host_header_is_refused_without_a_key(server):
    """DNS rebinding: a page on evil.example resolving to 127.0.0.1 reaches a loopback server."""
    r = httpx.get(server.url + "/v1/models", headers={"host": "evil.example"})
    assert r.status_code == 400 and "Host header" in r.json()["error"]["message"]
    assert httpx.get(server.url + "/v1/models", headers={"host": "localhost:1"}).status_code == 200


def test_metrics_show_no_file_system_paths(server, tiny_llama):
    text = httpx.get(server.url + "/metrics").text
    assert str(tiny_llama.parent) not in text and 'model="' + tiny_llama.name + '"' in text
