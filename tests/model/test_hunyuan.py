"""Hunyuan dense (`HunYuanDenseV1ForCausalLM`, GGUF `hunyuan-dense`): Qwen3's layer with its
per-head q/k norms after RoPE, and RoPE's NTK alpha stretching the base. The tiny Hunyuan of
`TINY_ARCHS` is held to transformers' greedy tokens in every setting and its fused layer loop to
the Python one; here, the config as published and the GGUF (whose converter writes the
stretched base) against transformers with the file's weights."""

from __future__ import annotations

import pytest
from gguf import GGMLQuantizationType

from inflight import LLM
from inflight.model.arch import LlamaArchConfig
from tests.gguf_files import write_tiny_gguf
from tests.parity import assert_gguf_generates_as_its_weights

PUBLISHED = {  # Hunyuan-1.8B-Instruct's config.json, the fields the engine reads
    "architectures": ["HunYuanDenseV1ForCausalLM"], "vocab_size": 120818, "hidden_size": 2048,
    "intermediate_size": 6144, "num_hidden_layers": 32, "num_attention_heads": 16,
    "num_key_value_heads": 4, "head_dim": 128, "max_position_embeddings": 262144,
    "rms_norm_eps": 1e-05, "tie_word_embeddings": True, "attention_bias": False,
    "rope_scaling": {"alpha": 1000.0, "factor": 1.0, "type": "dynamic"}, "rope_theta": 10000.0,
}  # fmt: skip


def test_a_published_hunyuan_config_is_read():
    """The alpha stretches the base as llama.cpp's converter computes it (10,000 x 1,000 ** (128
    / 126) = 11,158,839.9)."""
    arch = LlamaArchConfig.from_hf_config(PUBLISHED)
    assert arch.architecture == "hunyuan_dense" and arch.rope_scaling is None
    assert arch.rope_theta == pytest.approx(11158839.9251, rel=1e-9)
    with pytest.raises(ValueError, match="unsupported rope_type 'dynamic'"):
        LlamaArchConfig.from_hf_config({**PUBLISHED, "rope_scaling": {"type": "dynamic",
                                                                      "factor": 2.0}})  # fmt: skip


@pytest.mark.parametrize("qtype", [GGMLQuantizationType.F32, GGMLQuantizationType.Q8_0],
                         ids=lambda q: q.name)  # fmt: skip
def test_a_hunyuan_gguf_generates_as_transformers_with_its_weights(
    tmp_path, tiny_model_factory, qtype
):
    folder = tiny_model_factory("hunyuan_dense")
    path = write_tiny_gguf(folder, tmp_path / "hunyuan.gguf", qtype)
    llm = LLM(str(path), dtype="float32", quantized_activations="off")
    assert llm.core.arch.architecture == "hunyuan_dense"
    assert_gguf_generates_as_its_weights(llm, folder, qtype)
