"""Every error of the HTTP API: status code and OpenAI-shaped body; the server keeps serving."""

from __future__ import annotations

import threading
import time

import httpx
import pytest

from inflight.engine.async_engine import AsyncLLM
from tests.server.live import LiveServer, slow_steps

MODEL = "tiny"


def engine_for(folder, **kwargs) -> AsyncLLM:
    return AsyncLLM(str(folder), dtype="float32", max_model_len=128, num_kv_blocks=64, **kwargs)


@pytest.fixture(scope="module")
def server(tiny_llama):
    with LiveServer(engine_for(tiny_llama), served_model_name=MODEL, max_body_bytes=4096) as s:
        yield s


def post(server, path, body, **kw):
    return httpx.post(server.url + path, json=body, timeout=60, **kw)


# OpenAI's error types: the caller's mistakes, rate limits, the server's failures
TYPES = {400: "invalid_request_error", 401: "invalid_request_error", 404: "invalid_request_error",
         408: "invalid_request_error", 413: "invalid_request_error", 429: "requests",
         500: "server_error", 503: "server_error"}  # fmt: skip


def assert_error(response, status, code, param=None, message=None):
    """OpenAI's error object: `type` by status, `code` a word or null, never a number."""
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == TYPES[status] and error["code"] == code
    assert error["param"] == param
    if message:
        assert message in error["message"]


def test_ok_then_errors_then_ok(server):
    body = {"model": MODEL, "prompt": "The quick", "max_tokens": 4, "temperature": 0}
    first = post(server, "/v1/completions", body)
    assert first.status_code == 200

    assert_error(post(server, "/v1/completions", {**body, "temperature": -1}), 400,
                 None, "temperature")  # fmt: skip
    assert_error(post(server, "/v1/completions", {**body, "max_tokens": "many"}), 400,
                 None, "max_tokens")  # fmt: skip
    assert_error(post(server, "/v1/completions", {"model": MODEL}), 400, None,
                 "prompt")  # fmt: skip
    assert_error(post(server, "/v1/completions", {**body, "prompt": ""}), 400,
                 None, "prompt", "at least 1")  # fmt: skip
    assert_error(post(server, "/v1/completions", {**body, "prompt": [5, 6], "max_tokens": 200}),
                 400,
                 "context_length_exceeded", "max_tokens",
                 "maximum context length is 128 tokens, but 202 were requested "
                 "(2 in the prompt, 200 for max_tokens)")  # fmt: skip
    assert_error(post(server, "/v1/completions", {**body, "model": "gpt-9"}), 404,
                 "model_not_found", "model", "'gpt-9' does not exist")  # fmt: skip
    assert_error(post(server, "/v1/chat/completions", {"model": MODEL, "messages": []}), 400,
                 None, "messages")  # fmt: skip
    assert_error(post(server, "/v1/chat/completions",
                      {"model": MODEL, "messages": [{"role": "user", "content": "hi"}],
                       "top_logprobs": 2}),
                 400, None, "top_logprobs")  # fmt: skip
    assert_error(post(server, "/v1/completions", {**body, "prompt": "x" * 5000}), 413,
                 "request_too_large", None, "exceeds 4096 bytes")  # fmt: skip
    assert_error(post(server, "/detokenize", {"tokens": [10**7]}), 400, "outside_vocabulary",
                 "tokens")  # fmt: skip
    not_json = httpx.post(server.url + "/v1/completions", content=b"{nope", timeout=10,
                          headers={"content-type": "application/json"})  # fmt: skip
    assert_error(not_json, 400, None, None, "not valid JSON (at character 1")

    again = post(server, "/v1/completions", body)
    assert again.status_code == 200
    assert again.json()["choices"][0]["text"] == first.json()["choices"][0]["text"]
    server.wait_idle()
    assert server.engine.core.kv_cache_manager.pool.num_used_blocks == 0


