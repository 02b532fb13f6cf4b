"""Tiny models written as llama.cpp-style GGUF files, for the loading and kernel tests."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from gguf import (
    ExpertGatingFuncType,
    GGMLQuantizationType,
    GGUFWriter,
    LlamaFileType,
    RopeScalingType,
)
from gguf.quants import quantize

HF_TO_GGUF = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
    "model.embedding_norm.weight": "token_embd_norm.weight",  # (LFM2's final norm)
}
LAYER_TO_GGUF = {
    "input_layernorm": "attn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.qkv_proj": "attn_qkv",
    "mlp.gate_up_proj": "ffn_up",
    "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm",
    "self_attn.query_layernorm": "attn_q_norm",  # (Hunyuan's names of them)
    "self_attn.key_layernorm": "attn_k_norm",
    "self_attn.o_proj": "attn_output",
    "post_attention_layernorm": "ffn_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
    "mlp.shared_expert.gate_proj": "ffn_gate_shexp",  # (Qwen2-MoE's; GLM-4.5's shared_experts)
    "mlp.shared_expert.up_proj": "ffn_up_shexp",
    "mlp.shared_expert.down_proj": "ffn_down_shexp",
    "mlp.shared_experts.gate_proj": "ffn_gate_shexp",
    "mlp.shared_experts.up_proj": "ffn_up_shexp",
    "mlp.shared_experts.down_proj": "ffn_down_shexp",
    "mlp.shared_expert_gate": "ffn_gate_inp_shexp",
    "mlp.shared_mlp.gate_proj": "ffn_gate_shexp",  # (Hunyuan's shared expert, and router)
    "mlp.shared_mlp.up_proj": "ffn_up_shexp",
    "mlp.shared_mlp.down_proj": "ffn_down_shexp",
    "mlp.gate.wg": "ffn_gate_inp",
    # DeepSeek's latent attention (`kv_b_proj` as a whole: older files')
    "self_attn.q_a_proj": "attn_q_a",
    "self_attn.q_a_layernorm": "attn_q_a_norm",
    "self_attn.q_b_proj": "attn_q_b",
    "self_attn.kv_a_proj_with_mqa": "attn_kv_a_mqa",
    "self_attn.kv_a_layernorm": "attn_kv_a_norm",
    "self_attn.kv_b_proj": "attn_kv_b",
    "self_attn.k_b_proj": "attn_k_b",
    "self_attn.v_b_proj": "attn_v_b",
    # LFM2's short convolutions, and its names of Llama's parts
    "conv.conv": "shortconv.conv",
    "conv.in_proj": "shortconv.in_proj",
    "conv.out_proj": "shortconv.out_proj",
    "operator_norm": "attn_norm",
    "ffn_norm": "ffn_norm",
    "self_attn.out_proj": "attn_output",
    "self_attn.q_layernorm": "attn_q_norm",
    "self_attn.k_layernorm": "attn_k_norm",
    "feed_forward.w1": "ffn_gate",
    "feed_forward.w3": "ffn_up",
    "feed_forward.w2": "ffn_down",
    # Qwen3.5's DeltaNet layers
    "linear_attn.in_proj_qkv": "attn_qkv",
    "linear_attn.in_proj_z": "attn_gate",
    "linear_attn.in_proj_b": "ssm_beta",
    "linear_attn.in_proj_a": "ssm_alpha",
    "linear_attn.in_proj_ba": "ssm_ba",  # (Qwen3-Next's, grouped by key head)
    "linear_attn.conv1d": "ssm_conv1d",
    "linear_attn.norm": "ssm_norm",
    "linear_attn.out_proj": "ssm_out",
    "eh_proj": "nextn.eh_proj",  # (GLM-4.5's multi-token-prediction layer's own)
    "enorm": "nextn.enorm",
    "hnorm": "nextn.hnorm",
}
# Gemma 3 names its four norms apart (Llama's post_attention_layernorm is its pre-MLP norm)
GEMMA3_LAYER_TO_GGUF = {
    **LAYER_TO_GGUF,
    "post_attention_layernorm": "post_attention_norm",
    "pre_feedforward_layernorm": "ffn_norm",
    "post_feedforward_layernorm": "post_ffw_norm",
}


def llama_cpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """What llama.cpp's converter does to Q/K rows (written from its documented behaviour)."""
    return (
        w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
        .swapaxes(1, 2)
        .reshape(w.shape)
    )


