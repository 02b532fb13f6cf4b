"""The official `openai` client, unchanged, against a live server running the default model.

Float32 and greedy where outputs are compared, so batch composition cannot change a token.
"""

from __future__ import annotations

import asyncio

import openai
import pytest

from inflight import LLM, SamplingParams
from inflight.engine.async_engine import AsyncLLM
from inflight.workload.parity import CHAT_PROMPTS, RAW_PROMPTS
from tests.server.live import LiveServer

pytestmark = pytest.mark.integration
MODEL = "smollm2"
KNOBS = {"dtype": "float32", "kv_cache_memory_bytes": 512 * 2**20}


@pytest.fixture(scope="module")
def server(default_model):
    with LiveServer(AsyncLLM(**KNOBS), served_model_name=MODEL) as s:
        yield s


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


def test_models_and_completion(client, server):
    (card,) = client.models.list().data
    assert card.id == MODEL and card.model_extra["max_model_len"] == 8192
    r = client.completions.create(
        model=MODEL, prompt="The capital of France is", max_tokens=8, temperature=0
    )
    assert r.choices[0].text.startswith(" Paris")
    assert r.choices[0].finish_reason == "length"
    assert (r.usage.prompt_tokens, r.usage.completion_tokens) == (5, 8)


def test_chat_n2_seed_logprobs(client):
    messages = [{"role": "user", "content": "Name a color."}]
    kwargs = dict(model=MODEL, messages=messages, max_tokens=12, temperature=1.0, seed=7, n=2,
                  logprobs=True, top_logprobs=3)  # fmt: skip
    a = client.chat.completions.create(**kwargs)
    b = client.chat.completions.create(**kwargs)
    assert [c.index for c in a.choices] == [0, 1]
    assert [c.message.content for c in a.choices] == [c.message.content for c in b.choices]
    for choice in a.choices:
        assert choice.message.role == "assistant"
        content = choice.logprobs.content
        assert len(content) == 12 or choice.finish_reason == "stop"
        assert all(len(t.top_logprobs) == 3 and t.logprob <= 0 for t in content)
    assert a.usage.completion_tokens == sum(len(c.logprobs.content) for c in a.choices)


def test_stop_strings_and_completion_logprobs(client):
    free = client.completions.create(model=MODEL, prompt="1, 2, 3, 4, 5,", max_tokens=12,
                                     temperature=0)  # fmt: skip
    assert free.choices[0].text.startswith(" 6, 7")
    stopped = client.completions.create(model=MODEL, prompt="1, 2, 3, 4, 5,", max_tokens=12,
                                        temperature=0, stop=[" 8"], logprobs=2)  # fmt: skip
    choice = stopped.choices[0]
    assert choice.text == free.choices[0].text.split(" 8")[0]
    assert choice.finish_reason == "stop"
    assert len(choice.logprobs.tokens) == len(choice.logprobs.top_logprobs)
    assert all(len(top) == 2 for top in choice.logprobs.top_logprobs)


def test_chat_stream_with_usage(client):
    stream = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "What is 12 times 11?"}],
        max_tokens=20, temperature=0, stream=True, stream_options={"include_usage": True},
    )  # fmt: skip
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] in ("stop", "length") and all(f is None for f in finishes[:-1])
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens > 0
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    full = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "What is 12 times 11?"}],
        max_tokens=20, temperature=0,
    )  # fmt: skip
    assert text == full.choices[0].message.content
    assert chunks[-1].usage.completion_tokens == full.usage.completion_tokens


def test_32_concurrent_streams_match_offline_generate(server):
    prompts = [f"{p} (variant {i})" for i, p in enumerate((RAW_PROMPTS + CHAT_PROMPTS) * 2)]
    prompts = prompts[:32]
    max_tokens = [8 + (i * 5) % 17 for i in range(32)]

    async def one(client: openai.AsyncOpenAI, prompt: str, n: int) -> tuple[str, list]:
        stream = await client.completions.create(
            model=MODEL, prompt=prompt, max_tokens=n, temperature=0, stream=True,
            extra_body={"ignore_eos": True},
        )  # fmt: skip
        parts, finishes = [], []
        async for chunk in stream:
            parts.append(chunk.choices[0].text)
            finishes.append(chunk.choices[0].finish_reason)
        return "".join(parts), finishes

    async def all_streams():
        client = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0)
        return await asyncio.gather(
            *(one(client, p, n) for p, n in zip(prompts, max_tokens, strict=True))
        )

    results = asyncio.run(all_streams())

    offline = LLM(**KNOBS)
    params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in max_tokens]
    expected = [o.outputs[0].text for o in offline.generate(prompts, params, use_tqdm=False)]
    for i, ((text, finishes), want) in enumerate(zip(results, expected, strict=True)):
        assert text == want, f"stream {i} differs from offline generate"
        assert finishes.count("length") == 1 and finishes[-1] == "length"
    server.wait_idle()
    assert server.engine.core.kv_cache_manager.pool.num_used_blocks == 0


def test_seeded_twins_sent_together_sample_what_one_samples_alone(client, server):
    """The same seed at temperature 1 gives the same tokens and logprobs over HTTP whether the
    request runs alone or beside its twins and strangers, all in flight at once."""
    messages = [{"role": "user", "content": "Write a short poem about the sea."}]
    seeded = dict(model=MODEL, messages=messages, max_tokens=16, temperature=1.0, top_p=0.95,
                  seed=11, logprobs=True)  # fmt: skip

    def summary(r) -> tuple[str, list[float]]:
        choice = r.choices[0]
        return choice.message.content, [t.logprob for t in choice.logprobs.content]

    alone = summary(client.chat.completions.create(**seeded))

    async def together():
        aclient = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0)
        twins = [aclient.chat.completions.create(**seeded) for _ in range(3)]
        strangers = [aclient.chat.completions.create(
            model=MODEL, max_tokens=24, temperature=1.0, seed=100 + i,
            messages=[{"role": "user", "content": prompt}],
        ) for i, prompt in enumerate(CHAT_PROMPTS[:5])]  # fmt: skip
        return await asyncio.gather(*twins, *strangers)

    answers = asyncio.run(together())
    assert [summary(r) for r in answers[:3]] == [alone] * 3
    assert len({r.choices[0].message.content for r in answers[3:]}) > 1