def test_api_key_guards_every_v1_and_tokenizer_route(tiny_llama):
    with LiveServer(engine_for(tiny_llama), served_model_name=MODEL, api_key="s3cret") as s:
        routes = [("post", "/v1/completions", {"prompt": "hi", "max_tokens": 1}),
                  ("post", "/v1/chat/completions",
                   {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}),
                  ("get", "/v1/models", None), ("post", "/tokenize", {"prompt": "hi"}),
                  ("post", "/detokenize", {"tokens": [5]})]  # fmt: skip
        for method, path, body in routes:
            for headers in ({}, {"Authorization": "Bearer wrong"}):
                r = httpx.request(method, s.url + path, json=body, headers=headers, timeout=30)
                assert_error(r, 401, "invalid_api_key")
            ok = httpx.request(method, s.url + path, json=body, timeout=30,
                               headers={"Authorization": "Bearer s3cret"})  # fmt: skip
            assert ok.status_code == 200, (path, ok.text)
        assert httpx.get(s.url + "/health").status_code == 200  # open routes stay open
        assert httpx.get(s.url + "/metrics").status_code == 200


def test_queue_full_is_429_with_retry_after(tiny_llama):
    engine = engine_for(tiny_llama, max_queued_requests=1, max_num_seqs=1)
    with LiveServer(engine, served_model_name=MODEL) as s:
        # The engine thread runs the first step, then holds: the first request keeps the only
        # seat and the state cannot drift while the test asks.
        release, step, calls = threading.Event(), engine.core.step, []

        def held_step():
            calls.append(1)
            if len(calls) > 1:
                release.wait(30)
            return step()

        engine.core.step = held_step
        long = {"model": MODEL, "prompt": "x", "max_tokens": 20, "ignore_eos": True}
        first = threading.Thread(target=post, args=(s, "/v1/completions", long))
        first.start()
        while not calls:
            time.sleep(0.01)
        waiter = threading.Thread(target=post, args=(s, "/v1/completions", long))
        waiter.start()
        while engine._num_unfinished < 2:  # the waiter is accepted: the queue holds 1 now
            time.sleep(0.01)
        r = post(s, "/v1/completions", long)
        assert_error(r, 429, "rate_limit_exceeded", None, "waiting queue is full")
        assert r.headers["retry-after"] == "1"
        streamed = post(s, "/v1/completions", {**long, "stream": True})
        assert_error(streamed, 429, "rate_limit_exceeded")  # a status, not a broken stream
        release.set()
        first.join()
        waiter.join()
        s.wait_idle()
        # The bound counts sequences (prompts x n), and more than it could ever hold is a 400.
        two = post(s, "/v1/completions", {**long, "prompt": ["a", "b"]})
        assert_error(two, 400, None, "n", "2 sequences (prompts x n) exceed")
        assert_error(post(s, "/v1/completions", {**long, "n": 2}), 400, None, "n")
        assert post(s, "/v1/completions", long).status_code == 200


def test_request_timeout_aborts_and_frees_blocks(tiny_llama):
    engine = engine_for(tiny_llama, request_timeout=0.3)
    with LiveServer(engine, served_model_name=MODEL) as s:
        slow_steps(s.engine, 0.05)
        body = {"model": MODEL, "prompt": "x", "max_tokens": 100, "ignore_eos": True}
        assert_error(post(s, "/v1/completions", body), 408, "request_timeout", None,
                     "exceeded the 0.3 s request timeout")  # fmt: skip
        s.wait_idle()
        assert engine.core.kv_cache_manager.pool.num_used_blocks == 0


def test_engine_failure_is_503_never_a_hang(tiny_llama):
    with LiveServer(engine_for(tiny_llama), served_model_name=MODEL) as s:
        assert httpx.get(s.url + "/health").status_code == 200

        def broken_step():
            raise RuntimeError("simulated device failure")

        s.engine.core.step = broken_step
        body = {"model": MODEL, "prompt": "x", "max_tokens": 4}
        assert_error(post(s, "/v1/completions", body), 503, "engine_unavailable", None,
                     "simulated device failure")  # fmt: skip
        health = httpx.get(s.url + "/health")
        assert_error(health, 503, "engine_unavailable")
        assert_error(post(s, "/v1/completions", body), 503, "engine_unavailable")
