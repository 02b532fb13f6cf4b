"""EXAONE 4 (`Exaone4ForCausalLM`, GGUF `exaone4`): Qwen3's layer with norms of the sublayers'
outputs alone, and where the model has a window, three windowed layers with RoPE to each global
one without. The tiny EXAONE 4 of `TINY_ARCHS` (four layers, the 32B's pattern) is held to
transformers' greedy tokens in every setting and its fused layer loop to the Python one; here,
configs as published and the GGUF against transformers with the file's weights."""

from __future__ import annotations

import pytest
from gguf import GGMLQuantizationType

from inflight import LLM
from inflight.model.arch import LlamaArchConfig
from tests.gguf_files import write_tiny_gguf
from tests.parity import assert_gguf_generates_as_its_weights

BASE = {  # EXAONE 4.0's config.json, the fields the engine reads
    "architectures": ["Exaone4ForCausalLM"], "vocab_size": 102400, "hidden_size": 2048,
    "intermediate_size": 4096, "num_hidden_layers": 30, "num_attention_heads": 32,
    "num_key_value_heads": 8, "head_dim": 64, "max_position_embeddings": 65536,
    "rope_theta": 1000000.0, "rms_norm_eps": 1e-05, "tie_word_embeddings": True,
    "sliding_window": None,
}  # fmt: skip


def test_a_model_without_a_window_rotates_every_layer():
    arch = LlamaArchConfig.from_hf_config(BASE)  # the 1.2B's shape
    assert arch.architecture == "exaone4" and arch.sliding_window is None
    assert (arch.full_attention_layers, arch.nope_layers) == ((), ())


@pytest.mark.parametrize("spelling", [
    {"layer_types": ["sliding_attention"] * 3 + ["full_attention"]},
    {"sliding_window_pattern": 4}, {"sliding_window_pattern": "LLLG"}, {},
])  # fmt: skip
def test_a_windowed_models_global_layers_go_without_rope(spelling):
    config = {**BASE, "num_hidden_layers": 8, "sliding_window": 4096, **spelling}
    if "layer_types" in spelling:
        config["layer_types"] = spelling["layer_types"] * 2
    arch = LlamaArchConfig.from_hf_config(config)
    assert arch.full_attention_layers == arch.nope_layers == (3, 7)
    assert [arch.layer_window(i) for i in range(4)] == [4096, 4096, 4096, None]


@pytest.mark.parametrize("pattern", [0, "LLXG", True, ""])
def test_a_pattern_that_names_no_layers_is_refused(pattern):
    config = {**BASE, "sliding_window": 4096, "sliding_window_pattern": pattern}
    with pytest.raises(ValueError, match="sliding_window_pattern"):
        LlamaArchConfig.from_hf_config(config)


@pytest.mark.parametrize("qtype", [GGMLQuantizationType.F32, GGMLQuantizationType.Q8_0],
                         ids=lambda q: q.name)  # fmt: skip
def test_an_exaone4_gguf_generates_as_transformers_with_its_weights(
    tmp_path, tiny_model_factory, qtype
):
    """llama.cpp's converter writes the window and the windowed layers' flags, names the output
    norms as Gemma's, and leaves Q/K rows as they are (NeoX-style RoPE). transformers reads no
    exaone4 GGUF: the reference is the folder's model with the file's rounded weights."""
    folder = tiny_model_factory("exaone4")
    path = write_tiny_gguf(folder, tmp_path / "exaone4.gguf", qtype)
    llm = LLM(str(path), dtype="float32", quantized_activations="off")
    arch = llm.core.arch
    assert (arch.architecture, arch.sliding_window, arch.nope_layers) == ("exaone4", 24, (3,))
    assert_gguf_generates_as_its_weights(llm, folder, qtype)