def gguf_name(hf: str, arch: str = "llama") -> str:
    if hf in HF_TO_GGUF:
        return HF_TO_GGUF[hf]
    _, _, layer, rest = hf.split(".", 3)
    part, kind = rest.rsplit(".", 1)
    if part.startswith("mlp.experts."):  # a stack of experts' weights
        return f"blk.{layer}.ffn_{part.rpartition('.')[2].removesuffix('_proj')}_exps.{kind}"
    if kind == "e_score_correction_bias":  # a router's score bias (GLM-4.5's, ERNIE 4.5's)
        return f"blk.{layer}.exp_probs_b.bias"
    if part == "mlp.gate":  # their router
        return f"blk.{layer}.ffn_gate_inp.{kind}"
    if part == "self_attn" and kind == "sinks":  # gpt-oss's, a tensor of their own
        return f"blk.{layer}.attn_sinks.weight"
    if part == "linear_attn" and kind == "A_log":  # Qwen3.5's (as -exp(A_log)), a tensor alone
        return f"blk.{layer}.ssm_a"
    if part == "linear_attn" and kind == "dt_bias":
        return f"blk.{layer}.ssm_dt.bias"
    names = GEMMA3_LAYER_TO_GGUF if arch in ("gemma2", "gemma3") else LAYER_TO_GGUF
    # their pre-MLP norm under Gemma's name
    if arch in ("gpt-oss", "seed_oss", "glm4moe", "qwen35", "qwen35moe", "qwen3next"):
        names = {**LAYER_TO_GGUF, "post_attention_layernorm": "post_attention_norm"}
    if arch == "glm4":  # its output norms under Gemma's names, its pre-MLP norm Llama's
        names = {**LAYER_TO_GGUF, "post_self_attn_layernorm": "post_attention_norm",
                 "post_mlp_layernorm": "post_ffw_norm"}  # fmt: skip
    if arch in ("exaone4", "olmo2"):  # their output norms under Gemma's names
        names = {**LAYER_TO_GGUF, "post_attention_layernorm": "post_attention_norm",
                 "post_feedforward_layernorm": "post_ffw_norm"}  # fmt: skip
    return f"blk.{layer}.{names[part]}.{kind}"


Q = GGMLQuantizationType


def _fp16(values: np.ndarray) -> np.ndarray:
    return values.astype(np.float16)


def quantize_k(values: np.ndarray, qtype: GGMLQuantizationType) -> np.ndarray:
    """Rows [n, k] (k a multiple of 256) -> Q4_K, Q5_K or Q6_K blocks in ggml's byte layout:
    a plain min/max quantizer (the `gguf` package writes no K-quants), its values checked
    against gguf's dequantizer by the tests that use it."""
    rows = values.astype(np.float32).reshape(-1, 256)
    n = rows.shape[0]
    if qtype == Q.Q6_K:
        halves = rows.reshape(n, 16, 16)
        scale = np.abs(halves).max(axis=2) / 31.0
        d = _fp16(scale.max(axis=1) / 127.0)
        df = d.astype(np.float32)[:, None]
        sc = np.clip(np.rint(np.divide(scale, df, out=np.zeros_like(scale), where=df > 0)),
                     0, 127).astype(np.int8)  # fmt: skip
        step = (df * sc)[..., None]
        q = np.rint(np.divide(halves, step, out=np.zeros_like(halves), where=step > 0)) + 32
        q = np.clip(q, 0, 63).astype(np.uint8).reshape(n, 2, 128)
        ql = (q[:, :, :64] & 15) | ((q[:, :, 64:] & 15) << 4)  # [n, half, 64]
        high = (q >> 4).reshape(n, 2, 4, 32)
        qh = high[:, :, 0] | (high[:, :, 1] << 2) | (high[:, :, 2] << 4) | (high[:, :, 3] << 6)
        return np.concatenate([ql.reshape(n, 128), qh.reshape(n, 64), sc.view(np.uint8),
                               d.view(np.uint8).reshape(n, 2)], axis=1)  # fmt: skip
    bits = 4 if qtype == Q.Q4_K else 5
    subs = rows.reshape(n, 8, 32)
    low = np.minimum(subs.min(axis=2), 0.0)
    scale = (subs.max(axis=2) - low) / (2**bits - 1)
    d, dmin = _fp16(scale.max(axis=1) / 63.0), _fp16(-low.min(axis=1) / 63.0)
    df, dminf = d.astype(np.float32)[:, None], dmin.astype(np.float32)[:, None]
    sc = np.clip(np.rint(np.divide(scale, df, out=np.zeros_like(scale), where=df > 0)), 0, 63)
    m = np.clip(np.rint(np.divide(-low, dminf, out=np.zeros_like(low), where=dminf > 0)), 0, 63)
    step = (df * sc)[..., None]
    q = np.rint(np.divide(subs + (dminf * m)[..., None], step, out=np.zeros_like(subs),
                          where=step > 0))  # fmt: skip
    q = np.clip(q, 0, 2**bits - 1).astype(np.uint8)
    sc, m = sc.astype(np.uint8), m.astype(np.uint8)
    packed = np.concatenate([
        (sc[:, :4] & 63) | ((sc[:, 4:] >> 4) << 6),
        (m[:, :4] & 63) | ((m[:, 4:] >> 4) << 6),
        (sc[:, 4:] & 15) | ((m[:, 4:] & 15) << 4),
    ], axis=1)  # fmt: skip
    qs = (q[:, 0::2] & 15) | ((q[:, 1::2] & 15) << 4)  # chunk c: sub-blocks 2c (low), 2c + 1
    parts = [d.view(np.uint8).reshape(n, 2), dmin.view(np.uint8).reshape(n, 2), packed]
    if bits == 5:  # bit s of byte i: sub-block s's weight i's 5th bit
        parts.append(sum((q[:, s] >> 4) << s for s in range(8)).astype(np.uint8))
    return np.concatenate([*parts, qs.reshape(n, 128)], axis=1)


