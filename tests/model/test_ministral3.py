"""Ministral 3 (`Ministral3ForCausalLM`, the language model of a
`Mistral3ForConditionalGeneration` folder; GGUF `mistral3`): Mistral's layer with YaRN and
Llama 4's query temperature past the original context. The tiny Ministral 3 of `TINY_ARCHS`
(an original context of 16 positions) is held to transformers' greedy tokens in every setting
and its fused layer loop to the Python one; here, the configs as published, an image-and-text
folder's language model (its vision parts left out), and the GGUF against transformers with
the file's weights."""

from __future__ import annotations

import math

import pytest
import torch
from gguf import GGMLQuantizationType

from inflight import LLM
from inflight.model.arch import LlamaArchConfig
from tests.conftest import MINISTRAL3_ROPE
from tests.gguf_files import tiny_gguf_engine
from tests.parity import assert_gguf_generates_as_its_weights, assert_greedy_as

MINISTRAL3_3B = {  # Ministral-3-3B-Instruct-2512-BF16's config.json, the fields the engine reads
    "architectures": ["Mistral3ForConditionalGeneration"], "tie_word_embeddings": True,
    "text_config": {
        "model_type": "ministral3", "head_dim": 128, "hidden_size": 3072,
        "intermediate_size": 9216, "max_position_embeddings": 262144,
        "num_attention_heads": 32, "num_hidden_layers": 26, "num_key_value_heads": 8,
        "rms_norm_eps": 1e-05, "vocab_size": 131072,
        "rope_parameters": {"type": "yarn", "rope_type": "yarn", "rope_theta": 1000000.0,
                            "factor": 16.0, "original_max_position_embeddings": 16384,
                            "max_position_embeddings": 262144, "beta_fast": 32.0,
                            "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0,
                            "llama_4_scaling_beta": 0.1}},
    "vision_config": {"model_type": "pixtral"},
}  # fmt: skip
MISTRAL_SMALL_31 = {  # Mistral-Small-3.1-24B-Instruct-2503's: a Mistral language model
    "architectures": ["Mistral3ForConditionalGeneration"],
    "text_config": {
        "model_type": "mistral", "head_dim": 128, "hidden_size": 5120,
        "intermediate_size": 32768, "max_position_embeddings": 131072,
        "num_attention_heads": 32, "num_hidden_layers": 40, "num_key_value_heads": 8,
        "rms_norm_eps": 1e-05, "rope_theta": 1000000000.0, "sliding_window": None,
        "vocab_size": 131072},
    "vision_config": {"model_type": "pixtral"},
}  # fmt: skip


def test_published_configs_are_read():
    arch = LlamaArchConfig.from_hf_config(MINISTRAL3_3B)
    assert (arch.architecture, arch.num_layers, arch.tie_word_embeddings) == (
        "ministral3", 26, True)  # fmt: skip
    assert (arch.query_temperature_beta, arch.query_temperature_interval) == (0.1, 16384)
    scaling = arch.rope_scaling_dict
    assert (scaling["rope_type"], scaling["factor"], scaling["attention_factor"]) == (
        "yarn", 16.0, 1.0)  # (mscale over mscale_all_dim, both 1)  # fmt: skip
    small = LlamaArchConfig.from_hf_config(MISTRAL_SMALL_31)
    assert (small.architecture, small.num_layers, small.query_temperature_beta) == (
        "mistral", 40, 0.0)  # fmt: skip
    with pytest.raises(ValueError, match="with a 'qwen3' language model is not supported"):
        LlamaArchConfig.from_hf_config({**MISTRAL_SMALL_31, "text_config": {"model_type": "qwen3"}})


@pytest.mark.parametrize("beta", [float("nan"), -0.1, "0.1"])
def test_a_temperature_no_query_takes_is_refused(beta):
    text = MINISTRAL3_3B["text_config"]
    rope = {**text["rope_parameters"], "llama_4_scaling_beta": beta}
    with pytest.raises(ValueError, match="query temperature beta"):
        LlamaArchConfig.from_hf_config(
            {**MINISTRAL3_3B, "text_config": {**text, "rope_parameters": rope}}
        )


def test_queries_are_tempered_from_the_original_context_on(tiny_model_factory):
    """1 within the first 16 positions, then 1 + beta ln(1 + floor(p / 16)), rounded once."""
    llm = LLM(str(tiny_model_factory("ministral3")), dtype="float32")
    positions = torch.tensor([0, 15, 16, 47, 48])
    scale = llm.core.loaded.model.query_temperature(positions, torch.float32).flatten()
    beta = MINISTRAL3_ROPE["llama_4_scaling_beta"]
    want = [1.0, 1.0, 1 + beta * math.log(2), 1 + beta * math.log(3), 1 + beta * math.log(4)]
    assert scale.tolist() == pytest.approx(want, rel=1e-6)


def test_an_image_and_text_folder_generates_as_transformers(tmp_path, tokenizer_dir):
    """A `Mistral3ForConditionalGeneration` folder (Pixtral vision tower, projector, the
    language model under `language_model.`, its LM head tied as the outer config says): the
    language model's greedy tokens are transformers' on the same text."""
    from transformers import (
        AutoTokenizer,
        Ministral3Config,
        Mistral3Config,
        Mistral3ForConditionalGeneration,
        PixtralVisionConfig,
    )

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    tokenizer.save_pretrained(tmp_path)
    text = Ministral3Config(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128,
                            num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                            head_dim=16, max_position_embeddings=512, initializer_range=0.2,
                            rope_parameters=MINISTRAL3_ROPE)  # fmt: skip
    vision = PixtralVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                 num_attention_heads=2, head_dim=16, image_size=32,
                                 patch_size=16)  # fmt: skip
    torch.manual_seed(0)
    config = Mistral3Config(vision_config=vision, text_config=text, spatial_merge_size=1)
    reference = Mistral3ForConditionalGeneration(config).eval()
    reference.save_pretrained(tmp_path)
    llm = LLM(str(tmp_path), dtype="float32")
    assert llm.core.arch.architecture == "ministral3"
    assert_greedy_as(llm, reference, len(tokenizer))


@pytest.mark.parametrize("qtype", [GGMLQuantizationType.F32, GGMLQuantizationType.Q8_0],
                         ids=lambda q: q.name)  # fmt: skip
def test_a_mistral3_gguf_generates_as_transformers_with_its_weights(
    tmp_path, tiny_model_factory, qtype
):
    """As llama.cpp's converter writes it: Q/K rows permuted, YaRN's `mscale_all_dim` as
    `rope.scaling.yarn_log_multiplier`, the query temperature as `attention.temperature_scale`
    over YaRN's original context."""
    folder = tiny_model_factory("ministral3")
    llm = tiny_gguf_engine(folder, tmp_path / "ministral3.gguf", qtype)
    arch = llm.core.arch
    assert (arch.architecture, arch.query_temperature_beta, arch.query_temperature_interval,
            arch.rope_attention_factor) == ("ministral3", 2.0, 16, 1.0)  # fmt: skip
    assert_gguf_generates_as_its_weights(llm, folder, qtype)
