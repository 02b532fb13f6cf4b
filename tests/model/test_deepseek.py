"""DeepSeek-V2 (`DeepseekV2ForCausalLM`) and -V3 (`DeepseekV3ForCausalLM`: Kimi K2's and
Moonlight's too), GGUF `deepseek2`: multi-head latent attention, cached as one KV head of the
latent and its rotated part, beside DeepSeek's experts (V2's float32 softmax within the best
groups by their best score, never renormalized; V3's sigmoid plus a score bias). Their tiny
models in `TINY_ARCHS` are held to transformers' greedy tokens in every setting (transformers
expands the latent into every head's keys and values; inflight absorbs the expansion into the
queries and the output); here, the configs as published, the cache's size, the GGUF files in
llama.cpp's two layouts of the latent's expansion, the multi-token-prediction layer left out,
and what the layer does not compute refused."""

from __future__ import annotations

import dataclasses
import json
import math
import shutil

import pytest
import torch
from gguf import GGMLQuantizationType
from safetensors.torch import load_file, save_file

from inflight import LLM, SamplingParams
from inflight.model.arch import LlamaArchConfig
from inflight.model.deepseek import head_linears
from inflight.model.packed_linear import (
    PackedLinear,
    blocks_serve_every_batch,
    integer_block_packings,
)
from inflight.runner.kv_cache import kv_bytes_per_token
from tests.gguf_files import write_tiny_gguf
from tests.parity import assert_gguf_generates_as_its_weights, random_prompts

Q = GGMLQuantizationType

DEEPSEEK_V2_LITE = {  # DeepSeek-V2-Lite's config.json, the fields the engine reads
    "architectures": ["DeepseekV2ForCausalLM"], "attention_bias": False,
    "first_k_dense_replace": 1, "hidden_size": 2048, "intermediate_size": 10944,
    "kv_lora_rank": 512, "max_position_embeddings": 163840, "model_type": "deepseek_v2",
    "moe_intermediate_size": 1408, "moe_layer_freq": 1, "n_group": 1, "n_routed_experts": 64,
    "n_shared_experts": 2, "norm_topk_prob": False, "num_attention_heads": 16,
    "num_experts_per_tok": 6, "num_hidden_layers": 27, "num_key_value_heads": 16,
    "q_lora_rank": None, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "rms_norm_eps": 1e-06,
    "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 0.707,
                     "mscale_all_dim": 0.707, "original_max_position_embeddings": 4096,
                     "type": "yarn"},
    "rope_theta": 10000, "routed_scaling_factor": 1.0, "scoring_func": "softmax",
    "tie_word_embeddings": False, "topk_group": 1, "topk_method": "greedy", "v_head_dim": 128,
    "vocab_size": 102400,
}  # fmt: skip
DEEPSEEK_V3 = {  # DeepSeek-V3's (and R1's)
    "architectures": ["DeepseekV3ForCausalLM"], "attention_bias": False,
    "first_k_dense_replace": 3, "hidden_size": 7168, "intermediate_size": 18432,
    "kv_lora_rank": 512, "max_position_embeddings": 163840, "model_type": "deepseek_v3",
    "moe_intermediate_size": 2048, "moe_layer_freq": 1, "n_group": 8, "n_routed_experts": 256,
    "n_shared_experts": 1, "norm_topk_prob": True, "num_attention_heads": 128,
    "num_experts_per_tok": 8, "num_hidden_layers": 61, "num_key_value_heads": 128,
    "num_nextn_predict_layers": 1, "q_lora_rank": 1536, "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64, "rms_norm_eps": 1e-06,
    "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0,
                     "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096,
                     "type": "yarn"},
    "rope_theta": 10000, "routed_scaling_factor": 2.5, "scoring_func": "sigmoid",
    "tie_word_embeddings": False, "topk_group": 4, "topk_method": "noaux_tc",
    "v_head_dim": 128, "vocab_size": 129280,
}  # fmt: skip
MOONLIGHT = {  # Moonlight-16B-A3B's: DeepSeek-V3's layers, queries without a latent, no YaRN
    **DEEPSEEK_V3, "first_k_dense_replace": 1, "hidden_size": 2048, "intermediate_size": 11264,
    "max_position_embeddings": 8192, "moe_intermediate_size": 1408, "n_group": 1,
    "n_routed_experts": 64, "n_shared_experts": 2, "num_attention_heads": 16,
    "num_experts_per_tok": 6, "num_hidden_layers": 27, "num_key_value_heads": 16,
    "num_nextn_predict_layers": 0, "q_lora_rank": None, "rms_norm_eps": 1e-05,
    "rope_scaling": None, "rope_theta": 50000.0, "routed_scaling_factor": 2.446,
    "topk_group": 1, "vocab_size": 163842,
}  # fmt: skip