def quantize_any(values: np.ndarray, qtype: GGMLQuantizationType) -> np.ndarray:
    """`values` in `qtype`'s blocks, [rows, bytes per row]: the `gguf` package's quantizer, or
    `quantize_k` for the K-quants."""
    if qtype in (Q.Q4_K, Q.Q5_K, Q.Q6_K):
        return quantize_k(values, qtype).reshape(values.shape[0], -1)
    return quantize(values, qtype)


def k_quant_mix(name: str) -> GGMLQuantizationType:
    """A Q4_K_M-like choice per tensor: Q6_K for v, down and the LM head (llama.cpp gives them
    more bits in some layers), Q4_K for the rest, Q5_0 for the embedding (the kernels' 5-bit
    format beside the K-quants)."""
    if name.startswith("token_embd"):
        return Q.Q5_0
    if "attn_v" in name or "ffn_down" in name or name.startswith("output."):
        return Q.Q6_K
    return Q.Q4_K


def llama3_rope_factors(head_dim: int, base: float, rope: dict) -> np.ndarray:
    """llama3 RoPE scaling as one divisor per frequency (written from llama.cpp's converter's
    documented behaviour): 1 for short wavelengths, `factor` for long ones, smoothed between."""
    factor = rope["factor"]
    low, high = rope["low_freq_factor"], rope["high_freq_factor"]
    old_len = rope["original_max_position_embeddings"]
    factors = []
    for i in range(0, head_dim, 2):
        wavelen = 2 * np.pi * base ** (i / head_dim)
        if wavelen < old_len / high:
            factors.append(1.0)
        elif wavelen > old_len / low:
            factors.append(factor)
        else:
            smooth = (old_len / wavelen - low) / (high - low)
            factors.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(factors, dtype=np.float32)


