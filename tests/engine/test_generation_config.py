"""What a model's files recommend: a folder's generation_config.json and a GGUF file's
`general.sampling.*` keys become the sampling defaults of requests that leave those fields unset
(offline and over HTTP; `generation_config="none"` keeps OpenAI's), values a request could not
send are left out, and the end tokens both kinds of file name stop generation."""

from __future__ import annotations

import json
import logging
import shutil

import httpx
import pytest
from gguf import GGMLQuantizationType

from inflight import LLM, ConfigError, SamplingParams
from inflight.engine.async_engine import AsyncLLM
from inflight.model.generation_config import SamplingDefaults, read_sampling_defaults
from tests.gguf_files import write_tiny_gguf
from tests.server.live import LiveServer

RECOMMENDED = {"do_sample": True, "temperature": 0.6, "top_p": 0.95, "top_k": 20}


@pytest.fixture
def folder_with(tmp_path, tiny_llama):
    """A copy of the tiny Llama whose generation_config.json has `fields` added."""

    def make(**fields):
        folder = tmp_path / f"model-{len(list(tmp_path.iterdir()))}"
        shutil.copytree(tiny_llama, folder)
        config = folder / "generation_config.json"
        config.write_text(json.dumps({**json.loads(config.read_text()), **fields}))
        return folder

    return make


def test_a_folders_generation_config_sets_the_defaults(folder_with):
    llm = LLM(str(folder_with(**RECOMMENDED, min_p=0.05, repetition_penalty=1.1)))
    assert llm.sampling_defaults == SamplingDefaults(0.6, 0.95, 20, 0.05, 1.1)
    params = llm.get_default_sampling_params()
    assert (params.temperature, params.top_p, params.top_k, params.min_p) == (0.6, 0.95, 20, 0.05)
    # a field given keeps its value; the others still take the model's
    mixed = llm.sampling_defaults.sampling_params(temperature=0.0, top_p=None, max_tokens=3)
    assert (mixed.temperature, mixed.top_p, mixed.top_k, mixed.max_tokens) == (0.0, 0.95, 20, 3)
    # OpenAI's where the file says nothing, and with generation_config="none"
    plain = LLM(str(folder_with(**RECOMMENDED)), generation_config="none")
    assert plain.sampling_defaults == SamplingDefaults()
    assert (plain.get_default_sampling_params().temperature,
            plain.get_default_sampling_params().top_k) == (1.0, 0)  # fmt: skip


def test_generate_without_params_samples_as_the_model_recommends(folder_with):
    """temperature 0 in the file: a call without SamplingParams is greedy, whatever the seed;
    explicit SamplingParams are the caller's own (temperature 1)."""
    llm = LLM(str(folder_with(temperature=0.0)), seed=3)
    prompt = [5, 6, 7, 8]
    greedy = llm.generate(prompt, SamplingParams(temperature=0, max_tokens=16), use_tqdm=False)
    default = llm.generate(prompt, use_tqdm=False)[0].outputs[0].token_ids
    assert default == greedy[0].outputs[0].token_ids[: len(default)] and len(default) == 16
    seeded = [SamplingParams(max_tokens=16, seed=s) for s in range(4)]
    sampled = {tuple(o.outputs[0].token_ids) for o in llm.generate([prompt] * 4, seeded)}
    assert len(sampled) > 1


@pytest.mark.parametrize(("fields", "kept"), [
    ({"temperature": -1.0, "top_p": 0.9}, {"top_p": 0.9}),
    ({"top_k": "20", "top_p": 7.0, "min_p": 0.1}, {"min_p": 0.1}),
    ({"repetition_penalty": 0.0, "temperature": True}, {}),
])  # fmt: skip
def test_values_a_request_could_not_send_are_left_out(folder_with, fields, kept, caplog):
    with caplog.at_level(logging.WARNING, logger="inflight.model.generation_config"):
        defaults = read_sampling_defaults(folder_with(**fields))
    assert defaults.given() == kept
    assert len(caplog.records) == len(fields) - len(kept)


def test_a_broken_generation_config_recommends_nothing(folder_with):
    folder = folder_with()
    (folder / "generation_config.json").write_text("{not json")
    assert read_sampling_defaults(folder) == SamplingDefaults()
    (folder / "generation_config.json").write_text("[1, 2]")
    assert read_sampling_defaults(folder) == SamplingDefaults()
    assert LLM(str(folder)).sampling_defaults == SamplingDefaults()


