"""SmolLM3 (`SmolLM3ForCausalLM`, GGUF `smollm3`): the Llama decoder with every fourth layer
attending without RoPE ("NoPE"). The tiny SmolLM3 of `TINY_ARCHS` (four layers, the last without
RoPE) is held to transformers' greedy tokens in every setting and its fused layer loop to the
Python one; here, the config as published and the GGUF against the folder."""

from __future__ import annotations

import pytest
from gguf import GGMLQuantizationType

from inflight import LLM
from inflight.model.arch import LlamaArchConfig
from tests.gguf_files import write_tiny_gguf
from tests.parity import assert_gguf_generates_as_its_weights

PUBLISHED = {  # SmolLM3-3B's config.json, the fields the engine reads
    "architectures": ["SmolLM3ForCausalLM"], "vocab_size": 128256, "hidden_size": 2048,
    "intermediate_size": 11008, "num_hidden_layers": 36, "num_attention_heads": 16,
    "num_key_value_heads": 4, "max_position_embeddings": 65536, "rope_theta": 5000000.0,
    "rms_norm_eps": 1e-06, "tie_word_embeddings": True, "use_sliding_window": False,
    "sliding_window": None, "no_rope_layer_interval": 4,
    "no_rope_layers": [0 if (i + 1) % 4 == 0 else 1 for i in range(36)],
}  # fmt: skip


def test_a_published_smollm3_config_is_read():
    arch = LlamaArchConfig.from_hf_config(PUBLISHED)
    assert arch.architecture == "smollm3" and arch.sliding_window is None
    assert arch.nope_layers == tuple(range(3, 36, 4))
    assert [arch.layer_rotary(i) for i in range(8)] == [True] * 3 + [False] + [True] * 3 + [False]
    # without the list, every `no_rope_layer_interval`-th layer, as transformers builds it
    unlisted = {**PUBLISHED, "no_rope_layers": None, "no_rope_layer_interval": 3}
    assert LlamaArchConfig.from_hf_config(unlisted).nope_layers == tuple(range(2, 36, 3))


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"use_sliding_window": True, "sliding_window": 4096}, "SmolLM3 per-layer sliding"),
        ({"no_rope_layers": [1] * 35}, "no_rope_layers must be 36 flags"),
        ({"no_rope_layers": [2] * 36}, "no_rope_layers must be 36 flags"),
        ({"no_rope_layers": None, "no_rope_layer_interval": 0}, "no_rope_layer_interval 0"),
    ],
)
def test_smollm3_variants_not_built_are_refused(change, message):
    with pytest.raises(ValueError, match=message):
        LlamaArchConfig.from_hf_config({**PUBLISHED, **change})


@pytest.mark.parametrize("qtype", [GGMLQuantizationType.F32, GGMLQuantizationType.Q8_0],
                         ids=lambda q: q.name)  # fmt: skip
def test_a_smollm3_gguf_generates_as_transformers_with_its_weights(
    tmp_path, tiny_model_factory, qtype
):
    """llama.cpp's converter permutes SmolLM3's Q/K rows as for llama and writes no key for the
    layers without RoPE: every fourth, which the loader assumes as llama.cpp does. transformers
    reads no smollm3 GGUF: the reference is the folder's model with the file's rounded weights."""
    folder = tiny_model_factory("smollm3")
    path = write_tiny_gguf(folder, tmp_path / "smollm3.gguf", qtype)
    llm = LLM(str(path), dtype="float32", quantized_activations="off")
    assert (llm.core.arch.architecture, llm.core.arch.nope_layers) == ("smollm3", (3,))
    assert_gguf_generates_as_its_weights(llm, folder, qtype)