def write_tiny_gguf(hf_folder: Path, out: Path, qtype: GGMLQuantizationType | None,
                    mix: Callable[[str], GGMLQuantizationType] | None = None,
                    metadata: Callable[[GGUFWriter], None] | None = None,
                    legacy_kv_b: bool = False) -> Path:  # fmt: skip
    """Writes the tiny HF model in `hf_folder` (any family of its table below: Llama, llama3
    RoPE included, Qwen2, Qwen3 and its bare decoder, Phi-3, the Gemmas, the MoE families...)
    as a llama.cpp-style GGUF, 2D weights in `qtype` (or each in `mix(its GGUF name)`);
    `metadata(writer)` adds fields of its own. A DeepSeek's `kv_b_proj` is split as llama.cpp
    splits it, or whole with `legacy_kv_b` (its files before it split them).
    Gemma 3's global layers are implied (every sixth), and its windowed layers' RoPE base (10k)
    too, as llama.cpp has them."""
    from safetensors.torch import load_file

    cfg = json.loads((hf_folder / "config.json").read_text())
    # a Qwen VL's language model, its config nested (its vision parts are left out below)
    vision = cfg.get("vision_config")
    cfg = {**cfg, **cfg.get("text_config", {})}
    tok = json.loads((hf_folder / "tokenizer.json").read_text())
    vocab = sorted(tok["model"]["vocab"].items(), key=lambda kv: kv[1])
    specials = {t["id"] for t in tok["added_tokens"]}
    for t in tok["added_tokens"]:
        vocab[t["id"]] = (t["content"], t["id"])
    merges = [m if isinstance(m, str) else " ".join(m) for m in tok["model"]["merges"]]

    arch = {"LlamaForCausalLM": "llama", "Qwen2ForCausalLM": "qwen2", "Qwen3ForCausalLM": "qwen3",
            "Phi3ForCausalLM": "phi3",
            "GemmaForCausalLM": "gemma", "Gemma2ForCausalLM": "gemma2",
            "Gemma3ForCausalLM": "gemma3",
            "Qwen3MoeForCausalLM": "qwen3moe", "Qwen2MoeForCausalLM": "qwen2moe",
            "Glm4MoeForCausalLM": "glm4moe", "Ministral3ForCausalLM": "mistral3",
            "Ernie4_5_MoeForCausalLM": "ernie4_5-moe", "MiniMaxM2ForCausalLM": "minimax-m2",
            "Dots1ForCausalLM": "dots1", "HunYuanMoEV1ForCausalLM": "hunyuan-moe",
            "OlmoeForCausalLM": "olmoe", "GraniteMoeSharedForCausalLM": "granitemoe",
            "Qwen2_5_VLForConditionalGeneration": "qwen2vl",
            "Qwen3VLForConditionalGeneration": "qwen3vl",
            "Qwen3VLMoeForConditionalGeneration": "qwen3vlmoe",
            "MixtralForCausalLM": "llama",
            "GraniteForCausalLM": "granite", "GptOssForCausalLM": "gpt-oss",
            "SmolLM3ForCausalLM": "smollm3", "Exaone4ForCausalLM": "exaone4",
            "Olmo2ForCausalLM": "olmo2", "Olmo3ForCausalLM": "olmo2", "Glm4ForCausalLM": "glm4",
            "Ernie4_5ForCausalLM": "ernie4_5", "SeedOssForCausalLM": "seed_oss",
            "ArceeForCausalLM": "arcee", "HunYuanDenseV1ForCausalLM": "hunyuan-dense",
            "DeepseekV2ForCausalLM": "deepseek2", "DeepseekV3ForCausalLM": "deepseek2",
            "Glm4MoeLiteForCausalLM": "deepseek2", "Lfm2ForCausalLM": "lfm2",
            "Lfm2MoeForCausalLM": "lfm2moe", "Qwen3_5ForCausalLM": "qwen35",
            "Qwen3_5MoeForCausalLM": "qwen35moe", "Qwen3NextForCausalLM": "qwen3next",
            "Qwen3Model": "qwen3"}[cfg["architectures"][0]]  # fmt: skip
    if cfg.get("model_type") == "exaone":  # (transformers 5 saves EXAONE 3 as Llama)
        arch = "exaone"
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    w = GGUFWriter(out, arch)
    # (GLM-4.5's multi-token-prediction layers count in the blocks, as its converter writes them)
    extra_layers = cfg.get("num_nextn_predict_layers", 0) if arch == "glm4moe" else 0
    w.add_block_count(cfg["num_hidden_layers"] + extra_layers)
    if extra_layers:
        w.add_nextn_predict_layers(extra_layers)
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    weights = load_file(hf_folder / "model.safetensors")
    if arch in ("lfm2", "lfm2moe"):  # its MLP's width as adjusted (what its converter
        # writes), a KV head count per layer (0: a convolution), its kernel
        w.add_feed_forward_length(weights["model.layers.0.feed_forward.w1.weight"].shape[0])
        w.add_head_count_kv([cfg["num_key_value_heads"] if t == "full_attention" else 0
                             for t in cfg["layer_types"]])  # fmt: skip
        w.add_shortconv_l_cache(cfg["conv_L_cache"])
    elif "intermediate_size" in cfg:  # (Qwen3.5-MoE has no dense MLP)
        w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(cfg["num_attention_heads"])
    latent = arch == "deepseek2"  # (its heads' sizes below)
    if not latent and arch not in ("lfm2", "lfm2moe"):
        w.add_head_count_kv(cfg["num_key_value_heads"])
    rope = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    local_rope = rope.get("sliding_attention")  # OLMo 3's windowed layers' own base
    rope = rope.get("full_attention", rope)  # Gemma 3's global layers'
    base = float(rope.get("rope_theta", cfg.get("rope_theta", 10000.0)))
    if rope.get("alpha"):  # Hunyuan's NTK alpha: its converter writes the stretched base
        base *= rope["alpha"] ** (head_dim / (head_dim - 2))
    w.add_rope_freq_base(base)
    w.add_layer_norm_rms_eps(cfg.get("rms_norm_eps", cfg.get("norm_eps")))
    rotary = rope.get("partial_rotary_factor", cfg.get("partial_rotary_factor", 1.0))
    if latent:
        _latent_attention_metadata(w, cfg, rope, legacy_kv_b)
    else:
        w.add_rope_dimension_count(int(head_dim * rotary))
        w.add_key_length(head_dim)
        w.add_value_length(head_dim)
    w.add_vocab_size(cfg["vocab_size"])
    if cfg.get("sliding_window") and arch != "llama":  # (a llama file cannot say it: Mixtral)
        w.add_sliding_window(cfg["sliding_window"])
        if arch in ("exaone4", "olmo2"):  # as their converters list them: true where windowed
            w.add_sliding_window_pattern([t == "sliding_attention" for t in cfg["layer_types"]])
        if arch == "olmo2" and local_rope:
            w.add_float32(f"{arch}.rope.freq_base_swa", local_rope["rope_theta"])
    for key in ("attn_logit_softcapping", "final_logit_softcapping"):  # Gemma 2's
        if cfg.get(key) is not None:
            w.add_float32(f"{arch}.{key}", cfg[key])
    if arch == "granitemoe" and cfg.get("shared_intermediate_size"):  # (Granite MoE Shared's)
        w.add_expert_shared_feed_forward_length(cfg["shared_intermediate_size"])
    if arch in ("granite", "granitemoe"):  # their multipliers, under llama.cpp's names
        w.add_embedding_scale(cfg["embedding_multiplier"])
        w.add_residual_scale(cfg["residual_multiplier"])
        w.add_attention_scale(cfg["attention_multiplier"])
        w.add_logit_scale(cfg["logits_scaling"])
    experts = (cfg.get("num_experts") or cfg.get("num_local_experts")
               or cfg.get("n_routed_experts") or cfg.get("moe_num_experts"))  # fmt: skip
    if experts:
        w.add_expert_count(experts)
        w.add_expert_used_count(cfg.get("num_experts_per_tok") or cfg.get("moe_k")
                                or cfg["moe_topk"])  # fmt: skip
        if "moe_intermediate_size" in cfg:
            w.add_expert_feed_forward_length(cfg["moe_intermediate_size"])
        elif arch in ("gpt-oss", "minimax-m2", "hunyuan-moe"):  # (as their converters write it)
            w.add_expert_feed_forward_length(cfg["intermediate_size"])
    if arch == "lfm2moe":  # its dense first layers and sigmoid router, as its converter writes
        w.add_leading_dense_block_count(cfg["num_dense_layers"])
        w.add_expert_gating_func(ExpertGatingFuncType.SIGMOID)
    if arch == "hunyuan-moe":  # its shared expert, as wide as the experts
        w.add_expert_shared_feed_forward_length(cfg["intermediate_size"])
        w.add_expert_shared_count(1)
    if arch == "minimax-m2":  # its sigmoid router (`scoring_func`)
        w.add_expert_gating_func(ExpertGatingFuncType.SIGMOID)
    if arch in ("qwen2moe", "qwen35moe", "qwen3next"):
        w.add_expert_shared_feed_forward_length(cfg["shared_expert_intermediate_size"])
    if arch == "ernie4_5-moe":  # as its converter writes them, but the shared expert's true
        # width (the converter writes intermediate_size / KV heads, the published models' width)
        w.add_interleave_moe_layer_step(cfg["moe_layer_interval"])
        w.add_leading_dense_block_count(cfg["moe_layer_start_index"])
        w.add_expert_shared_count(cfg["moe_num_shared_experts"])
        w.add_expert_shared_feed_forward_length(
            cfg["moe_intermediate_size"] * cfg["moe_num_shared_experts"]
        )
    if arch in ("glm4moe", "dots1"):  # as their converters write them, and the expert groups
        # llama.cpp reads
        w.add_expert_shared_count(cfg["n_shared_experts"])
        w.add_leading_dense_block_count(cfg["first_k_dense_replace"])
        w.add_expert_gating_func(ExpertGatingFuncType.SIGMOID)
        w.add_expert_weights_scale(cfg["routed_scaling_factor"])
        w.add_expert_weights_norm(cfg["norm_topk_prob"])
        w.add_expert_group_count(cfg["n_group"])
        w.add_expert_group_used_count(cfg["topk_group"])
    if rope.get("rope_type") == "yarn":  # what llama.cpp's converter writes of YaRN
        w.add_rope_scaling_type(RopeScalingType.YARN)
        w.add_rope_scaling_factor(rope["factor"])
        w.add_rope_scaling_orig_ctx_len(rope["original_max_position_embeddings"])
    if arch in ("qwen2vl", "qwen3vl", "qwen3vlmoe"):  # their RoPE's sections, as llama.cpp reads
        w.add_rope_dimension_sections([*rope["mrope_section"], 0])
    if arch in ("qwen3vl", "qwen3vlmoe"):
        w.add_num_deepstack_layers(len(vision.get("deepstack_visual_indexes", [])))
    if arch in ("qwen35", "qwen35moe", "qwen3next"):  # its DeltaNet layers as its converter
        # describes them
        w.add_ssm_conv_kernel(cfg["linear_conv_kernel_dim"])
        w.add_ssm_state_size(cfg["linear_key_head_dim"])
        w.add_ssm_group_count(cfg["linear_num_key_heads"])
        w.add_ssm_time_step_rank(cfg["linear_num_value_heads"])
        w.add_ssm_inner_size(cfg["linear_value_head_dim"] * cfg["linear_num_value_heads"])
        w.add_full_attention_interval(cfg["layer_types"].index("full_attention") + 1)
        w.add_rope_dimension_sections([11, 11, 10, 0])
    if arch == "mistral3":  # (Ministral 3's: YaRN's mscale_all_dim, and its query temperature)
        w.add_rope_scaling_yarn_log_mul(rope["mscale_all_dim"])
        w.add_attn_temperature_scale(rope["llama_4_scaling_beta"])
    file_type = "MOSTLY_Q4_K_M" if qtype is None else (
        "ALL_F32" if qtype == Q.F32 else f"MOSTLY_{qtype.name}"
    )  # fmt: skip
    w.add_file_type(int(LlamaFileType[file_type]))  # what llama.cpp's converter writes
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list([t for t, _ in vocab])
    w.add_token_types([3 if i in specials else 1 for i in range(len(vocab))])
    w.add_token_merges(merges)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_pad_token_id(0)
    w.add_chat_template("{% for m in messages %}{{ m['content'] }}{% endfor %}")
    if metadata is not None:
        metadata(w)

    if rope.get("rope_type") == "llama3":  # as llama.cpp's converter stores it
        w.add_tensor("rope_freqs.weight", llama3_rope_factors(head_dim, base, rope))
    if rope.get("rope_type") == "longrope":  # (the attention factor as its converter computes it)
        original = rope["original_max_position_embeddings"]
        scale = cfg["max_position_embeddings"] / original
        w.add_rope_scaling_orig_ctx_len(original)
        w.add_rope_scaling_attn_factors(math.sqrt(1 + math.log(scale) / math.log(original)))
        w.add_tensor("rope_factors_long.weight", np.array(rope["long_factor"], np.float32))
        w.add_tensor("rope_factors_short.weight", np.array(rope["short_factor"], np.float32))
    if vision is not None:  # the language model's weights alone, under its own names
        weights = {name.replace("model.language_model.", "model."): t
                   for name, t in weights.items() if "visual." not in name}  # fmt: skip
    if arch in ("qwen35", "qwen35moe", "qwen3next"):  # (Qwen3-Next's value heads as they are)
        weights = _qwen35_as_llama_cpp(weights, cfg, tiled=arch != "qwen3next")
    stacks = [n for n in weights if n.endswith(".mlp.experts.gate_up_proj")]
    for name in stacks if arch in ("qwen3vlmoe", "qwen35moe", "qwen3next") else []:
        # Qwen3-VL-MoE's and Qwen3.5-MoE's stacks, as transformers saves them ([E, 2I, H],
        # [E, H, I]), split as their converters split them
        prefix = name.removesuffix("gate_up_proj")
        gate, up = weights.pop(name).chunk(2, dim=1)
        weights[f"{prefix}gate_proj.weight"] = gate.contiguous()
        weights[f"{prefix}up_proj.weight"] = up.contiguous()
        weights[f"{prefix}down_proj.weight"] = weights.pop(f"{prefix}down_proj")
    if arch == "exaone":  # its GPT-2-style names as the Llama ones its converter maps them to
        from inflight.model.exaone import LLAMA_NAMES
        from inflight.model.llama import renamed_weights

        weights = dict(renamed_weights(weights.items(), LLAMA_NAMES))
    if arch == "gpt-oss":
        weights = _gpt_oss_as_llama_cpp(weights)
    if latent and not legacy_kv_b:
        weights = _split_latent_expansions(weights, cfg)
    if arch == "granitemoe":
        weights = _granite_as_llama_cpp(weights)
    if arch in ("lfm2", "lfm2moe"):  # its convolution kernels [H, 1, K] squeezed, as its
        # converter does; LFM2-MoE's experts and router under the names the experts' take
        weights = {_lfm2_moe_name(n): t.squeeze(1) if n.endswith(".conv.conv.weight") else t
                   for n, t in weights.items()}  # fmt: skip

    def add(file_name: str, array: np.ndarray) -> None:
        kind = mix(file_name) if mix else qtype
        # (sinks and convolution kernels stay F32, as llama.cpp's quantizer leaves them)
        weight = file_name.endswith(".weight") and not any(
            kept in file_name for kept in ("attn_sinks", "shortconv.conv", "ssm_conv1d")
        )
        if weight and array.ndim >= 2 and kind != Q.F32 and "ffn_gate_inp" not in file_name:
            # (routers stay F32, as llama.cpp's quantizer leaves them)
            w.add_tensor(file_name, quantize_any(array, kind), raw_dtype=kind)
        else:
            w.add_tensor(file_name, array)

    for name, tensor in _stacked_experts(weights).items():
        if not name.startswith(("model.", "lm_head.")):  # a bare decoder's (Qwen3Model's)
            name = f"model.{name}"
        array = tensor.float().numpy()
        # (llama.cpp's converter permutes only these)
        permuted = arch in ("llama", "granite", "granitemoe", "smollm3", "arcee", "mistral3")
        if permuted and name.endswith("q_proj.weight"):
            array = llama_cpp_permute(array, cfg["num_attention_heads"])
        elif permuted and name.endswith("k_proj.weight"):
            array = llama_cpp_permute(array, cfg["num_key_value_heads"])
        elif arch in ("gemma", "gemma2", "gemma3") and name.endswith("norm.weight"):
            array = array + 1  # (stored as the 1 + w applied)
        elif name.endswith("shared_expert_gate.weight"):  # (one row: llama.cpp stores a vector)
            array = array[0]
        elif name.endswith("e_score_correction_bias"):  # (ERNIE 4.5's is [1, E]: a vector)
            array = array.reshape(-1)
        add(gguf_name(name, arch), array)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out