GLM47_FLASH = {  # GLM-4.7-Flash's: DeepSeek-V3's layers under GLM's model type
    "architectures": ["Glm4MoeLiteForCausalLM"], "attention_bias": False,
    "first_k_dense_replace": 1, "hidden_size": 2048, "intermediate_size": 10240,
    "kv_lora_rank": 512, "max_position_embeddings": 202752, "model_type": "glm4_moe_lite",
    "moe_intermediate_size": 1536, "n_group": 1, "n_routed_experts": 64, "n_shared_experts": 1,
    "norm_topk_prob": True, "num_attention_heads": 20, "num_experts_per_tok": 4,
    "num_hidden_layers": 47, "num_key_value_heads": 20, "num_nextn_predict_layers": 1,
    "partial_rotary_factor": 1.0, "q_lora_rank": 768, "qk_nope_head_dim": 192,
    "qk_rope_head_dim": 64, "rms_norm_eps": 1e-05, "rope_scaling": None, "rope_theta": 1000000,
    "routed_scaling_factor": 1.8, "tie_word_embeddings": False, "topk_group": 1,
    "topk_method": "noaux_tc", "v_head_dim": 256, "vocab_size": 154880,
}  # fmt: skip


def test_published_configs_are_read():
    """The cached row is one KV head of the latent and its rotated part (576 wide), RoPE turns
    those 64, and the scores' scale is the 192-wide query head's, times YaRN's mscale_all_dim
    correction squared."""
    lite = LlamaArchConfig.from_hf_config(DEEPSEEK_V2_LITE)
    yarn = (0.1 * 0.707 * math.log(40) + 1) ** 2
    assert (lite.architecture, lite.num_kv_heads, lite.head_dim, lite.rotary_dim,
            lite.kv_lora_rank, lite.q_lora_rank, lite.qk_nope_head_dim, lite.v_head_dim) == (
        "deepseek_v2", 1, 576, 64, 512, 0, 128, 128)  # fmt: skip
    assert lite.attention_scale == pytest.approx(192**-0.5 * yarn)
    assert lite.rope_attention_factor == 1.0  # (mscale and mscale_all_dim cancel)
    assert (lite.num_experts, lite.experts_per_token, lite.dense_layers, lite.router_scoring,
            lite.router_score_bias, lite.float32_router, lite.norm_topk_prob,
            lite.expert_groups, lite.shared_expert_intermediate_size) == (
        64, 6, (0,), "softmax", False, True, False, 1, 2816)  # fmt: skip
    v3 = LlamaArchConfig.from_hf_config(DEEPSEEK_V3)
    assert (v3.architecture, v3.head_dim, v3.q_lora_rank, v3.dense_layers, v3.router_scoring,
            v3.router_score_bias, v3.norm_topk_prob, v3.expert_groups, v3.expert_groups_used,
            v3.expert_group_by_max, v3.routed_scaling_factor, v3.shared_expert_intermediate_size,
            v3.extra_checkpoint_layers) == (
        "deepseek_v3", 576, 1536, (0, 1, 2), "sigmoid", True, True, 8, 4, False, 2.5, 2048,
        1)  # fmt: skip
    assert v3.attention_scale == pytest.approx(192**-0.5 * (0.1 * math.log(40) + 1) ** 2)
    moonlight = LlamaArchConfig.from_hf_config(MOONLIGHT)
    assert (moonlight.q_lora_rank, moonlight.rope_scaling, moonlight.attention_scale,
            moonlight.routed_scaling_factor) == (0, None, 192**-0.5, 2.446)  # fmt: skip
    flash = LlamaArchConfig.from_hf_config(GLM47_FLASH)
    assert (flash.architecture, flash.head_dim, flash.rotary_dim, flash.q_lora_rank,
            flash.qk_nope_head_dim, flash.v_head_dim, flash.dense_layers, flash.router_scoring,
            flash.router_score_bias, flash.routed_scaling_factor, flash.expert_groups,
            flash.extra_checkpoint_layers, flash.attention_scale) == (
        "glm4_moe_lite", 576, 64, 768, 192, 256, (0,), "sigmoid", True, 1.8, 1, 1,
        0.0625)  # fmt: skip
    typed = LlamaArchConfig.from_hf_config(
        {**GLM47_FLASH, "mlp_layer_types": ["dense"] * 2 + ["sparse"] * 45}
    )
    assert typed.dense_layers == (0, 1)
    # DeepSeek-V2's routing within groups, by their best score
    grouped = LlamaArchConfig.from_hf_config(
        {**DEEPSEEK_V2_LITE, "topk_method": "group_limited_greedy", "n_group": 8, "topk_group": 3}
    )
    assert (grouped.expert_groups, grouped.expert_groups_used, grouped.expert_group_by_max) == (
        8, 3, True)  # fmt: skip


