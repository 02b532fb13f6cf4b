"""Granite (`GraniteForCausalLM`, GGUF `granite`): the Llama decoder with four multipliers (of
the embeddings, of attention's and the MLP's outputs before the residual add, of the scores,
and a divisor of the logits). The tiny Granite of `TINY_ARCHS` is held to transformers' greedy
tokens in every setting (its logprobs in `test_logprobs_parity.py`, as greedy argmax cannot
see the logits' divisor), and the GGUF to the folder."""

from __future__ import annotations

import pytest
from gguf import GGMLQuantizationType

from inflight import LLM, SamplingParams
from inflight.model.arch import LlamaArchConfig
from tests.gguf_files import write_tiny_gguf
from tests.parity import random_prompts


def _first_step_logprobs(llm: LLM, prompts: list[list[int]]) -> list[tuple[int, float]]:
    """(greedy token, its logprob) after each prompt."""
    params = SamplingParams(temperature=0, max_tokens=1, logprobs=0)
    outputs = llm.generate(prompts, params, use_tqdm=False)
    return [(o.outputs[0].token_ids[0], o.outputs[0].logprobs[0].logprob) for o in outputs]


def test_a_published_granite_config_is_read():
    config = {
        "architectures": ["GraniteForCausalLM"], "vocab_size": 49159, "hidden_size": 2048,
        "intermediate_size": 8192, "num_hidden_layers": 40, "num_attention_heads": 32,
        "num_key_value_heads": 8, "max_position_embeddings": 131072, "rope_theta": 10000000.0,
        "embedding_multiplier": 12.0, "residual_multiplier": 0.22,
        "attention_multiplier": 0.015625, "logits_scaling": 8.0, "tie_word_embeddings": True,
    }  # fmt: skip
    arch = LlamaArchConfig.from_hf_config(config)
    assert arch.architecture == "granite" and arch.attention_scale == 0.015625
    assert (arch.embedding_multiplier, arch.residual_multiplier, arch.logits_scaling) == (
        12.0, 0.22, 8.0
    )  # fmt: skip
    with pytest.raises(ValueError, match="logits_scaling must be positive"):
        LlamaArchConfig.from_hf_config({**config, "logits_scaling": 0.0})


def test_a_granite_gguf_generates_as_its_hf_folder(tmp_path, tiny_model_factory):
    """llama.cpp's converter writes the multipliers as `embedding_scale`, `residual_scale`,
    `attention.scale` and `logit_scale`, and permutes Q/K rows as for llama."""
    folder = tiny_model_factory("granite")
    path = write_tiny_gguf(folder, tmp_path / "granite.gguf", GGMLQuantizationType.F32)
    llm = LLM(str(path), dtype="float32", quantized_activations="off")
    arch = llm.core.arch
    assert (arch.architecture, arch.attention_multiplier, arch.logits_scaling) == (
        "granite", 0.125, 0.5
    )  # fmt: skip
    prompts = random_prompts(arch.vocab_size, lengths=(2, 9, 30, 64))
    want = _first_step_logprobs(LLM(str(folder), dtype="float32"), prompts)
    got = _first_step_logprobs(llm, prompts)
    assert [t for t, _ in got] == [t for t, _ in want]
    for (_, ours), (_, theirs) in zip(got, want, strict=True):
        assert ours == pytest.approx(theirs, abs=1e-4)
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    tokens = [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
    folder_llm = LLM(str(folder), dtype="float32")
    assert tokens == [o.outputs[0].token_ids
                      for o in folder_llm.generate(prompts, params, use_tqdm=False)]  # fmt: skip
