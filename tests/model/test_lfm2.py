"""LFM2 (`Lfm2ForCausalLM`): gated short convolutions in most layers, Qwen3's attention in the
others; LFM2-MoE (`Lfm2MoeForCausalLM`) with experts after its first dense MLPs. The tiny LFM2
of `TINY_ARCHS` (convolutions in layers 0, 2 and 3) is held to transformers' greedy tokens in
every setting that changes the computation, and what its state must survive in
test_state_layers; here, the state's shape, the configs, the GGUF files and two ranks."""

from __future__ import annotations

import pytest
import torch
from gguf import GGMLQuantizationType

from inflight import LLM
from inflight.errors import ModelLoadError
from inflight.model.arch import LlamaArchConfig
from tests.gguf_files import write_tiny_gguf
from tests.parity import (
    assert_gguf_generates_as_its_weights,
    greedy_reference,
    greedy_tokens,
)

PUBLISHED = {  # LFM2-1.2B's config.json, the fields the engine reads
    "architectures": ["Lfm2ForCausalLM"], "block_auto_adjust_ff_dim": True, "block_dim": 2048,
    "block_ff_dim": 12288, "block_ffn_dim_multiplier": 1.0, "block_multiple_of": 256,
    "bos_token_id": 1, "conv_L_cache": 3, "conv_bias": False, "eos_token_id": 7,
    "full_attn_idxs": [2, 5, 8, 10, 12, 14], "hidden_size": 2048,
    "max_position_embeddings": 128000, "model_type": "lfm2", "norm_eps": 1e-05,
    "num_attention_heads": 32, "num_hidden_layers": 16, "num_key_value_heads": 8,
    "rope_theta": 1000000.0, "vocab_size": 65536,
}  # fmt: skip


def test_a_published_lfm2_config_is_read():
    arch = LlamaArchConfig.from_hf_config(PUBLISHED)
    assert arch.architecture == "lfm2" and arch.conv_kernel == 3
    assert arch.kv_layers == (2, 5, 8, 10, 12, 14)
    assert arch.conv_layers == (0, 1, 3, 4, 6, 7, 9, 11, 13, 15)
    # 12,288 * 2/3 rounded up to a multiple of 256, as transformers (and llama.cpp's n_ff: 8,192)
    assert arch.intermediate_size == 8192
    assert (arch.rms_norm_eps, arch.rope_theta, arch.tie_word_embeddings) == (1e-5, 1e6, True)
    assert (arch.head_dim, arch.num_kv_heads) == (64, 8)
    # `layer_types` (transformers 5's saved configs) says the same
    types = ["full_attention" if i in PUBLISHED["full_attn_idxs"] else "conv" for i in range(16)]
    same = LlamaArchConfig.from_hf_config({**PUBLISHED, "full_attn_idxs": None,
                                           "layer_types": types})  # fmt: skip
    assert same.kv_layers == arch.kv_layers


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"conv_bias": True}, "biased convolutions"),
        ({"conv_L_cache": 1}, "conv_L_cache 1"),
        ({"conv_L_cache": 2**64}, "conv_L_cache"),
        ({"conv_L_cache": 3.5}, "conv_L_cache"),
        ({"full_attn_idxs": []}, "convolution layers alone"),
        ({"full_attn_idxs": "all"}, "full_attn_idxs"),
        ({"layer_types": ["conv"] * 15}, "layer_types must name 16"),
        ({"layer_types": ["mamba"] * 16}, "layer_types must name 16"),
        ({"block_ffn_dim_multiplier": float("nan")}, "block_ffn_dim_multiplier"),
        ({"block_ffn_dim_multiplier": float("inf")}, "block_ffn_dim_multiplier"),
        ({"block_multiple_of": 0}, "block_multiple_of"),
        ({"block_ff_dim": -1}, "intermediate_size"),
        ({"block_ff_dim": 2**64}, "intermediate_size"),
        ({"num_hidden_layers": 2**63}, "layers"),
    ],
)
def test_lfm2_configs_not_built_or_broken_are_refused(change, message):
    with pytest.raises(ValueError, match=message):
        LlamaArchConfig.from_hf_config({**PUBLISHED, **change})


@pytest.fixture(scope="module")
def lfm2(tiny_model_factory):
    """The tiny LFM2's folder, 16 prompts and transformers' greedy tokens for them."""
    folder = tiny_model_factory("lfm2")
    return folder, *greedy_reference(folder)