@pytest.mark.parametrize(("config", "fields", "says"), [
    (DEEPSEEK_V2_LITE, {"attention_bias": True}, "attention_bias"),
    (DEEPSEEK_V3, {"rope_interleave": False}, "rope_interleave"),
    (DEEPSEEK_V2_LITE, {"moe_layer_freq": 2}, "moe_layer_freq"),
    (DEEPSEEK_V2_LITE, {"topk_method": "noaux_tc"}, "routing 'noaux_tc'"),
    (DEEPSEEK_V3, {"scoring_func": "softmax"}, "over 'softmax' scores"),
    (DEEPSEEK_V3, {"kv_lora_rank": 0}, "kv_lora_rank must be a positive integer"),
    (DEEPSEEK_V3, {"kv_lora_rank": 2**63}, "kv_lora_rank must be a positive integer"),
    (DEEPSEEK_V3, {"qk_rope_head_dim": float("nan")}, "qk_rope_head_dim must be"),
    (DEEPSEEK_V3, {"v_head_dim": True}, "v_head_dim must be"),
    (DEEPSEEK_V3, {"q_lora_rank": -1}, "q_lora_rank must be"),
    (DEEPSEEK_V3, {"qk_nope_head_dim": "128"}, "qk_nope_head_dim must be"),
    (DEEPSEEK_V3, {"n_shared_experts": 2**64}, "shared_expert_intermediate_size"),
    (DEEPSEEK_V3, {"rope_scaling": {**DEEPSEEK_V3["rope_scaling"], "mscale_all_dim": "x"}},
     "mscale_all_dim"),
    (GLM47_FLASH, {"partial_rotary_factor": 0.5}, "rotating 0.5 of its qk_rope_head_dim"),
    (GLM47_FLASH, {"mlp_layer_types": ["dense"]}, "mlp_layer_types must name 47"),
])  # fmt: skip
def test_what_the_layer_does_not_compute_is_refused(config, fields, says):
    with pytest.raises(ValueError, match=says):
        LlamaArchConfig.from_hf_config({**config, **fields})


