"""Completions API shapes on the tiny model: prompt forms, echo, n, token routes, broken streams."""

from __future__ import annotations

import itertools
import json

import httpx
import pytest

from inflight import __version__
from inflight.engine.async_engine import AsyncLLM
from tests.server.live import LiveServer


@pytest.fixture(scope="module")
def server(tiny_llama):
    engine = AsyncLLM(str(tiny_llama), dtype="float32", max_model_len=128, num_kv_blocks=64)
    with LiveServer(engine, served_model_name="tiny") as s:
        yield s


def complete(server, **body):
    r = httpx.post(server.url + "/v1/completions", json={"model": "tiny", **body}, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


def sse_events(server, path, body):
    with httpx.stream("POST", server.url + path, json=body, timeout=60) as r:
        assert r.status_code == 200
        return [line[6:] for line in r.iter_lines() if line.startswith("data: ")]


def test_prompt_forms_number_choices_by_prompt_then_sample(server):
    greedy = {"max_tokens": 5, "temperature": 0, "ignore_eos": True}
    ids = httpx.post(server.url + "/tokenize", json={"prompt": "The quick"}).json()["tokens"]
    by_text = complete(server, prompt="The quick", **greedy)
    by_ids = complete(server, prompt=ids, **greedy)
    assert by_text["choices"][0]["text"] == by_ids["choices"][0]["text"]

    batch = complete(server, prompt=["The quick", "Numbers like"], n=2, **greedy)
    assert [c["index"] for c in batch["choices"]] == [0, 1, 2, 3]
    assert batch["choices"][0]["text"] == by_text["choices"][0]["text"]
    assert batch["usage"]["completion_tokens"] == 20
    id_batch = complete(server, prompt=[ids, ids], **greedy)
    assert len({c["text"] for c in id_batch["choices"]}) == 1

    echoed = complete(server, prompt="The quick", echo=True, **greedy)
    assert echoed["choices"][0]["text"] == "The quick" + by_text["choices"][0]["text"]


def test_streamed_completion_equals_the_whole(server):
    body = {"model": "tiny", "prompt": "The quick", "max_tokens": 12, "temperature": 0,
            "ignore_eos": True, "n": 2, "stream": True,
            "stream_options": {"include_usage": True}}  # fmt: skip
    events = sse_events(server, "/v1/completions", body)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    usage = chunks[-1]["usage"]
    texts = {0: "", 1: ""}
    for c in chunks[:-1]:
        (choice,) = c["choices"]
        texts[choice["index"]] += choice["text"]
    whole = complete(
        server, **{k: v for k, v in body.items() if "stream" not in k and k != "model"}
    )
    assert [texts[0], texts[1]] == [c["text"] for c in whole["choices"]]
    assert usage == whole["usage"]


def test_tokenize_detokenize_version(server):
    tok = httpx.post(server.url + "/tokenize", json={"prompt": "The quick brown fox"}).json()
    assert tok["count"] == len(tok["tokens"]) and tok["max_model_len"] == 128
    text = httpx.post(server.url + "/detokenize", json={"tokens": tok["tokens"]}).json()
    assert text == {"prompt": "The quick brown fox"}
    chat = httpx.post(server.url + "/tokenize",
                      json={"messages": [{"role": "user", "content": "hi"}]}).json()  # fmt: skip
    assert chat["count"] > 3
    assert httpx.get(server.url + "/version").json() == {"version": __version__}


def test_error_after_the_stream_started_is_an_error_chunk_then_done(tiny_llama):
    engine = AsyncLLM(str(tiny_llama), dtype="float32", max_model_len=128, num_kv_blocks=64)
    with LiveServer(engine, served_model_name="tiny") as s:
        step, calls = engine.core.step, []

        def failing_step():
            calls.append(1)
            if len(calls) > 3:
                raise RuntimeError("boom mid-stream")
            return step()

        engine.core.step = failing_step
        body = {"model": "tiny", "prompt": "x", "max_tokens": 50, "ignore_eos": True,
                "stream": True}  # fmt: skip
        events = sse_events(s, "/v1/completions", body)
        assert events[-1] == "[DONE]"
        error = json.loads(events[-2])["error"]
        assert error["code"] == "engine_unavailable" and "boom mid-stream" in error["message"]
        assert any("choices" in json.loads(e) for e in events[:-2])  # it had started


def test_logprobs_carry_each_tokens_own_bytes(server):
    """A token holding the first byte of a CJK character: its bytes are that byte, not the
    U+FFFD its decoded text shows."""
    byte_e6 = server.engine.tokenizer.convert_tokens_to_ids("æ")  # byte-level BPE's 0xE6
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2,
            "logprobs": True, "top_logprobs": 2, "logit_bias": {str(byte_e6): 100},
            "ignore_eos": True}  # fmt: skip
    r = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=60)
    entries = r.json()["choices"][0]["logprobs"]["content"]
    assert [e["bytes"] for e in entries] == [[0xE6], [0xE6]]
    assert all(t["bytes"] != [0xEF, 0xBF, 0xBD] for e in entries for t in e["top_logprobs"])