def _qwen35_as_llama_cpp(weights: dict, cfg: dict, tiled: bool) -> dict:
    """Qwen3.5's tensors as llama.cpp's converter writes them (still under HF names): every norm
    but the DeltaNet output's as 1 + w, A_log as -exp(A_log) (`gguf_name`: `ssm_a`), the
    convolutions squeezed, and with `tiled` the value heads moved from the checkpoint's order
    (those of key head 0, then of key head 1, ...) to a tiled one (each key head's first, then
    each one's second, ...) in every tensor that has them. Qwen3-Next's `in_proj_qkvz` (rows
    grouped by key head) is split into q/k/v and z as its converter splits it."""
    key_heads, value_heads = cfg["linear_num_key_heads"], cfg["linear_num_value_heads"]
    key_dim, value_dim = cfg["linear_key_head_dim"], cfg["linear_value_head_dim"]
    keys = 2 * key_heads * key_dim
    values = value_heads // key_heads * value_dim  # (a key head's)
    for name in [n for n in weights if n.endswith("in_proj_qkvz.weight")]:
        groups = weights.pop(name).reshape(key_heads, 2 * key_dim + 2 * values, -1)
        q, k, v, z = (p.reshape(-1, groups.shape[-1])
                      for p in groups.split([key_dim, key_dim, values, values], dim=1))  # fmt: skip
        weights[name.replace("qkvz", "qkv")] = torch.cat([q, k, v])
        weights[name.replace("qkvz", "z")] = z

    def tile(t, dim: int, width: int):
        if not tiled:
            return t
        moved = t.movedim(dim, 0)
        grouped = moved.reshape(key_heads, value_heads // key_heads, width, *moved.shape[1:])
        return grouped.transpose(0, 1).reshape(moved.shape).movedim(0, dim).contiguous()

    out = {}
    for name, t in weights.items():
        if name.endswith("norm.weight") and not name.endswith("linear_attn.norm.weight"):
            t = t + 1
        if name.endswith(("in_proj_qkv.weight", "conv1d.weight")):
            t = t.reshape(t.shape[0], -1)  # (a convolution's [C, 1, K] squeezed)
            t = torch.cat([t[:keys], tile(t[keys:], 0, value_dim)])
        elif name.endswith("in_proj_z.weight"):
            t = tile(t, 0, value_dim)
        elif name.endswith(("in_proj_a.weight", "in_proj_b.weight", ".A_log", ".dt_bias")):
            t = tile(t, 0, 1)
        elif name.endswith("linear_attn.out_proj.weight"):
            t = tile(t, 1, value_dim)
        out[name] = -t.float().exp() if name.endswith(".A_log") else t
    return out


def _lfm2_moe_name(name: str) -> str:
    """An LFM2-MoE tensor's name as another family's experts and router name theirs."""
    for theirs, ours in ((".w1.", ".gate_proj."), (".w3.", ".up_proj."),
                         (".w2.", ".down_proj.")):  # fmt: skip
        if ".feed_forward.experts." in name:
            name = name.replace(theirs, ours)
    name = name.replace(".feed_forward.expert_bias", ".mlp.gate.e_score_correction_bias")
    return name.replace(".feed_forward.experts.", ".mlp.experts.").replace(
        ".feed_forward.gate.", ".mlp.gate."
    )


def _latent_attention_metadata(w: GGUFWriter, cfg: dict, rope: dict, legacy_kv_b: bool) -> None:
    """A DeepSeek's `deepseek2` fields as llama.cpp's converter writes them: one KV head of the
    latent and its rotated part (in a legacy file, the query and value heads), the experts'
    settings (V3's sigmoid; V2's gating unsaid), and YaRN's `mscale_all_dim` as a tenth."""
    rope_dim, latent = cfg["qk_rope_head_dim"], cfg["kv_lora_rank"]
    query_head = cfg["qk_nope_head_dim"] + rope_dim
    w.add_head_count_kv(cfg["num_attention_heads"] if legacy_kv_b else 1)
    w.add_rope_dimension_count(rope_dim)
    w.add_kv_lora_rank(latent)
    if cfg.get("q_lora_rank"):
        w.add_q_lora_rank(cfg["q_lora_rank"])
    if legacy_kv_b:
        w.add_key_length(query_head)
        w.add_value_length(cfg["v_head_dim"])
    else:
        w.add_key_length(latent + rope_dim)
        w.add_value_length(latent)
        w.add_key_length_mla(query_head)
        w.add_value_length_mla(cfg["v_head_dim"])
    types = cfg.get("mlp_layer_types")  # (GLM-4.7-Flash's, its dense layers first)
    dense = types.count("dense") if types else cfg["first_k_dense_replace"]
    w.add_leading_dense_block_count(dense)
    w.add_expert_shared_count(cfg["n_shared_experts"])
    w.add_expert_weights_scale(cfg["routed_scaling_factor"])
    v3 = cfg["model_type"] in ("deepseek_v3", "glm4_moe_lite")
    if cfg.get("norm_topk_prob") and v3:
        w.add_expert_weights_norm(True)
    if v3:
        w.add_expert_gating_func(ExpertGatingFuncType.SIGMOID)
    w.add_expert_group_count(cfg["n_group"])
    w.add_expert_group_used_count(cfg["topk_group"])
    if rope.get("mscale_all_dim"):
        w.add_rope_scaling_yarn_log_mul(0.1 * rope["mscale_all_dim"])


def _split_latent_expansions(weights: dict, cfg: dict) -> dict:
    """`kv_b_proj` as llama.cpp's converter splits it: each head's W_UK transposed
    (`k_b_proj`, [H, latent, qk_nope]) and its W_UV (`v_b_proj`, [H, v, latent])."""
    heads, nope = cfg["num_attention_heads"], cfg["qk_nope_head_dim"]
    out = {}
    for name, tensor in weights.items():
        if not name.endswith("kv_b_proj.weight"):
            out[name] = tensor
            continue
        per_head = tensor.view(heads, nope + cfg["v_head_dim"], cfg["kv_lora_rank"])
        out[name.replace("kv_b_proj", "k_b_proj")] = per_head[:, :nope].transpose(1, 2).contiguous()
        out[name.replace("kv_b_proj", "v_b_proj")] = per_head[:, nope:].contiguous()
    return out


def tiny_gguf_engine(hf_folder: Path, out: Path, qtype: GGMLQuantizationType):
    """An engine over `hf_folder` written as a GGUF in `qtype` (`write_tiny_gguf`): exact in
    F32; otherwise over the file's blocks with 16-bit activations, as the kernels take them."""
    from inflight import LLM

    path = write_tiny_gguf(hf_folder, out, qtype)
    mode = "off" if qtype == Q.F32 else "int16"
    return LLM(str(path), dtype="float32", quantized_activations=mode)


def _granite_as_llama_cpp(weights: dict) -> dict:
    """Granite MoE's checkpoint as its converter splits it: each layer's stacked
    `input_linear` [E, 2I, H] into gate and up stacks, `output_linear` as down's, the router
    under Mixtral's name, and the shared MLP's fused `input_linear` into gate and up."""
    out = {}
    for name, tensor in weights.items():
        prefix, _, leaf = name.rpartition(".block_sparse_moe.")
        if leaf == "input_linear.weight":
            gate, up = tensor.chunk(2, dim=1)
            out[f"{prefix}.mlp.experts.gate_proj.weight"] = gate.contiguous()
            out[f"{prefix}.mlp.experts.up_proj.weight"] = up.contiguous()
        elif leaf == "output_linear.weight":
            out[f"{prefix}.mlp.experts.down_proj.weight"] = tensor
        elif leaf == "router.layer.weight":
            out[f"{prefix}.mlp.gate.weight"] = tensor
        elif name.endswith(".shared_mlp.input_linear.weight"):
            gate, up = tensor.chunk(2, dim=0)
            layer = name.removesuffix(".shared_mlp.input_linear.weight")
            out[f"{layer}.mlp.shared_expert.gate_proj.weight"] = gate.contiguous()
            out[f"{layer}.mlp.shared_expert.up_proj.weight"] = up.contiguous()
        elif name.endswith(".shared_mlp.output_linear.weight"):
            layer = name.removesuffix(".shared_mlp.output_linear.weight")
            out[f"{layer}.mlp.shared_expert.down_proj.weight"] = tensor
        else:
            out[name] = tensor
    return out


def _gpt_oss_as_llama_cpp(weights: dict) -> dict:
    """gpt-oss's checkpoint as llama.cpp's converter lays it out: the stacked `gate_up_proj`
    ([experts, hidden, 2 x intermediate], gate and up columns interleaved) and its bias split into
    gate and up stacks of [experts, out, in] weights, `down_proj` transposed likewise, and the
    router under the other families' name (`mlp.gate`)."""
    out = {}
    for name, tensor in weights.items():
        prefix, _, leaf = name.partition(".mlp.experts.")
        if leaf in ("gate_up_proj", "gate_up_proj_bias"):
            bias = leaf.endswith("_bias")
            stack = tensor if bias else tensor.transpose(1, 2)  # [E, 2I(, H)]
            kind = "bias" if bias else "weight"
            out[f"{prefix}.mlp.experts.gate_proj.{kind}"] = stack[:, 0::2].contiguous()
            out[f"{prefix}.mlp.experts.up_proj.{kind}"] = stack[:, 1::2].contiguous()
        elif leaf == "down_proj":
            out[f"{prefix}.mlp.experts.down_proj.weight"] = tensor.transpose(1, 2).contiguous()
        elif leaf == "down_proj_bias":
            out[f"{prefix}.mlp.experts.down_proj.bias"] = tensor
        else:
            out[name.replace(".mlp.router.", ".mlp.gate.")] = tensor
    return out


def _stacked_experts(weights: dict) -> dict:
    """The checkpoint with each layer's experts stacked as llama.cpp stores them: one
    [experts, rows, columns] tensor per projection, `mlp.experts.gate_proj.weight` (Mixtral's
    w1/w3/w2 as gate/up/down), the router as `mlp.gate.weight`."""
    import re

    import torch

    names = {"w1": "gate_proj", "w3": "up_proj", "w2": "down_proj"}
    pattern = re.compile(r"(model\.layers\.\d+)\.(?:mlp|block_sparse_moe)\.experts\.(\d+)\."
                         r"(\w+)\.weight")  # fmt: skip
    stacks: dict[str, dict[int, object]] = {}
    out = {}
    for name, tensor in weights.items():
        match = pattern.fullmatch(name)
        if match is None:
            out[name.replace(".block_sparse_moe.gate.", ".mlp.gate.")] = tensor
            continue
        layer, expert, part = match.groups()
        key = f"{layer}.mlp.experts.{names.get(part, part)}.weight"
        stacks.setdefault(key, {})[int(expert)] = tensor
    for key, experts in stacks.items():
        out[key] = torch.stack([experts[e] for e in sorted(experts)])
    return out


def write_weights_only_copy(path: Path, out: Path) -> Path:
    """A copy of the GGUF file at `path` without its `tokenizer.*` fields: the same tensors,
    byte for byte, and every other field. transformers' GGUF reader parses every field of a file
    it loads (each vocabulary entry a numpy view: 20-50 s on 2 cores for the real models), and a
    reference model needs only the weights and the model's fields."""
    from gguf import GGUFValueType

    from inflight.model.gguf_header import read_gguf_header

    header = read_gguf_header(path)
    writer = GGUFWriter(out, header.fields["general.architecture"])
    for key, value in header.fields.items():
        if key.startswith("tokenizer.") or key == "general.architecture":
            continue
        writer.add_key_value(key, value, GGUFValueType.get_type(value))
    mapped = np.memmap(path, dtype=np.uint8, mode="r")
    for tensor in header.tensors:
        dtype, shape = tensor.data_layout()
        size = int(np.prod(shape)) * np.dtype(dtype).itemsize
        data = mapped[tensor.offset : tensor.offset + size].view(dtype).reshape(shape)
        writer.add_tensor(tensor.name, data, raw_shape=shape,
                          raw_dtype=GGMLQuantizationType(tensor.type))  # fmt: skip
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out