def test_a_query_temperature_is_refused_beside_latent_attention():
    """A `deepseek2` file may name one (`attention.temperature_scale`: Mistral Large 3's),
    which the latent attention does not apply: refused rather than ignored."""
    v3 = LlamaArchConfig.from_hf_config(DEEPSEEK_V3)
    with pytest.raises(ValueError, match="query temperature with latent attention"):
        dataclasses.replace(v3, query_temperature_beta=0.1, query_temperature_interval=16)


def test_the_official_fp8_checkpoint_is_refused_by_name():
    """DeepSeek-V3's and Kimi K2's own folders hold FP8 blocks: refused, naming them (their
    GGUF files and bf16 conversions load)."""
    fp8 = {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128]}
    with pytest.raises(ValueError, match="quantization 'fp8' is not supported"):
        LlamaArchConfig.from_hf_config({**DEEPSEEK_V3, "quantization_config": fp8})


@pytest.mark.parametrize("family", ["deepseek_v2", "deepseek_v3"])
@pytest.mark.parametrize("backend", ["cpu", "torch"])
def test_the_cache_holds_one_latent_row_a_token_once(tiny_model_factory, family, backend):
    """One KV head of the latent (32) and its rotated part (32) a layer, not 4 heads of 64-wide
    keys and 16-wide values; and held once, the values read out of the keys: 2 layers x 64 x 4
    bytes a token, so a budget holds twice the tokens of a cache with values of their own."""
    budget = 1 << 20
    llm = LLM(str(tiny_model_factory(family)), dtype="float32", attention_backend=backend,
              kv_cache_memory_bytes=budget)  # fmt: skip
    arch, kv = llm.core.arch, llm.core.runner.kv_cache
    assert (arch.num_kv_heads, arch.head_dim) == (1, 64)
    assert kv.values_in_keys
    assert kv_bytes_per_token(arch, torch.float32, keys_alone=True) == 2 * 64 * 4
    assert kv.num_bytes == kv.num_blocks * kv.block_size * 2 * 64 * 4 == budget
    for k_cache, v_cache in kv.layers:  # the values a view of the keys' memory
        assert v_cache.data_ptr() == k_cache.data_ptr()
        assert v_cache.numel() == k_cache.numel() == (kv.num_blocks + 1) * kv.block_size * 64


@pytest.mark.parametrize("mode", ["swap", "recompute"])
def test_requests_preempted_from_a_cache_of_keys_alone_keep_their_tokens(tiny_model_factory, mode):
    """Swapped out and back in (its CPU copies the keys alone too), or recomputed: a request
    preempted from the shared cache gives the tokens it gives with room to spare."""
    roomy = LLM(path := str(tiny_model_factory("deepseek_v3")), dtype="float32")
    prompts = random_prompts(roomy.vocab_size, [20, 9, 31, 14, 25, 17], seed=5)
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    want = [o.outputs[0].token_ids for o in roomy.generate(prompts, params, use_tqdm=False)]
    tight = LLM(path, dtype="float32", num_kv_blocks=12, preemption_mode=mode)
    got = [o.outputs[0].token_ids for o in tight.generate(prompts, params, use_tqdm=False)]
    assert tight.core.runner.kv_cache.values_in_keys
    assert tight.core.scheduler.num_preemptions > 0
    assert (tight.core.scheduler.num_swaps > 0) == (mode == "swap")
    assert got == want