@pytest.mark.parametrize("stream", [False, True])
def test_completion_logprobs_hold_the_sampled_token_and_offsets_from_the_echo(server, stream):
    """Echo with logprobs scores the prompt too (lm-eval-harness's log-likelihoods read it):
    its first token null, as OpenAI's, the rest as vLLM's `prompt_logprobs` give them."""
    body = {"model": "tiny", "prompt": "The quick", "max_tokens": 6, "logprobs": 1, "echo": True,
            "temperature": 1.0, "seed": 7, "ignore_eos": True, "stream": stream}  # fmt: skip
    if stream:
        chunks = [json.loads(e) for e in sse_events(server, "/v1/completions", body)[:-1]]
        lps = [c["choices"][0]["logprobs"] for c in chunks if c["choices"][0].get("logprobs")]
        tokens = [t for lp in lps for t in lp["tokens"]]
        offsets = [o for lp in lps for o in lp["text_offset"]]
        values = [v for lp in lps for v in lp["token_logprobs"]]
        tops = [t for lp in lps for t in lp["top_logprobs"]]
        text = "".join(c["choices"][0]["text"] for c in chunks)
    else:
        choice = complete(server, **{k: v for k, v in body.items() if k != "model"})["choices"][0]
        lp, text = choice["logprobs"], choice["text"]
        tokens, offsets, tops = lp["tokens"], lp["text_offset"], lp["top_logprobs"]
        values = lp["token_logprobs"]
    ids = httpx.post(server.url + "/tokenize", json={"prompt": "The quick"}).json()["tokens"]
    num_prompt = len(ids)
    assert text.startswith("The quick") and len(tokens) == num_prompt + 6
    assert "".join(tokens[:num_prompt]) == "The quick"
    assert values[0] is None and tops[0] is None
    scored = complete(server, prompt=ids, max_tokens=1, prompt_logprobs=1)["choices"][0]
    vllm_shape = scored["prompt_logprobs"]
    assert vllm_shape[0] is None and len(vllm_shape) == num_prompt
    for value, token_id, entries in zip(values[1:num_prompt], ids[1:], vllm_shape[1:],
                                        strict=True):  # fmt: skip
        assert entries[str(token_id)]["logprob"] == pytest.approx(value, abs=1e-5)
        assert len(entries) <= 2 and all(e["rank"] >= 1 for e in entries.values())
    # each token's offset points at its text, the generated ones past the echoed prompt, up to
    # a token holding part of a character (its text is U+FFFD until the character's last byte)
    assert offsets[0] == 0 and offsets[num_prompt] == len("The quick")
    assert offsets == sorted(offsets) and all(o <= len(text) for o in offsets)
    pairs = zip(offsets, tokens, strict=True)
    whole = itertools.takewhile(lambda ot: "\ufffd" not in ot[1], pairs)
    assert all(text[o : o + len(t)] == t for o, t in whole)
    assert all(t in top and len(top) <= 2 for t, top in zip(tokens[1:], tops[1:], strict=True))


def test_chat_prompt_logprobs_come_whole_and_on_the_first_chunk(server):
    body = {"model": "tiny", "messages": [{"role": "user", "content": "Hi there"}],
            "max_tokens": 3, "prompt_logprobs": 0}  # fmt: skip
    r = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=60).json()
    scored = r["prompt_logprobs"]
    assert len(scored) == r["usage"]["prompt_tokens"] and scored[0] is None
    assert all(len(entries) == 1 for entries in scored[1:])  # the token itself, no alternatives
    events = sse_events(server, "/v1/chat/completions", {**body, "stream": True})
    chunks = [json.loads(e) for e in events[:-1]]
    assert chunks[0]["prompt_logprobs"] == scored
    assert all("prompt_logprobs" not in c for c in chunks[1:])
    plain = httpx.post(server.url + "/v1/chat/completions",
                       json={**body, "prompt_logprobs": None}, timeout=60).json()  # fmt: skip
    assert "prompt_logprobs" not in plain


def test_usage_counts_the_prompt_tokens_served_from_the_prefix_cache(server):
    """`prompt_tokens_details.cached_tokens`: none for a prompt seen first, its full blocks (2 of
    16 tokens of a 40-token prompt) when it comes again, once per prompt whatever `n`, summed
    over prompts, and the same in the stream's usage chunk."""
    greedy = {"max_tokens": 3, "temperature": 0, "ignore_eos": True}
    prompt, other = list(range(100, 140)), list(range(200, 240))
    cached = lambda r: r["usage"]["prompt_tokens_details"]["cached_tokens"]  # noqa: E731
    assert cached(complete(server, prompt=prompt, **greedy)) == 0
    assert cached(complete(server, prompt=prompt, n=2, **greedy)) == 32
    assert cached(complete(server, prompt=[prompt, other], **greedy)) == 32
    assert cached(complete(server, prompt=[prompt, other], **greedy)) == 64
    body = {"model": "tiny", "prompt": other, "stream": True,
            "stream_options": {"include_usage": True}, **greedy}  # fmt: skip
    assert cached(json.loads(sse_events(server, "/v1/completions", body)[-2])) == 32
