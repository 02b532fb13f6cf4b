"""ERNIE 4.5 (`Ernie4_5ForCausalLM`, GGUF `ernie4_5`): the Llama decoder whose RoPE rotates
interleaved pairs over all of each head, reordered at load into halves (`rotary_pairs.py`).
The tiny ERNIE 4.5 of `TINY_ARCHS` is held to transformers' greedy tokens in every setting, its
fused layer loop to the Python one and two TP ranks to one; here, the config as published (its
biased variant refused) and the GGUF against transformers with the file's weights, its q/k
weights from their blocks."""

from __future__ import annotations

import pytest
from gguf import GGMLQuantizationType

from inflight.model.arch import LlamaArchConfig
from tests.gguf_files import tiny_gguf_engine
from tests.parity import assert_gguf_generates_as_its_weights

PUBLISHED = {  # ERNIE-4.5-0.3B's config.json, the fields the engine reads
    "architectures": ["Ernie4_5ForCausalLM"], "vocab_size": 103424, "hidden_size": 1024,
    "intermediate_size": 3072, "num_hidden_layers": 18, "num_attention_heads": 16,
    "num_key_value_heads": 2, "head_dim": 128, "max_position_embeddings": 131072,
    "rope_theta": 500000, "rms_norm_eps": 1e-05, "use_bias": False, "tie_word_embeddings": True,
}  # fmt: skip


def test_a_published_ernie4_5_config_is_read():
    arch = LlamaArchConfig.from_hf_config(PUBLISHED)
    assert (arch.architecture, arch.rope_dim, arch.qkv_bias) == ("ernie4_5", 128, False)
    with pytest.raises(ValueError, match="use_bias"):
        LlamaArchConfig.from_hf_config({**PUBLISHED, "use_bias": True})


@pytest.mark.parametrize("qtype", [GGMLQuantizationType.F32, GGMLQuantizationType.Q8_0],
                         ids=lambda q: q.name)  # fmt: skip
def test_an_ernie4_5_gguf_generates_as_transformers_with_its_weights(
    tmp_path, tiny_model_factory, qtype
):
    """llama.cpp's converter keeps the checkpoint's interleaved rows (RoPE's "normal" mode); in
    float32 with 16-bit activations the Q8_0 file's q/k weights stay as their blocks, whose rows
    the loader reorders."""
    folder = tiny_model_factory("ernie4_5")
    llm = tiny_gguf_engine(folder, tmp_path / "ernie4_5.gguf", qtype)
    assert llm.core.arch.architecture == "ernie4_5"
    assert_gguf_generates_as_its_weights(llm, folder, qtype)