@pytest.mark.parametrize(
    ("family", "qtype", "legacy"),
    [("deepseek_v2", Q.F32, False), ("deepseek_v3", Q.F32, False),
     ("deepseek_v2", Q.Q8_0, False), ("deepseek_v3", Q.Q8_0, False),
     ("deepseek_v2", Q.Q8_0, True), ("deepseek_v3", Q.Q8_0, True),
     ("glm4_moe_lite", Q.Q8_0, False)],
    ids=["v2-f32", "v3-f32", "v2-q8_0", "v3-q8_0", "v2-q8_0-legacy", "v3-q8_0-legacy",
         "glm47-flash-q8_0"],
)  # fmt: skip
def test_a_gguf_generates_as_transformers_with_its_weights(
    tmp_path, tiny_model_factory, family, qtype, legacy
):
    """As llama.cpp's converter writes `deepseek2`: the latent's expansion split into W_UK
    transposed (`attn_k_b`) and W_UV (`attn_v_b`), or whole (`attn_kv_b`, older files); the
    rotated rows in their interleaved pairs (reordered at load, blocks too); V3's router by its
    score bias and sigmoid gating, V2's softmax where the file names none; YaRN's
    mscale_all_dim as a tenth (`yarn_log_multiplier`). Split, each head's W_UK and W_UV
    multiply from their blocks (in one C++ call a layer where the integer kernel takes them)."""
    folder = tiny_model_factory(family)
    path = write_tiny_gguf(folder, tmp_path / f"{family}.gguf", qtype, legacy_kv_b=legacy)
    mode = "off" if qtype == Q.F32 else "int16"
    llm = LLM(str(path), dtype="float32", quantized_activations=mode)
    hf = LLM(str(folder), dtype="float32").core.arch
    arch = llm.core.arch
    # (llama.cpp writes GLM-4.7-Flash as a deepseek2 file: V3's router, the same layers)
    assert arch.architecture == {"glm4_moe_lite": "deepseek_v3"}.get(family, family)
    fields = ("num_kv_heads", "head_dim", "rotary_dim", "kv_lora_rank", "q_lora_rank",
              "qk_nope_head_dim", "v_head_dim", "router_scoring", "router_score_bias",
              "float32_router", "expert_groups", "norm_topk_prob", "dense_layers",
              "shared_expert_intermediate_size")  # fmt: skip
    assert {f: getattr(arch, f) for f in fields} == {f: getattr(hf, f) for f in fields}
    # (the file holds the routed scale in float32)
    assert arch.routed_scaling_factor == pytest.approx(hf.routed_scaling_factor, rel=1e-6)
    assert arch.attention_scale == pytest.approx(hf.attention_scale, rel=1e-6)
    assert arch.rope_attention_factor == pytest.approx(1.0, rel=1e-6)
    assert arch.latent_expansion_per_head is not legacy
    split = None if legacy else (arch.num_heads, arch.qk_nope_head_dim)
    assert_gguf_generates_as_its_weights(llm, folder, qtype, split_latent=split)
    layer = llm.core.loaded.model.layers[0]
    if not legacy and qtype != Q.F32 and blocks_serve_every_batch(torch.float32, 16):
        assert all(isinstance(m, PackedLinear) and m.blocks_only
                   for m in [*layer.k_b_proj, *layer.v_b_proj])  # fmt: skip


def test_the_multi_token_prediction_layer_is_left_out(tmp_path, tiny_model_factory):
    """DeepSeek-V3's checkpoints hold a multi-token-prediction layer after the last
    (`num_nextn_predict_layers`): loading leaves it out, and the model generates as without."""
    folder = tiny_model_factory("deepseek_v3")
    out = tmp_path / "with-mtp"
    shutil.copytree(folder, out)
    config = json.loads((out / "config.json").read_text())
    config["num_nextn_predict_layers"] = 1
    (out / "config.json").write_text(json.dumps(config))
    weights = load_file(out / "model.safetensors")
    hidden = weights["model.norm.weight"].shape[0]
    extra = {name.replace("layers.1.", "layers.2."): t.clone()
             for name, t in weights.items() if "layers.1." in name}  # fmt: skip
    extra |= {"model.layers.2.eh_proj.weight": torch.randn(hidden, 2 * hidden),
              "model.layers.2.enorm.weight": torch.ones(hidden),
              "model.layers.2.hnorm.weight": torch.ones(hidden),
              "model.layers.2.shared_head.norm.weight": torch.ones(hidden)}  # fmt: skip
    save_file({**weights, **extra}, out / "model.safetensors", metadata={"format": "pt"})
    prompts = random_prompts(200, lengths=(3, 17))
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)

    def tokens(path) -> list:
        llm = LLM(str(path), dtype="float32")
        assert llm.core.arch.num_layers == 2
        return [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]

    assert tokens(out) == tokens(folder)


