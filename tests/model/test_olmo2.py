"""OLMo 2 (`Olmo2ForCausalLM`, GGUF `olmo2`): EXAONE 4's layer (norms of the sublayers' outputs
alone) with query and key norms across all heads. The tiny OLMo 2 of `TINY_ARCHS` is held to
transformers' greedy tokens in every setting and its fused layer loop to the Python one; here,
the config as published, the GGUFs against transformers with the file's weights (OLMo 3's
too: OLMo 2's layers, three windowed with their own unscaled RoPE to each global one), and
tensor parallelism refused (a rank lacks the other ranks' heads its norms span)."""

from __future__ import annotations

import pytest
from gguf import GGMLQuantizationType

from inflight import LLM
from inflight.errors import ConfigError
from inflight.model.arch import LlamaArchConfig
from inflight.parallel.shard import check_tensor_parallel
from tests.gguf_files import write_tiny_gguf
from tests.parity import assert_gguf_generates_as_its_weights

PUBLISHED = {  # OLMo-2-0425-1B's config.json, the fields the engine reads
    "architectures": ["Olmo2ForCausalLM"], "vocab_size": 100352, "hidden_size": 2048,
    "intermediate_size": 8192, "num_hidden_layers": 16, "num_attention_heads": 16,
    "num_key_value_heads": 16, "max_position_embeddings": 4096, "rope_theta": 500000,
    "rms_norm_eps": 1e-06, "tie_word_embeddings": False, "attention_bias": False,
}  # fmt: skip


def test_a_published_olmo2_config_is_read():
    arch = LlamaArchConfig.from_hf_config(PUBLISHED)
    assert (arch.architecture, arch.qk_norms_span_heads, arch.sliding_window) == (
        "olmo2", True, None
    )  # fmt: skip
    assert not LlamaArchConfig.from_hf_config({**PUBLISHED, "architectures": [
        "Exaone4ForCausalLM"]}).qk_norms_span_heads  # fmt: skip
    # OLMo 3's: every fourth layer global by default, the windowed ones' RoPE base their own
    olmo3 = LlamaArchConfig.from_hf_config({
        **PUBLISHED, "architectures": ["Olmo3ForCausalLM"], "sliding_window": 4096,
        "rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 5e5},
                            "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}},
    })  # fmt: skip
    assert (olmo3.architecture, olmo3.qk_norms_span_heads, olmo3.local_rope_theta) == (
        "olmo3", True, 1e4)  # fmt: skip
    assert olmo3.full_attention_layers == (3, 7, 11, 15) and olmo3.nope_layers == ()


def test_tensor_parallelism_is_refused_before_any_rank_starts(tiny_model_factory):
    arch = LlamaArchConfig.from_hf_config(PUBLISHED)
    check_tensor_parallel(arch, 1)
    with pytest.raises(ValueError, match="norms span all heads at once"):
        check_tensor_parallel(arch, 2)
    with pytest.raises((ConfigError, ValueError), match="norms span all heads at once"):
        LLM(str(tiny_model_factory("olmo2")), tensor_parallel_size=2)


@pytest.mark.parametrize("qtype", [GGMLQuantizationType.F32, GGMLQuantizationType.Q8_0],
                         ids=lambda q: q.name)  # fmt: skip
def test_an_olmo2_gguf_generates_as_transformers_with_its_weights(
    tmp_path, tiny_model_factory, qtype
):
    """llama.cpp's converter names the output norms as Gemma's, the q/k norms attn_q_norm and
    attn_k_norm (as wide as all heads), and leaves Q/K rows as they are (NeoX-style RoPE)."""
    folder = tiny_model_factory("olmo2")
    path = write_tiny_gguf(folder, tmp_path / "olmo2.gguf", qtype)
    llm = LLM(str(path), dtype="float32", quantized_activations="off")
    assert llm.core.arch.architecture == "olmo2"
    assert_gguf_generates_as_its_weights(llm, folder, qtype)


def test_an_olmo3_gguf_generates_as_transformers_with_its_weights(tmp_path, tiny_model_factory):
    """OLMo 3's file is an olmo2 one with a window: the windowed layers' flags, their own RoPE
    base (`rope.freq_base_swa`), unscaled, beside YaRN-scaled global layers."""
    folder = tiny_model_factory("olmo3")
    path = write_tiny_gguf(folder, tmp_path / "olmo3.gguf", GGMLQuantizationType.F32)
    llm = LLM(str(path), dtype="float32", quantized_activations="off")
    arch = llm.core.arch
    assert (arch.architecture, arch.sliding_window, arch.full_attention_layers) == (
        "olmo3", 24, (3,))  # fmt: skip
    assert arch.local_rope_theta == 5000.0 and arch.rope_scaling_dict["rope_type"] == "yarn"
    assert_gguf_generates_as_its_weights(llm, folder, GGMLQuantizationType.F32)