def test_the_kv_cache_holds_the_attention_layers_alone(lfm2):
    folder, *_ = lfm2
    llm = LLM(str(folder), dtype="float32", num_kv_blocks=64)
    arch = llm.core.arch
    assert arch.kv_layers == (1, 4)
    assert len(llm.core.kv_cache.layers) == 2
    per_token = 2 * 2 * arch.num_kv_heads * arch.head_dim * 4  # K and V of 2 layers, float32
    assert llm.core.kv_cache.num_bytes == per_token * 64 * llm.core.kv_cache.block_size
    state = llm.core.runner.conv_state
    assert len(state.layers) == 3  # layers 0, 2 and 3
    # a row a slot, a zero and a scratch row, a row a saved state (one a seat)
    assert state.num_snapshots == state.num_slots == 64
    assert state.layers[0].shape == (2 * state.num_slots + 2, 2, arch.hidden_size)


@pytest.mark.parametrize("qtype", [GGMLQuantizationType.F32, GGMLQuantizationType.Q8_0],
                         ids=lambda q: q.name)  # fmt: skip
def test_an_lfm2_gguf_generates_as_transformers_with_its_weights(tmp_path, lfm2, qtype):
    """An `lfm2` file as llama.cpp's converter writes it: a KV head count per layer (0 for a
    convolution), the kernel in `shortconv.l_cache`, the kernels [K, H] in F32, the final norm
    as `token_embd_norm`. transformers reads no lfm2 GGUF: the reference is the folder's model
    with the file's rounded weights."""
    folder, *_ = lfm2
    path = write_tiny_gguf(folder, tmp_path / "lfm2.gguf", qtype)
    llm = LLM(str(path), dtype="float32", quantized_activations="off")
    arch = llm.core.arch
    assert (arch.architecture, arch.conv_layers, arch.conv_kernel) == ("lfm2", (0, 2, 3), 3)
    assert arch.kv_layers == (1, 4) and arch.intermediate_size == 96
    assert_gguf_generates_as_its_weights(llm, folder, qtype)


def test_an_lfm2_gguf_without_its_layer_kinds_is_refused(tmp_path, lfm2):
    folder, *_ = lfm2

    def one_count(writer) -> None:  # a single KV head count: no layer said to be a convolution
        writer.kv_data[0].pop("lfm2.attention.head_count_kv")
        writer.add_head_count_kv(2)

    path = write_tiny_gguf(folder, tmp_path / "lfm2.gguf", GGMLQuantizationType.F32,
                           metadata=one_count)  # fmt: skip
    with pytest.raises(ModelLoadError, match="head_count_kv must list each layer's KV heads"):
        LLM(str(path), dtype="float32")


def test_an_lfm2_gguf_split_over_two_ranks_gives_one_ranks_tokens(tmp_path, lfm2):
    """Each rank holds its channels of every convolution (B, C and x rows, kernels, out_proj's
    inputs: whole Q8_0 blocks) and their state, in the slots rank 0 assigns."""
    folder, prompts, max_tokens, _ = lfm2
    path = str(write_tiny_gguf(folder, tmp_path / "lfm2.gguf", GGMLQuantizationType.Q8_0))
    knobs = {"dtype": "float32", "quantized_activations": "int16", "max_num_seqs": 4,
             "prefill_chunk_size": 16, "max_num_batched_tokens": 64}  # fmt: skip
    expected = greedy_tokens(LLM(path, **knobs), prompts[:8], max_tokens[:8])
    split = LLM(path, tensor_parallel_size=2, **knobs)
    assert split.core.loaded.model.layers[0].in_proj.blocks_only  # (no float copy)
    assert split.core.runner.conv_state.layers[0].shape[-1] == 32  # half of 64 channels
    assert greedy_tokens(split, prompts[:8], max_tokens[:8]) == expected
    split.core.workers.close()


MOE = {  # LFM2-8B-A1B's widths and routing (a config's fields the engine reads)
    "architectures": ["Lfm2MoeForCausalLM"], "model_type": "lfm2_moe", "vocab_size": 65536,
    "hidden_size": 2048, "intermediate_size": 7168, "moe_intermediate_size": 1792,
    "num_hidden_layers": 24, "num_attention_heads": 32, "num_key_value_heads": 8,
    "num_experts": 32, "num_experts_per_tok": 4, "num_dense_layers": 2, "use_expert_bias": True,
    "norm_topk_prob": True, "routed_scaling_factor": 1.0, "conv_L_cache": 3, "norm_eps": 1e-5,
    "layer_types": ["full_attention" if i in (2, 6, 10, 14, 18, 21) else "conv"
                    for i in range(24)],
    "max_position_embeddings": 128000, "rope_theta": 1000000.0,
}  # fmt: skip


