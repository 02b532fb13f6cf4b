"""Seed-OSS (`SeedOssForCausalLM`, GGUF `seed_oss`): the Llama decoder with q/k/v biases (on
unless its config says otherwise). The tiny Seed-OSS of `TINY_ARCHS` is held to transformers'
greedy tokens in every setting and its fused layer loop to the Python one; here, the config as
published, the variants not built, and the GGUF against transformers with the file's
weights."""

from __future__ import annotations

import pytest
from gguf import GGMLQuantizationType

from inflight import LLM
from inflight.model.arch import LlamaArchConfig
from tests.gguf_files import write_tiny_gguf
from tests.parity import assert_gguf_generates_as_its_weights

PUBLISHED = {  # Seed-OSS-36B's config.json, the fields the engine reads
    "architectures": ["SeedOssForCausalLM"], "vocab_size": 155136, "hidden_size": 5120,
    "intermediate_size": 27648, "num_hidden_layers": 64, "num_attention_heads": 80,
    "num_key_value_heads": 8, "head_dim": 128, "max_position_embeddings": 524288,
    "rope_theta": 10000000.0, "rms_norm_eps": 1e-06, "attention_bias": True,
    "attention_out_bias": False, "mlp_bias": False, "tie_word_embeddings": False,
}  # fmt: skip


def test_a_published_seed_oss_config_is_read():
    arch = LlamaArchConfig.from_hf_config(PUBLISHED)
    assert (arch.architecture, arch.qkv_bias, arch.o_bias) == ("seed_oss", True, False)
    unsaid = {k: v for k, v in PUBLISHED.items() if k != "attention_bias"}
    assert LlamaArchConfig.from_hf_config(unsaid).qkv_bias  # transformers' default: on


@pytest.mark.parametrize("field", ["attention_out_bias", "mlp_bias"])
def test_biases_not_built_are_refused(field):
    with pytest.raises(ValueError, match=field):
        LlamaArchConfig.from_hf_config({**PUBLISHED, field: True})


@pytest.mark.parametrize("qtype", [GGMLQuantizationType.F32, GGMLQuantizationType.Q8_0],
                         ids=lambda q: q.name)  # fmt: skip
def test_a_seed_oss_gguf_generates_as_transformers_with_its_weights(
    tmp_path, tiny_model_factory, qtype
):
    folder = tiny_model_factory("seed_oss")
    path = write_tiny_gguf(folder, tmp_path / "seed_oss.gguf", qtype)
    llm = LLM(str(path), dtype="float32", quantized_activations="off")
    assert (llm.core.arch.architecture, llm.core.arch.qkv_bias) == ("seed_oss", True)
    assert_gguf_generates_as_its_weights(llm, folder, qtype)
