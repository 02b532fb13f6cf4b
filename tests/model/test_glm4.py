"""GLM-4 (`Glm4ForCausalLM`, GGUF `glm4`): Gemma's four norms a layer, q/k/v biases, gate and up
fused in the checkpoint, and RoPE in interleaved pairs over half of each head, reordered at load
into the halves the engine rotates. The tiny GLM-4 of `TINY_ARCHS` is held to transformers'
greedy tokens in every setting and its fused layer loop to the Python one; here, the row order,
the config as published, and the GGUF against transformers with the file's weights, its q/k
weights multiplied from their blocks (whose rows the loader reorders itself)."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType

from inflight.model.arch import LlamaArchConfig
from inflight.model.rotary_pairs import pairs_to_halves
from tests.gguf_files import tiny_gguf_engine
from tests.parity import assert_gguf_generates_as_its_weights

PUBLISHED = {  # GLM-4-9B-0414's config.json, the fields the engine reads
    "architectures": ["Glm4ForCausalLM"], "vocab_size": 151552, "hidden_size": 4096,
    "intermediate_size": 13696, "num_hidden_layers": 40, "num_attention_heads": 32,
    "num_key_value_heads": 2, "head_dim": 128, "max_position_embeddings": 32768,
    "rope_theta": 10000.0, "partial_rotary_factor": 0.5, "rms_norm_eps": 1e-05,
    "attention_bias": True, "tie_word_embeddings": False,
}  # fmt: skip


def test_rotary_pairs_become_halves_head_by_head():
    # two heads of 6 dimensions, the first 4 rotary: (0 1)(2 3) -> 0 2 | 1 3, then 4 5 as they are
    assert pairs_to_halves(2, 6, 4).tolist() == [0, 2, 1, 3, 4, 5, 6, 8, 7, 9, 10, 11]
    order = pairs_to_halves(3, 8, 8)
    assert sorted(order.tolist()) == list(range(24)) and not np.array_equal(order, np.arange(24))


def test_a_published_glm4_config_is_read():
    arch = LlamaArchConfig.from_hf_config(PUBLISHED)
    assert (arch.architecture, arch.rotary_dim, arch.qkv_bias, arch.head_dim) == (
        "glm4", 64, True, 128)  # fmt: skip


@pytest.mark.parametrize("qtype", [GGMLQuantizationType.F32, GGMLQuantizationType.Q8_0],
                         ids=lambda q: q.name)  # fmt: skip
def test_a_glm4_gguf_generates_as_transformers_with_its_weights(
    tmp_path, tiny_model_factory, qtype
):
    """llama.cpp's converter keeps the checkpoint's interleaved rows (RoPE's "normal" mode),
    names the norms attn_norm, post_attention_norm, ffn_norm and post_ffw_norm, and writes gate
    and up as one ffn_up. In float32 with 16-bit activations the Q8_0 file's q/k weights stay
    as their blocks, whose rows the loader reorders."""
    folder = tiny_model_factory("glm4")
    llm = tiny_gguf_engine(folder, tmp_path / "glm4.gguf", qtype)
    arch = llm.core.arch
    assert (arch.architecture, arch.rotary_dim, arch.qkv_bias) == ("glm4", 16, True)
    assert_gguf_generates_as_its_weights(llm, folder, qtype)
