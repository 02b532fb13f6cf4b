"""/v1/embeddings through openai-python (which asks for base64 and decodes it) and raw HTTP:
the vectors `LLM.embed` gives, every input form, `dimensions` on a Matryoshka model, usage,
OpenAI's published schema, and the 400s: a generative model, a generation route on an
embedding model, bad inputs."""

from __future__ import annotations

import base64
import math
import struct

import httpx
import openai
import pytest

from inflight import LLM
from inflight.engine.async_engine import AsyncLLM
from tests.model.test_embeddings import write_embedding_model
from tests.server.live import LiveServer
from tests.server.test_openai_conformance import conforms, spec  # noqa: F401 (a fixture)

PROMPTS = ["The quick brown fox", "jumps over", "the lazy dog again and again"]


@pytest.fixture(scope="module")
def folder(tmp_path_factory, tokenizer_dir):
    return write_embedding_model(tmp_path_factory.mktemp("embedder"), tokenizer_dir, "last")


@pytest.fixture(scope="module")
def server(folder):
    engine = AsyncLLM(str(folder), dtype="float32", max_model_len=128, num_kv_blocks=64)
    with LiveServer(engine, served_model_name="embedder") as s:
        yield s


@pytest.fixture(scope="module")
def expected(folder):
    return [o.embedding for o in LLM(str(folder), dtype="float32").embed(PROMPTS, use_tqdm=False)]


def post(server, body, status=200):
    r = httpx.post(server.url + "/v1/embeddings", json={"model": "embedder", **body}, timeout=60)
    assert r.status_code == status, r.text
    return r.json()


def test_openai_python_gets_the_offline_vectors(server, expected):
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)
    got = client.embeddings.create(model="embedder", input=PROMPTS)  # base64 on the wire
    assert [d.index for d in got.data] == [0, 1, 2]
    for data, want in zip(got.data, expected, strict=True):
        assert data.embedding == pytest.approx(want, abs=1e-6)
    assert got.usage.prompt_tokens == got.usage.total_tokens > len(PROMPTS)
    floats = client.embeddings.create(model="embedder", input=PROMPTS[0], encoding_format="float")
    assert floats.data[0].embedding == pytest.approx(expected[0], abs=1e-6)


def test_every_input_form_and_the_published_schema(server, spec, expected):  # noqa: F811
    ids = httpx.post(server.url + "/tokenize", json={"prompt": PROMPTS[1]}).json()["tokens"]
    for given in (PROMPTS[1], [PROMPTS[1]], ids, [ids, ids]):
        body = post(server, {"input": given})
        conforms(spec, "CreateEmbeddingResponse", body)
        for data in body["data"]:
            assert data["embedding"] == pytest.approx(expected[1], abs=1e-6)
    packed = post(server, {"input": PROMPTS[2], "encoding_format": "base64"})["data"][0]
    raw = base64.b64decode(packed["embedding"])
    assert list(struct.unpack(f"<{len(raw) // 4}f", raw)) == pytest.approx(expected[2], abs=1e-6)


def test_dimensions_keep_the_leading_values_normalized(server, expected):
    short = post(server, {"input": PROMPTS[0], "dimensions": 16})["data"][0]["embedding"]
    norm = math.sqrt(sum(v * v for v in expected[0][:16]))
    assert short == pytest.approx([v / norm for v in expected[0][:16]], abs=1e-6)
    error = post(server, {"input": PROMPTS[0], "dimensions": 65}, 400)["error"]
    assert error["param"] == "dimensions"


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"input": ""}, "input"),
        ({"input": []}, "input"),
        ({"input": [[]]}, "input"),
        ({"input": [10**9]}, "input"),
        ({"input": "x", "encoding_format": "int8"}, "encoding_format"),
        ({"input": "x", "dimensions": 0}, "dimensions"),
        ({"input": "x", "dimension": 8}, "dimension"),
        ({"input": "x" * 100_000}, "input"),
    ],
)
def test_bad_inputs_are_400s_naming_the_field(server, body, param):
    error = post(server, body, 400)["error"]
    assert error["param"] == param and error["type"] == "invalid_request_error"


def test_generation_on_an_embedding_model_is_a_400(server):
    r = httpx.post(server.url + "/v1/chat/completions", timeout=60, json={
        "model": "embedder", "messages": [{"role": "user", "content": "hi"}]})  # fmt: skip
    assert r.status_code == 400 and r.json()["error"]["code"] == "model_not_supported"


def test_a_generative_model_gives_no_embeddings(tiny_llama):
    engine = AsyncLLM(str(tiny_llama), dtype="float32", max_model_len=128, num_kv_blocks=32)
    with LiveServer(engine, served_model_name="tiny") as s:
        r = httpx.post(s.url + "/v1/embeddings", json={"model": "tiny", "input": "hi"})
    assert r.status_code == 400
    assert r.json()["error"]["code"] == "model_not_supported"