def test_a_gguf_files_sampling_keys_set_the_defaults(tmp_path, tiny_llama):
    """The keys llama.cpp reads (`general.sampling.temp` ...), its repeat penalty as
    repetition_penalty."""

    def sampling(w):
        w.add_sampling_temp(0.5)
        w.add_sampling_top_k(40)
        w.add_sampling_top_p(0.75)
        w.add_sampling_min_p(0.125)
        w.add_sampling_penalty_repeat(1.25)

    path = write_tiny_gguf(tiny_llama, tmp_path / "m.gguf", GGMLQuantizationType.F32,
                           metadata=sampling)  # fmt: skip
    assert read_sampling_defaults(path) == SamplingDefaults(0.5, 0.75, 40, 0.125, 1.25)
    plain = write_tiny_gguf(tiny_llama, tmp_path / "plain.gguf", GGMLQuantizationType.F32)
    assert read_sampling_defaults(plain) == SamplingDefaults()


def test_the_end_tokens_the_files_name_stop_generation(folder_with, tmp_path, tiny_llama):
    """A folder's generation_config.json eos_token_id list (Llama 3 Instruct's end of turn)
    and a GGUF file's end-of-turn token stop a generation as its end of sequence does."""
    prompt = [5, 6, 7, 8]
    params = SamplingParams(temperature=0, max_tokens=12)
    free = LLM(str(tiny_llama)).generate(prompt, params, use_tqdm=False)[0].outputs[0]
    end = free.token_ids[4]
    assert end not in free.token_ids[:4] and free.finish_reason == "length"
    stopped = LLM(str(folder_with(eos_token_id=[2, end]))).generate(prompt, params,
                                                                    use_tqdm=False)  # fmt: skip
    assert (stopped[0].outputs[0].token_ids, stopped[0].outputs[0].finish_reason) == (
        free.token_ids[:5], "stop")  # fmt: skip
    path = write_tiny_gguf(tiny_llama, tmp_path / "eot.gguf", GGMLQuantizationType.F32,
                           metadata=lambda w: w.add_eot_token_id(end))  # fmt: skip
    llm = LLM(str(path), dtype="float32", quantized_activations="off")
    assert end in llm.eos_token_ids
    out = llm.generate(prompt, params, use_tqdm=False)[0].outputs[0]
    assert (out.token_ids, out.finish_reason) == (free.token_ids[:5], "stop")


def test_end_tokens_outside_the_vocabulary_are_ignored(folder_with, caplog):
    with caplog.at_level(logging.WARNING, logger="inflight.engine.frontend"):
        llm = LLM(str(folder_with(eos_token_id=[2, 10**9, -3])))
    assert 2 in llm.eos_token_ids and not {10**9, -3} & llm.eos_token_ids
    assert "outside the vocabulary" in caplog.text


def test_unknown_generation_config_knob_is_refused(tiny_llama):
    with pytest.raises(ConfigError, match="generation_config must be auto or none"):
        LLM(str(tiny_llama), generation_config="vllm")


@pytest.mark.parametrize("source", ["auto", "none"])
def test_http_requests_take_the_models_defaults_where_they_set_none(folder_with, source):
    """Over HTTP: with the file's temperature 0, requests without one are greedy whatever their
    seed (with `none`, they sample at OpenAI's temperature 1); one that sets it samples. A
    Response echoes the values it ran with."""
    engine = AsyncLLM(str(folder_with(temperature=0.0)), max_model_len=128, num_kv_blocks=64,
                      generation_config=source)  # fmt: skip
    with LiveServer(engine, served_model_name="tiny") as server:

        def text(**fields) -> str:
            body = {"model": "tiny", "prompt": "The quick", "max_tokens": 16, **fields}
            response = httpx.post(server.url + "/v1/completions", json=body, timeout=60)
            assert response.status_code == 200, response.text
            return response.json()["choices"][0]["text"]

        greedy = text(temperature=0)
        unset = {text(seed=s) for s in range(4)}
        assert (unset == {greedy}) == (source == "auto")
        assert len({text(seed=s, temperature=1.0) for s in range(4)}) > 1

        def echoed(**fields) -> tuple[float, float]:
            body = {"model": "tiny", "input": "hi", "max_output_tokens": 2, **fields}
            response = httpx.post(server.url + "/v1/responses", json=body, timeout=60)
            assert response.status_code == 200, response.text
            return response.json()["temperature"], response.json()["top_p"]

        assert echoed() == ((0.0 if source == "auto" else 1.0), 1.0)
        assert echoed(temperature=0.5, top_p=0.25) == (0.5, 0.25)