def test_a_bf16_model_keeps_its_router_float32_and_generates(tiny_model_factory):
    """DeepSeek-V2's router has no score bias but is float32 in transformers: so here, in a
    bf16 model, whose latent products run in bf16."""
    llm = LLM(str(tiny_model_factory("deepseek_v2")), dtype="bfloat16")
    sparse = llm.core.loaded.model.layers[1]
    assert sparse.router_weight.dtype == torch.float32 and sparse.router_bias is None
    assert sparse.kv_b_proj.weight.dtype == torch.bfloat16
    out = llm.generate([[5, 6, 7]], SamplingParams(temperature=0, max_tokens=4), use_tqdm=False)
    assert len(out[0].outputs[0].token_ids) == 4


@pytest.mark.parametrize("family", ["deepseek_v2", "deepseek_v3", "glm4_moe_lite"])
def test_two_ranks_over_a_split_file_give_one_ranks_tokens(tmp_path, tiny_model_factory, family):
    """Each rank holds its heads' queries and expansions' rows and every head's latent (one KV
    head, replicated); from a Q8_0 file with the expansion split by head, every rank holds every
    head's W_UK and W_UV blocks (a few MiB a layer) and multiplies its own."""
    path = write_tiny_gguf(tiny_model_factory(family), tmp_path / f"{family}.gguf", Q.Q8_0)
    knobs = {"dtype": "float32", "quantized_activations": "int16", "kv_block_size": 4,
             "max_model_len": 96}  # fmt: skip
    prompts = random_prompts(200, lengths=(3, 17, 40))
    params = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
    one = LLM(str(path), **knobs)
    expected = [o.outputs[0].token_ids for o in one.generate(prompts, params, use_tqdm=False)]
    two = LLM(str(path), tensor_parallel_size=2, **knobs)
    assert [o.outputs[0].token_ids for o in two.generate(prompts, params, use_tqdm=False)] == (
        expected
    )


@pytest.mark.parametrize("bits", [8, 16])
@pytest.mark.parametrize(("qtype", "rows", "columns"), [(Q.Q8_0, 64, 32), (Q.Q4_K, 16, 256),
                                                        (Q.Q5_0, 48, 64)])  # fmt: skip
def test_heads_in_one_call_give_each_heads_linear_bit_for_bit(qtype, rows, columns, bits):
    """`head_linears`' one C++ call over every head's blocks gives what each head's linear
    gives alone, for a decode row and a prompt's rows."""
    if not blocks_serve_every_batch(torch.float32, bits):
        pytest.skip(f"{bits}-bit activations over blocks do not take every batch here")
    from gguf.quants import quantize

    from tests.gguf_files import quantize_any

    gen = torch.Generator().manual_seed(0)
    linears = []
    for _ in range(4):
        weight = torch.randn(rows, columns, generator=gen) * 0.02
        raw = quantize_any(weight.numpy(), qtype) if qtype == Q.Q4_K else quantize(
            weight.numpy(), qtype)  # fmt: skip
        blocks = torch.from_numpy(raw).view(torch.uint8).reshape(rows, columns // 32, -1)
        if qtype == Q.Q4_K:
            blocks = blocks.reshape(rows, columns // 256, -1)
        linear = torch.nn.Linear(columns, rows, bias=False)
        linear.register_parameter("weight", None)
        linears.append(PackedLinear(linear, 1 << 30, blocks, bits))
    heads = torch.nn.ModuleList(linears)
    assert all(m.blocks_only and m.activation_bits == bits for m in heads)
    for tokens in (1, 37):
        x = torch.randn(tokens, 4, columns, generator=gen)
        alone = torch.stack([m(x[:, h].contiguous()) for h, m in enumerate(heads)], dim=1)
        packings = integer_block_packings(heads)
        assert packings is not None and packings[1] == bits
        assert torch.equal(head_linears(heads, packings, x, False), alone)
