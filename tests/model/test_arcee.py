"""Arcee (AFM, `ArceeForCausalLM`, GGUF `arcee`): the Llama decoder whose MLP has no gate (up,
ReLU squared, down). The tiny Arcee of `TINY_ARCHS` is held to transformers' greedy tokens in
every setting, its fused layer loop to the Python one and two TP ranks to one; here, the config
as published, the variants not built, and the GGUF against transformers with the file's
weights, its up projection from its blocks."""

from __future__ import annotations

import pytest
from gguf import GGMLQuantizationType

from inflight.model.arch import LlamaArchConfig
from tests.gguf_files import tiny_gguf_engine
from tests.parity import assert_gguf_generates_as_its_weights

PUBLISHED = {  # AFM-4.5B's config.json, the fields the engine reads
    "architectures": ["ArceeForCausalLM"], "vocab_size": 128004, "hidden_size": 2560,
    "intermediate_size": 18432, "num_hidden_layers": 36, "num_attention_heads": 20,
    "num_key_value_heads": 4, "head_dim": 128, "max_position_embeddings": 65536,
    "rope_theta": 10000.0, "rms_norm_eps": 1e-05, "hidden_act": "relu2",
    "tie_word_embeddings": False,
}  # fmt: skip


def test_a_published_arcee_config_is_read():
    arch = LlamaArchConfig.from_hf_config(PUBLISHED)
    assert (arch.architecture, arch.intermediate_size) == ("arcee", 18432)


@pytest.mark.parametrize("change", [{"hidden_act": "silu"}, {"mlp_bias": True}])
def test_variants_not_built_are_refused(change):
    with pytest.raises(ValueError, match="relu2, unbiased"):
        LlamaArchConfig.from_hf_config({**PUBLISHED, **change})


@pytest.mark.parametrize("qtype", [GGMLQuantizationType.F32, GGMLQuantizationType.Q8_0],
                         ids=lambda q: q.name)  # fmt: skip
def test_an_arcee_gguf_generates_as_transformers_with_its_weights(
    tmp_path, tiny_model_factory, qtype
):
    """llama.cpp's converter permutes Arcee's Q/K rows as for llama and writes its up and down
    projections alone (no ffn_gate)."""
    folder = tiny_model_factory("arcee")
    llm = tiny_gguf_engine(folder, tmp_path / "arcee.gguf", qtype)
    assert llm.core.arch.architecture == "arcee"
    assert_gguf_generates_as_its_weights(llm, folder, qtype)
