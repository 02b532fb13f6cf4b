"""OLMo 2 (`Olmo2ForCausalLM`, GGUF `olmo2`): EXAONE 4's layer (norms of the sublayers' outputs
alone) with query and key norms across all heads. The tiny OLMo 2 of `TINY_ARCHS` is held to
transformers' greedy tokens in every setting and its fused layer loop to the Python one; here,
the config as published, the GGUFs against transformers with the file's weights (OLMo 3's
too: OLMo 2's layers, three windowed with their own unscaled RoPE to each global one), and
ranks that share KV heads normalizing every head together."""

from __future__ import annotations

import pytest
from gguf import GGMLQuantizationType

from inflight import LLM, SamplingParams
from inflight.model.arch import LlamaArchConfig
from inflight.parallel.shard import check_tensor_parallel
from tests.gguf_files import write_tiny_gguf
from tests.parity import assert_gguf_generates_as_its_weights, random_prompts

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


def test_four_ranks_two_to_a_kv_head_normalize_all_heads_as_one(tiny_model_factory):
    """Split over ranks, a norm over every head gathers the ranks' heads: with 4 ranks over 2
    KV heads (two ranks hold each, one writes it), the greedy tokens of one rank, the query
    and key norms whole on every rank, in the fused C++ loop (its own gather) and in Python."""
    check_tensor_parallel(LlamaArchConfig.from_hf_config(PUBLISHED), 16)
    folder = str(tiny_model_factory("olmo2"))
    knobs = {"dtype": "float32", "max_num_batched_tokens": 32, "max_model_len": 96}
    prompts = random_prompts(400, lengths=(1, 7, 40, 60), seed=2)
    params = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
    one = LLM(folder, **knobs).generate(prompts, params, use_tqdm=False)
    split = LLM(folder, tensor_parallel_size=4, **knobs)
    layer = split.core.loaded.model.layers[0]
    assert layer.q_norm.weight.shape == (64,) and layer.k_norm.weight.shape == (32,)
    assert split.core.loaded.model.fused_layers.whole_qk_norms == [4, 2, 0, 4]
    got = split.generate(prompts, params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in got] == [o.outputs[0].token_ids for o in one]
    split.core.loaded.model.fused_layers = None  # (rank 0's layers in Python, the others' not)
    got = split.generate(prompts, params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in got] == [o.outputs[0].token_ids for o in one]
    split.core.workers.close()


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