def test_an_lfm2_moe_config_is_read():
    arch = LlamaArchConfig.from_hf_config(MOE)
    assert arch.architecture == "lfm2_moe" and arch.kv_layers == (2, 6, 10, 14, 18, 21)
    assert arch.intermediate_size == 7168  # (not adjusted, as LFM2's is)
    experts = (arch.num_experts, arch.experts_per_token, arch.expert_intermediate_size)
    assert experts == (32, 4, 1792)
    assert arch.dense_layers == (0, 1) and arch.norm_topk_prob
    assert (arch.router_scoring, arch.router_score_bias, arch.router_norm_epsilon) == (
        "sigmoid",
        True,
        1e-6,
    )
    with pytest.raises(ValueError, match="without its expert bias"):
        LlamaArchConfig.from_hf_config({**MOE, "use_expert_bias": False})
    with pytest.raises(ValueError, match="num_dense_layers"):
        LlamaArchConfig.from_hf_config({**MOE, "num_dense_layers": "2"})


@pytest.mark.parametrize("qtype", [GGMLQuantizationType.F32, GGMLQuantizationType.Q8_0],
                         ids=lambda q: q.name)  # fmt: skip
def test_an_lfm2_moe_gguf_generates_as_transformers_with_its_weights(
    tmp_path, tiny_model_factory, qtype
):
    """An `lfm2moe` file as llama.cpp's converter writes it: LFM2's layers, a leading dense
    block, stacked experts, a sigmoid router and its bias (`exp_probs_b`)."""
    folder = tiny_model_factory("lfm2_moe")
    path = write_tiny_gguf(folder, tmp_path / "lfm2moe.gguf", qtype)
    llm = LLM(str(path), dtype="float32", quantized_activations="off")
    arch = llm.core.arch
    assert (arch.architecture, arch.conv_layers, arch.dense_layers) == ("lfm2_moe", (0, 2, 3),
                                                                        (0,))  # fmt: skip
    assert (arch.router_score_bias, arch.norm_topk_prob, arch.router_norm_epsilon) == (
        True,
        True,
        1e-6,
    )
    assert_gguf_generates_as_its_weights(llm, folder, qtype)


def test_the_convolution_state_is_counted_before_loading(lfm2, monkeypatch):
    """The pre-load memory check counts the slots' state beside the KV pool, the states saved
    for the prefix cache and speculation's draft rows: what `ConvState` then holds, byte for
    byte."""
    import inflight.engine.engine_core as engine_core
    from inflight.engine.engine_core import state_snapshot_rows
    from inflight.runner.conv_state import conv_state_bytes

    checked = []
    check = engine_core.check_memory_fits

    def counting(path, weights, pool, swap=0, state=0):
        checked.append((pool, state))
        return check(path, weights, pool, swap, state)

    monkeypatch.setattr(engine_core, "check_memory_fits", counting)
    folder, *_ = lfm2
    held = []
    for knobs in ({}, {"enable_prefix_caching": False}, {"num_speculative_tokens": 3}):
        llm = LLM(str(folder), dtype="float32", max_num_seqs=5, num_kv_blocks=64, **knobs)
        state = llm.core.runner.conv_state
        assert state_snapshot_rows(llm.core.config, llm.core.arch) == state.num_snapshots
        assert state.num_snapshots == (0 if knobs.get("enable_prefix_caching") is False else 5)
        assert state.num_drafts == knobs.get("num_speculative_tokens", 0)
        assert conv_state_bytes(llm.core.arch, 5, torch.float32, state.num_snapshots,
                                state.num_drafts) == state.num_bytes > 0  # fmt: skip
        held.append(state.num_bytes)
    # (the same KV pool each time, the state beside it)
    assert {pool for pool, _ in checked} == {checked[0][0]}
    assert [state for _, state in checked] == held
    # state rows past the memory are refused before loading, naming them and their knobs
    monkeypatch.setattr(engine_core, "load_model", lambda *a, **k: pytest.fail("loaded"))
    want = r"GiB for its layers' state rows, .* max_num_seqs, num_saved_states"
    with pytest.raises(ModelLoadError, match=want):
        LLM(str(folder), dtype="float32", num_kv_blocks=64, num_saved_states=2**50)
    assert conv_state_bytes(LlamaArchConfig.from_hf_config({**PUBLISHED, "full_attn_idxs": None}),
                            5, torch.float32) == 0  # fmt: skip
