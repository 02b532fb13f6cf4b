"""GGUF file -> LlamaArchConfig and Hugging Face-named float32 tensors.

Dequantization is the `gguf` package's (F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q4_K, Q6_K and more);
matrices in a block format the CPU kernels read (`model/gguf_blocks.py`) can also hand over their
raw blocks, for the kernels that multiply from them (`model/packed_linear.py`).
llama.cpp's converter permutes the rows of Q and K weights of `llama`-architecture models into
an interleaved RoPE layout; `unpermute_qk` undoes that so the weights match HF's half-rotation.

What loading needs (the architecture and where each tensor lies) comes from the file's header
(`gguf_header`, much faster than gguf's reader for a large vocabulary)
and is small, so `read_gguf_index` keeps it beside the converted tokenizer, keyed by the file's
path, size and modification time, and later loads of the same file map the tensors without
reading the header again.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import mmap
import warnings
from collections.abc import Callable, Collection, Iterable, Iterator
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFReader
from gguf.quants import dequantize

from inflight.errors import ModelLoadError
from inflight.file_cache import cache_dir, file_cache_key
from inflight.model.arch import (
    DELTA_ARCHS,
    EXAONE4_SLIDING_WINDOW_PATTERN,
    GEMMA2_SLIDING_WINDOW_PATTERN,
    GEMMA3_SLIDING_WINDOW_PATTERN,
    MAX_LAYERS,
    SMOLLM3_NO_ROPE_INTERVAL,
    LlamaArchConfig,
    latent_scale,
    yarn_settings,
)
from inflight.model.gguf_blocks import FORMATS
from inflight.model.gguf_header import GGUFHeader, TensorInfo, read_gguf_header
from inflight.model.rotary_pairs import PAIR_ROTARY, latent_rotary_order, pairs_to_halves

logger = logging.getLogger(__name__)

SUPPORTED_GGUF_ARCHITECTURES = ("llama", "qwen2", "qwen3", "qwen2vl", "qwen3vl", "qwen3vlmoe",
                                "qwen3moe", "qwen2moe", "glm4moe", "ernie4_5-moe", "minimax-m2",
                                "dots1", "hunyuan-moe", "olmoe", "granitemoe", "phi3", "gemma",
                                "gemma2", "gemma3", "mistral3", "granite", "gpt-oss", "smollm3",
                                "exaone", "exaone4", "olmo2", "glm4", "ernie4_5", "seed_oss",
                                "arcee", "hunyuan-dense", "deepseek2", "lfm2",
                                "lfm2moe", "qwen35", "qwen35moe", "qwen3next")  # fmt: skip
# the architectures whose Q and K rows llama.cpp's converter permutes (`unpermute_qk`)
PERMUTED_QK = ("llama", "mixtral", "granite", "granitemoe", "smollm3", "arcee", "ministral3")
# a GGUF architecture -> the registry's, where the names differ (a `llama` file with experts is
# Mixtral: `gguf_arch_config`)
_REGISTRY_NAMES = {"qwen3moe": "qwen3_moe", "qwen2moe": "qwen2_moe", "glm4moe": "glm4_moe",
                   "gpt-oss": "gpt_oss", "hunyuan-dense": "hunyuan_dense",
                   "mistral3": "ministral3", "ernie4_5-moe": "ernie4_5_moe",
                   "minimax-m2": "minimax_m2", "hunyuan-moe": "hunyuan_moe",
                   "lfm2moe": "lfm2_moe", "qwen35": "qwen3_5", "qwen35moe": "qwen3_5_moe",
                   "qwen3next": "qwen3_next",
                   # the Qwen VLs' language models (their multimodal RoPE, over text alone, is
                   # the plain one)
                   "qwen2vl": "qwen2", "qwen3vl": "qwen3", "qwen3vlmoe": "qwen3_moe"}  # fmt: skip
# the architectures whose experts a GGUF file may hold (a `llama` file's: Mixtral)
_EXPERT_ARCHITECTURES = ("llama", "qwen3moe", "qwen3vlmoe", "qwen2moe", "glm4moe", "ernie4_5-moe",
                         "minimax-m2", "dots1", "hunyuan-moe", "olmoe", "granitemoe",
                         "gpt-oss", "deepseek2", "lfm2moe", "qwen35moe",
                         "qwen3next")  # fmt: skip
# the architectures whose softmax routers llama.cpp never renormalizes (their published models
# do not)
_UNNORMALIZED_ROUTERS = ("qwen2moe", "olmoe")
# the architectures whose score-biased routers llama.cpp always renormalizes
_RENORMALIZED_BIASED_ROUTERS = ("ernie4_5-moe", "minimax-m2", "lfm2moe")
# llama.cpp's `expert_gating_func` values
_SOFTMAX_GATING, _SIGMOID_GATING = 1, 2
# gpt-oss's expert gate, which llama.cpp fixes rather than reads: the published models' clamp
# and sigmoid slope
GPT_OSS_SWIGLU_LIMIT, GPT_OSS_SWIGLU_ALPHA = 7.0, 1.702
ROPE_FREQS = "rope_freqs.weight"  # per-frequency divisors of a llama3-scaled RoPE
# LongRoPE's factors (Phi-3 and Phi-4-mini 128k), as llama.cpp's converter stores them
ROPE_FACTORS_LONG, ROPE_FACTORS_SHORT = "rope_factors_long.weight", "rope_factors_short.weight"
_ROPE_FACTOR_TENSORS = (ROPE_FREQS, ROPE_FACTORS_LONG, ROPE_FACTORS_SHORT)

_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "attn_output": "self_attn.o_proj",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "ffn_gate_inp": "mlp.gate",  # a mixture of experts' router
    # a shared expert (Qwen2-MoE's, under its gate; GLM-4.5's)
    "ffn_gate_shexp": "mlp.shared_expert.gate_proj",
    "ffn_up_shexp": "mlp.shared_expert.up_proj",
    "ffn_down_shexp": "mlp.shared_expert.down_proj",
    "ffn_gate_inp_shexp": "mlp.shared_expert_gate",
    # a sigmoid router's score bias (GLM-4.5's), a parameter rather than a `.bias`
    "exp_probs_b": "mlp.gate.e_score_correction_bias",
}
# HF names that are parameters of their own, not a module's `.weight` or `.bias`
_PARAMETER_NAMES = ("self_attn.sinks", "mlp.gate.e_score_correction_bias",
                    "linear_attn.dt_bias", "linear_attn.decay_rate")  # fmt: skip
# A mixture of experts' stacked weights ([experts, rows, columns] in numpy order), which the
# index lists as one tensor per expert, `blk.N.ffn_gate_exps.E`: HF's `mlp.experts.E.gate_proj`
_EXPERT_STACKS = {"ffn_gate_exps": "gate_proj", "ffn_up_exps": "up_proj",
                  "ffn_down_exps": "down_proj"}  # fmt: skip
# DeepSeek's latent expansion as llama.cpp splits it: [heads, rows, columns] stacks of one
# matrix a head, which the index lists one head at a time as it lists experts
# (`blk.N.attn_k_b.H`: HF's `self_attn.k_b_proj.H`), so each multiplies from its blocks
_HEAD_STACKS = {"attn_k_b": "self_attn.k_b_proj", "attn_v_b": "self_attn.v_b_proj"}
# Gemma names its four norms apart (Llama's ffn_norm is its pre-MLP norm)
_GEMMA_LAYER_NAMES = {
    **_LAYER_NAMES,
    "post_attention_norm": "post_attention_layernorm",
    "ffn_norm": "pre_feedforward_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
}
_OUTPUT_NORM_NAMES = {**_LAYER_NAMES, "post_attention_norm": "post_attention_layernorm",
                      "post_ffw_norm": "post_feedforward_layernorm"}  # fmt: skip
# where an architecture's tensor means something else than Llama's (phi3's ffn_up is gate + up)
# DeepSeek's latent attention (`deepseek2`): its query (through a latent, or not) and key-value
# latent projections, and the latent's expansion, whole (older files) or as llama.cpp splits it
# (W_UK transposed, W_UV: stacks of one matrix a head, `_HEAD_STACKS`)
_LATENT_LAYER_NAMES = {
    **_LAYER_NAMES,
    "attn_q_a": "self_attn.q_a_proj",
    "attn_q_a_norm": "self_attn.q_a_layernorm",
    "attn_q_b": "self_attn.q_b_proj",
    "attn_kv_a_mqa": "self_attn.kv_a_proj_with_mqa",
    "attn_kv_a_norm": "self_attn.kv_a_layernorm",
    "attn_kv_b": "self_attn.kv_b_proj",
}
_CONV_LAYER_NAMES = {**_LAYER_NAMES, "shortconv.conv": "conv.conv", "shortconv.in_proj": "in_proj",
                     "shortconv.out_proj": "out_proj"}  # fmt: skip
# Qwen3.5's DeltaNet layers (`qwen35`): its q/k/v rows, the gate z, beta and alpha, the
# convolution, dt's bias, the output norm and projection; its pre-MLP norm under Gemma's name
_DELTA_LAYER_NAMES = {
    **_LAYER_NAMES,
    "post_attention_norm": "post_attention_layernorm",
    "attn_qkv": "linear_attn.in_proj_qkv",
    "attn_gate": "linear_attn.in_proj_z",
    "ssm_beta": "linear_attn.in_proj_b",
    "ssm_alpha": "linear_attn.in_proj_a",
    "ssm_ba": "linear_attn.in_proj_ba",  # (Qwen3-Next's b and a, grouped by key head)
    "ssm_conv1d": "linear_attn.conv1d",
    "ssm_dt": "linear_attn.dt_bias",
    "ssm_a": "linear_attn.decay_rate",  # (-exp(A_log), a tensor without a kind: `blk.N.ssm_a`)
    "ssm_norm": "linear_attn.norm",
    "ssm_out": "linear_attn.out_proj",
}
_ARCH_LAYER_NAMES = {
    "phi3": {**_LAYER_NAMES, "attn_qkv": "self_attn.qkv_proj", "ffn_up": "mlp.gate_up_proj"},
    "gemma2": _GEMMA_LAYER_NAMES,
    "gemma3": _GEMMA_LAYER_NAMES,
    # Seed-OSS's and GLM-4.5's pre-MLP norm, under the name llama.cpp gives it
    "seed_oss": {**_LAYER_NAMES, "post_attention_norm": "post_attention_layernorm"},
    "glm4_moe": {**_LAYER_NAMES, "post_attention_norm": "post_attention_layernorm"},
    # gpt-oss's pre-MLP norm, and its sink logits (a parameter of their own, not a `.weight`)
    "gpt_oss": {**_LAYER_NAMES, "post_attention_norm": "post_attention_layernorm",
                "attn_sinks": "self_attn.sinks"},
    # EXAONE 4's and OLMo's norms of attention's and the MLP's outputs (none before them)
    "exaone4": _OUTPUT_NORM_NAMES,
    "olmo2": _OUTPUT_NORM_NAMES,
    "olmo3": _OUTPUT_NORM_NAMES,  # (an olmo2 file with a window)
    # GLM-4's four norms (its post_attention_layernorm is the pre-MLP one, as Llama's), and
    # gate and up in one tensor
    "glm4": {**_LAYER_NAMES, "post_attention_norm": "post_self_attn_layernorm",
             "post_ffw_norm": "post_mlp_layernorm", "ffn_up": "mlp.gate_up_proj"},
    "deepseek_v2": _LATENT_LAYER_NAMES,
    "deepseek_v3": _LATENT_LAYER_NAMES,
    # LFM2's short convolutions (the names its model class renames to its own)
    "lfm2": _CONV_LAYER_NAMES,
    "lfm2_moe": _CONV_LAYER_NAMES,
    "qwen3_5": _DELTA_LAYER_NAMES,
    "qwen3_5_moe": _DELTA_LAYER_NAMES,
    "qwen3_next": _DELTA_LAYER_NAMES,
}  # fmt: skip
# What llama.cpp assumes for Gemma where the file does not say: Gemma 3's windowed layers' RoPE
# base (`rope.freq_base_swa`), and the 27Bs' (Gemma 3's 62 layers, Gemma 2's 46) score scale of
# hidden / heads, not head_dim
GEMMA3_LOCAL_ROPE_THETA = 10000.0
GEMMA3_27B_LAYERS, GEMMA2_27B_LAYERS = 62, 46
_TOP_NAMES = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}
# LFM2's final norm, which its converter names after the embedding (HF: `embedding_norm`)
_ARCH_TOP_NAMES = {arch: {**_TOP_NAMES, "token_embd_norm": "model.norm"}
                   for arch in ("lfm2", "lfm2_moe")}  # fmt: skip


def check_tensor(name: str, raw_type: int, dims: list[int], data_offset: int,
                 file_size: int) -> None:  # fmt: skip
    """Refuses, naming the tensor, a header whose type is unknown, whose rows do not divide
    into its type's blocks, or whose data would run past the end of the file."""
    try:
        kind = GGMLQuantizationType(raw_type)
        block_size, block_bytes = GGML_QUANT_SIZES[kind]
    except (ValueError, KeyError):
        raise ModelLoadError(f"tensor {name!r} has unknown type {raw_type}") from None
    if not dims or any(d <= 0 for d in dims):
        raise ModelLoadError(f"tensor {name!r} has shape {dims}")
    if dims[0] % block_size:
        raise ModelLoadError(f"tensor {name!r}: rows of {dims[0]} values do not divide into "
                             f"{kind.name} blocks of {block_size}")  # fmt: skip
    size = int(np.prod(dims, dtype=object)) // block_size * block_bytes
    if data_offset + size > file_size:
        raise ModelLoadError(f"tensor {name!r} ({kind.name}, {dims}) runs past the end of the "
                             f"file: its {size} bytes at offset {data_offset}, the file has "
                             f"{file_size}")  # fmt: skip


def field_value(header: GGUFHeader, key: str, default: Any = None) -> Any:
    value = header.fields.get(key)
    return default if value is None else value


def gguf_arch_config(header: GGUFHeader, path: Path) -> LlamaArchConfig:
    arch = field_value(header, "general.architecture")
    if arch not in SUPPORTED_GGUF_ARCHITECTURES:
        raise ModelLoadError(
            f"{path}: unsupported GGUF architecture {arch!r}; "
            f"supported: {', '.join(SUPPORTED_GGUF_ARCHITECTURES)}"
        )
    names = {t.name for t in header.tensors}
    factors: dict[str, tuple[float, ...]] = {}  # RoPE's, one per frequency
    for tensor in header.tensors:
        if tensor.name in _ROPE_FACTOR_TENSORS:
            if tensor.type != GGMLQuantizationType.F32:
                kind = GGMLQuantizationType(tensor.type).name
                raise ModelLoadError(f"{path}: {tensor.name} must be F32, not {kind}")
            count = int(np.prod(tensor.shape))
            values = np.fromfile(path, np.float32, count=count, offset=tensor.offset)
            factors[tensor.name] = tuple(float(f) for f in values)

    def meta(key: str, default: Any = None) -> Any:
        value = field_value(header, f"{arch}.{key}", default)
        if value is None:
            raise ModelLoadError(f"{path}: GGUF metadata lacks {arch}.{key}")
        return value

    hidden = int(meta("embedding_length"))
    num_heads = int(meta("attention.head_count"))
    # GLM-4.5's multi-token-prediction layers come after the last (and count in block_count)
    extra_layers = int(meta("nextn_predict_layers", 0))
    num_layers = int(meta("block_count")) - extra_layers
    head_dim = int(meta("attention.key_length", hidden // num_heads))
    tokens = field_value(header, "tokenizer.ggml.tokens") or []
    window = field_value(header, f"{arch}.attention.sliding_window")  # phi3's, gemma3's
    if arch == "dots1":  # (every layer of the published model sees every position, as llama.cpp
        # runs them whatever a converter wrote)
        window = None
    full_layers: tuple[int, ...] = ()
    local_theta = query_scalar = None
    experts = int(meta("expert_count", 0))
    moe: dict[str, Any] = {}
    if experts:
        if arch not in _EXPERT_ARCHITECTURES:
            raise ModelLoadError(f"{path}: a {arch} file with experts is not supported")
        ffn = field_value(header, f"{arch}.expert_feed_forward_length")
        ffn = int(meta("feed_forward_length") if ffn is None else ffn)
        # a layer without a router keeps one MLP (what the file holds says which)
        layers = range(max(0, min(num_layers, MAX_LAYERS + 1)))  # (more: refused by the config)
        dense = tuple(i for i in layers if f"blk.{i}.ffn_gate_inp.weight" not in names)
        # llama.cpp renormalizes the chosen experts' weights of each, as each family does
        # (Qwen2-MoE's and OLMoE's never)
        moe = dict(num_experts=experts, experts_per_token=int(meta("expert_used_count")),
                   expert_intermediate_size=ffn, dense_layers=dense,
                   norm_topk_prob=arch not in _UNNORMALIZED_ROUTERS,
                   # a shared expert's width: its tensors' (ERNIE 4.5's converter writes a
                   # width derived otherwise)
                   shared_expert_intermediate_size=next(
                       (int(t.shape[1]) for t in header.tensors
                        if t.name.endswith(".ffn_up_shexp.weight")), 0),
                   shared_expert_gate=arch in ("qwen2moe", "qwen35moe", "qwen3next"))  # fmt: skip
        if any(name.endswith(".exp_probs_b.bias") for name in names):  # a router's score bias
            moe.update(_biased_routing(header, arch, path))
        elif arch == "deepseek2":  # DeepSeek-V2's float32 softmax, without the bias, within
            # the best groups by their best score: as the model computes it (llama.cpp ranks
            # groups by their two best, DeepSeek-V3's rule, for every file)
            moe.update(_biased_routing(header, arch, path), router_score_bias=False,
                       float32_router=True, expert_group_by_max=True)  # fmt: skip
        if arch == "deepseek2":
            moe.update(extra_checkpoint_layers=extra_layers)
        if arch == "lfm2moe":  # (its renormalization's epsilon, as the model adds it)
            moe.update(router_norm_epsilon=1e-6)
        if arch in ("glm4moe", "dots1"):
            moe.update(extra_checkpoint_layers=extra_layers,
                       qk_norm="blk.0.attn_q_norm.weight" in names)  # fmt: skip
    elif arch in _EXPERT_ARCHITECTURES and arch != "llama":
        raise ModelLoadError(f"{path}: GGUF metadata lacks {arch}.expert_count")
    registry_name = "mixtral" if arch == "llama" and experts else _REGISTRY_NAMES.get(arch, arch)
    rope_scaling = _rope_scaling(header, arch, path)
    latent: dict[str, Any] = {}
    if arch == "deepseek2":  # (DeepSeek-V3's router is the one with a score bias)
        registry_name = "deepseek_v3" if moe.get("router_score_bias") else "deepseek_v2"
        latent = _latent_attention(meta, rope_scaling)
        latent["latent_expansion_per_head"] = "blk.0.attn_k_b.weight" in names
        head_dim = latent.pop("head_dim")
    freq_factors, long_factors = factors.get(ROPE_FREQS), None
    if ROPE_FACTORS_LONG in factors or ROPE_FACTORS_SHORT in factors:  # LongRoPE
        freq_factors = factors.get(ROPE_FACTORS_SHORT)
        long_factors = factors.get(ROPE_FACTORS_LONG)
        rope_scaling = (("attention_factor", float(meta("rope.scaling.attn_factor", 1.0))),
                        ("original_max_position_embeddings",
                         int(meta("rope.scaling.original_context_length"))),
                        ("rope_type", "longrope"))  # fmt: skip
    rotary = int(meta("rope.dimension_count", head_dim))
    # Granite's multipliers, under llama.cpp's names (absent elsewhere: 1)
    multipliers: dict[str, Any] = {"embedding_multiplier": float(meta("embedding_scale", 1.0)),
                   "residual_multiplier": float(meta("residual_scale", 1.0)),
                   "logits_scaling": float(meta("logit_scale", 1.0))}  # fmt: skip
    attention_multiplier = latent.pop("attention_multiplier", None) or field_value(
        header, f"{arch}.attention.scale"
    )
    # Ministral 3's query temperature, whose positions per step are YaRN's original context
    temperature: dict[str, Any] = {}
    if beta := field_value(header, f"{arch}.attention.temperature_scale"):
        temperature = dict(query_temperature_beta=float(beta), query_temperature_interval=int(
            meta("rope.scaling.original_context_length")))  # fmt: skip
    softcaps: dict[str, Any] = {}
    sinks: dict[str, Any] = {}
    if arch in ("gemma2", "gemma3", "gpt-oss"):
        full_layers = _full_attention_layers(header, arch, num_layers)
    if arch == "olmo2" and window:  # OLMo 3's: windowed layers rotating unscaled, with their
        # own base where the file gives one, beside global ones (every fourth by default)
        registry_name = "olmo3"
        full_layers = _full_attention_layers(header, arch, num_layers)
        local_theta = float(meta("rope.freq_base_swa", meta("rope.freq_base", 10000.0)))
    exaone4_nope: tuple[int, ...] = ()
    if arch == "exaone4" and window:  # its global layers attend without RoPE (every fourth
        # where the file does not list them, as llama.cpp assumes)
        full_layers = exaone4_nope = _full_attention_layers(header, arch, num_layers)
    if arch == "gpt-oss":
        sinks = dict(attention_sinks=True, o_bias="blk.0.attn_output.bias" in names,
                     swiglu_limit=GPT_OSS_SWIGLU_LIMIT,
                     swiglu_alpha=GPT_OSS_SWIGLU_ALPHA)  # fmt: skip
    if arch in ("gemma2", "gemma3"):
        if arch == "gemma3":
            local_theta = float(meta("rope.freq_base_swa", GEMMA3_LOCAL_ROPE_THETA))
        wide = num_layers == (GEMMA3_27B_LAYERS if arch == "gemma3" else GEMMA2_27B_LAYERS)
        query_scalar = float(hidden // num_heads if wide else head_dim)
        for key in ("attn_logit_softcapping", "final_logit_softcapping"):
            value = field_value(header, f"{arch}.{key}")
            softcaps[key] = float(value) if value else None
    # llama.cpp reads no key for SmolLM3's layers without RoPE: every fourth, as published (over
    # at most one layer too many: more are refused with the config)
    nope = range(SMOLLM3_NO_ROPE_INTERVAL - 1, min(num_layers, MAX_LAYERS + 1),
                 SMOLLM3_NO_ROPE_INTERVAL)  # fmt: skip
    pooling = field_value(header, f"{arch}.pooling_type")  # llama.cpp's for embedding models
    kv_heads = meta("attention.head_count_kv", num_heads)
    convolutions: dict[str, Any] = {}
    if arch in ("lfm2", "lfm2moe"):  # a KV head count per layer, 0 for a convolution
        kv_heads, convolutions = _lfm2_layers(kv_heads, meta, path)
    if arch in ("qwen35", "qwen35moe", "qwen3next"):  # (Qwen3-Next's converter leaves the
        # value heads in the checkpoint's order)
        convolutions = _delta_layers(meta, num_layers, extra_layers, tiled=arch != "qwen3next")
    return LlamaArchConfig(
        architecture=registry_name,
        vocab_size=int(meta("vocab_size", len(tokens) or None)),
        hidden_size=hidden,
        # (Qwen3.5-MoE's files have no dense MLP, and may not say its width)
        intermediate_size=int(meta("feed_forward_length", moe.get("expert_intermediate_size"))),
        num_layers=num_layers,
        num_heads=num_heads,
        num_kv_heads=1 if latent else int(kv_heads),
        head_dim=head_dim,
        rms_norm_eps=float(meta("attention.layer_norm_rms_epsilon", 1e-5)),
        rope_theta=float(meta("rope.freq_base", 10000.0)),
        max_position_embeddings=int(meta("context_length", 2048)),
        tie_word_embeddings="output.weight" not in names,
        qkv_bias="blk.0.attn_q.bias" in names,
        rope_scaling=rope_scaling,
        rope_freq_factors=freq_factors,
        rope_long_factors=long_factors,
        rotary_dim=0 if rotary == head_dim else rotary,
        sliding_window=int(window) if window else None,
        full_attention_layers=full_layers,
        nope_layers=tuple(nope) if arch == "smollm3" else exaone4_nope,
        local_rope_theta=local_theta,
        query_pre_attn_scalar=query_scalar,
        bos_token_id=field_value(header, "tokenizer.ggml.bos_token_id"),
        eos_token_ids=_end_tokens(header),
        **moe,
        **temperature,
        **multipliers,
        **softcaps,
        **sinks,
        **latent,
        **convolutions,
        attention_multiplier=None if attention_multiplier is None else float(attention_multiplier),
    ).pooled(_GGUF_POOLING.get(int(pooling), f"pooling_type {pooling}") if pooling else None)


def _biased_routing(header: GGUFHeader, arch: str, path: Path) -> dict[str, Any]:
    """A router with a score bias (`exp_probs_b`) as llama.cpp reads it: GLM-4.5's and
    MiniMax-M2's sigmoid scores (where the file names no gating function), or ERNIE 4.5's
    softmax; the chosen weights renormalized where `expert_weights_norm` says (always for ERNIE
    4.5 and MiniMax-M2); scaled by
    `expert_weights_scale` (0 or absent: unscaled), within expert groups where the file gives
    them."""
    # (llama.cpp's default for DeepSeek-V2's files, which name none)
    default = _SOFTMAX_GATING if arch in ("ernie4_5-moe", "deepseek2") else _SIGMOID_GATING
    gating = field_value(header, f"{arch}.expert_gating_func", default)
    if gating not in (_SOFTMAX_GATING, _SIGMOID_GATING):
        raise ModelLoadError(f"{path}: {arch} expert_gating_func {gating}: softmax "
                             f"({_SOFTMAX_GATING}) or sigmoid ({_SIGMOID_GATING})")  # fmt: skip
    scale = float(field_value(header, f"{arch}.expert_weights_scale", 0.0)) or 1.0
    return dict(
        router_scoring="sigmoid" if gating == _SIGMOID_GATING else "softmax",
        router_score_bias=True,
        routed_scaling_factor=scale,
        norm_topk_prob=arch in _RENORMALIZED_BIASED_ROUTERS
        or bool(field_value(header, f"{arch}.expert_weights_norm", False)),
        expert_groups=int(field_value(header, f"{arch}.expert_group_count", 1)),
        expert_groups_used=int(field_value(header, f"{arch}.expert_group_used_count", 1)),
    )


def _latent_attention(
    meta: Callable[..., Any], rope_scaling: tuple[tuple[str, Any], ...] | None
) -> dict[str, Any]:
    """DeepSeek's latent attention as llama.cpp's `deepseek2` files give it (`meta`: the file's
    fields of its architecture, `gguf_arch_config`'s): the cached row (`kv_lora_rank` + the
    rotated dimensions) as `head_dim`, the query head (`key_length_mla`, or `key_length` in
    files older than llama.cpp's split of `attn_kv_b`) and value head, and the scores' scale
    with YaRN's `mscale_all_dim` (written as a tenth of it)."""
    rope, latent = int(meta("rope.dimension_count")), int(meta("attention.kv_lora_rank"))
    query_head = int(meta("attention.key_length_mla", meta("attention.key_length")))
    value_head = int(meta("attention.value_length_mla", meta("attention.value_length")))
    mscale_all = float(meta("rope.scaling.yarn_log_multiplier", 0.0)) / 0.1
    return dict(head_dim=latent + rope, kv_lora_rank=latent,
                q_lora_rank=int(meta("attention.q_lora_rank", 0)),
                qk_nope_head_dim=query_head - rope,
                v_head_dim=value_head,
                attention_multiplier=latent_scale(query_head, dict(rope_scaling or ()),
                                                  mscale_all))  # fmt: skip


def _end_tokens(header: GGUFHeader) -> tuple[int, ...]:
    """The tokens that end a generation: end of sequence, and where the file names them, end of
    turn and end of message (Llama 3's `<|eot_id|>` and `<|eom_id|>`), as llama.cpp stops on
    each."""
    keys = ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id",
            "tokenizer.ggml.eom_token_id")  # fmt: skip
    ids = (field_value(header, key) for key in keys)
    return tuple(dict.fromkeys(int(i) for i in ids if isinstance(i, int)))


# llama.cpp's `pooling_type` values (0 is none: a generative model; 2, CLS, is not served)
_GGUF_POOLING = {1: "mean", 3: "last"}


def _lfm2_layers(kv_heads: Any, meta: Callable[[str], Any],
                 path: Path) -> tuple[int, dict[str, Any]]:  # fmt: skip
    """LFM2's KV heads and convolution fields from `attention.head_count_kv` (a count per
    layer, 0 for a convolution layer, as its converter writes it) and `shortconv.l_cache`."""
    counts = kv_heads if isinstance(kv_heads, list) else None
    attending = {int(c) for c in counts or () if c}
    if counts is None or len(attending) != 1:
        raise ModelLoadError(f"{path}: lfm2 attention.head_count_kv must list each layer's KV "
                             f"heads, one count for the attention layers and 0 for the "
                             f"convolutions, not {kv_heads!r}")  # fmt: skip
    conv_layers = tuple(i for i, c in enumerate(counts) if not c)
    return attending.pop(), {"conv_layers": conv_layers,
                             "conv_kernel": int(meta("shortconv.l_cache"))}  # fmt: skip


def _offset_norm(architecture: str, name: str) -> bool:
    """Whether a file of `architecture` holds the norm `name` (an HF name) as the 1 + w it
    multiplies by: Gemma's, and Qwen3.5's but its DeltaNet output norm's."""
    if not name.endswith("norm.weight"):
        return False
    if architecture in DELTA_ARCHS:
        return not name.endswith("linear_attn.norm.weight")
    return architecture in ("gemma", "gemma2", "gemma3")


def _delta_layers(meta: Callable[..., Any], num_layers: int, extra_layers: int,
                  tiled: bool) -> dict[str, Any]:  # fmt: skip
    """Qwen3.5's DeltaNet fields as its converter writes them: all layers but every
    `full_attention_interval`-th, their heads and convolution (`ssm.*`: the key heads as
    `group_count`, the value heads as `time_step_rank`, the key width as `state_size`, all value
    heads' width as `inner_size`), the value heads `tiled` (Qwen3.5's files) or not (Qwen3-Next's);
    the multi-token-prediction layers after the last skipped."""
    interval = int(meta("full_attention_interval", 4))
    if not 0 < interval <= max(num_layers, 1):
        raise ValueError(f"full_attention_interval {interval}: a positive layer count")
    key_heads, value_heads = int(meta("ssm.group_count")), int(meta("ssm.time_step_rank"))
    key_dim, inner = int(meta("ssm.state_size")), int(meta("ssm.inner_size"))
    if value_heads <= 0 or inner % value_heads:
        raise ValueError(f"ssm.inner_size {inner} is not a width for each of {value_heads} "
                         "value heads")  # fmt: skip
    value_dim = inner // value_heads
    layers = range(max(0, min(num_layers, MAX_LAYERS + 1)))
    return dict(conv_layers=tuple(i for i in layers if (i + 1) % interval),
                conv_kernel=int(meta("ssm.conv_kernel")), delta_key_heads=key_heads,
                delta_value_heads=value_heads, delta_key_dim=key_dim, delta_value_dim=value_dim,
                delta_heads_tiled=tiled,
                attention_output_gate=True, extra_checkpoint_layers=extra_layers)  # fmt: skip


def _full_attention_layers(header: GGUFHeader, arch: str, num_layers: int) -> tuple[int, ...]:
    """The global layers: as `attention.sliding_window_pattern` lists them (a flag per layer,
    true where windowed) or spaces them (every n-th; 0: none), else every sixth (Gemma 3) or
    every other one (Gemma 2 and gpt-oss), every fourth (EXAONE 4, OLMo 3), as llama.cpp fixes
    them."""
    default = {
        "gemma3": GEMMA3_SLIDING_WINDOW_PATTERN,
        "exaone4": EXAONE4_SLIDING_WINDOW_PATTERN,
        "olmo2": EXAONE4_SLIDING_WINDOW_PATTERN,
    }.get(arch, GEMMA2_SLIDING_WINDOW_PATTERN)
    pattern = field_value(header, f"{arch}.attention.sliding_window_pattern", default)
    if isinstance(pattern, list):
        return tuple(i for i, windowed in enumerate(pattern[:num_layers]) if not windowed)
    n = int(pattern)
    if num_layers > MAX_LAYERS:  # refused with the config; not counted out first
        return ()
    return tuple(i for i in range(num_layers) if n > 0 and (i + 1) % n == 0)


def _rope_scaling(header: GGUFHeader, arch: str, path: Path) -> tuple[tuple[str, Any], ...] | None:
    """`{arch}.rope.scaling.*` as `LlamaArchConfig.rope_scaling`: linear, YaRN (gpt-oss's), or
    none. llama.cpp's YaRN rounds the ramp's ends to whole dimensions (transformers'
    `truncate`) and takes its bounds as 32 and 1 where the file does not say them."""
    kind = field_value(header, f"{arch}.rope.scaling.type", "none")
    if kind == "none":
        return None
    factor = field_value(header, f"{arch}.rope.scaling.factor")
    if kind == "yarn" and factor is not None:
        scaling = f"{arch}.rope.scaling"
        rope = {"factor": float(factor),
                "original_max_position_embeddings":
                    field_value(header, f"{scaling}.original_context_length"),
                "beta_fast": field_value(header, f"{scaling}.yarn_beta_fast"),
                "beta_slow": field_value(header, f"{scaling}.yarn_beta_slow")}  # fmt: skip
        # the `mscale_all_dim` of a checkpoint that gives one (Ministral 3's), against an
        # `mscale` of 1, as llama.cpp reads it; DeepSeek's, written as a tenth of it, against an
        # `mscale` of the same (its published models' two)
        if log_multiplier := field_value(header, f"{scaling}.yarn_log_multiplier"):
            m_all = float(log_multiplier) / (0.1 if arch == "deepseek2" else 1.0)
            rope.update(mscale=m_all if arch == "deepseek2" else 1.0, mscale_all_dim=m_all)
        return tuple(sorted(yarn_settings(rope, {}).items()))
    if kind != "linear" or factor is None:
        raise ModelLoadError(f"{path}: unsupported RoPE scaling {kind!r} (factor {factor})")
    return (("factor", float(factor)), ("rope_type", "linear"))


def unpermute_qk(weight: np.ndarray, num_heads: int) -> np.ndarray:
    """Inverse of llama.cpp's `permute`: interleaved RoPE row pairs back to HF's halves."""
    rows = weight.shape[0]
    return (
        weight.reshape(num_heads, rows // num_heads // 2, 2, *weight.shape[1:])
        .swapaxes(1, 2)
        .reshape(weight.shape)
    )


def hf_name(gguf_name: str, architecture: str) -> str | None:
    """The HF name of a GGUF tensor of that architecture, or None for one we do not know."""
    base, _, kind = gguf_name.rpartition(".")
    if base.startswith("blk.") and base.count(".") == 1:  # a tensor without a kind: blk.N.ssm_a
        base, kind = gguf_name, ""
    if base.startswith("blk."):
        _, layer, part = base.split(".", 2)
        stack, _, expert = part.partition(".")
        if stack in _EXPERT_STACKS and expert.isdigit():
            return f"model.layers.{layer}.mlp.experts.{expert}.{_EXPERT_STACKS[stack]}.{kind}"
        if stack in _HEAD_STACKS and expert.isdigit():  # (one head's slice)
            return f"model.layers.{layer}.{_HEAD_STACKS[stack]}.{expert}.{kind}"
        mapped = _ARCH_LAYER_NAMES.get(architecture, _LAYER_NAMES).get(part)
        if mapped is None:
            return None
        if mapped in _PARAMETER_NAMES:  # a parameter, not a module's weight
            return f"model.layers.{layer}.{mapped}"
        return f"model.layers.{layer}.{mapped}.{kind}" if kind else None
    mapped = _ARCH_TOP_NAMES.get(architecture, _TOP_NAMES).get(base)
    return None if mapped is None else f"{mapped}.{kind}"


@dataclass(frozen=True)
class IndexedTensor:
    """Where one tensor lies in the file: the fields of gguf's `ReaderTensor` that loading uses,
    with `data` mapped from the file when first read."""

    file: np.memmap
    name: str
    tensor_type: GGMLQuantizationType
    shape: tuple[int, ...]  # GGUF order: fastest-varying first
    data_offset: int
    data_dtype: str  # of the raw array gguf's dequantize takes
    data_shape: tuple[int, ...]

    @property
    def data(self) -> np.ndarray:
        dtype = np.dtype(self.data_dtype)
        raw = self.file[self.data_offset : self.data_offset + self.nbytes]
        return raw.view(dtype).reshape(self.data_shape)

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.data_shape)) * np.dtype(self.data_dtype).itemsize

    def release(self) -> None:
        """Drops this tensor's pages from the process's resident memory: they stay in the page
        cache, and a later read maps them again. A load that reads a file tensor by tensor so
        holds one tensor of it at a time, not (by its end) all of it beside its copies."""
        mapping = getattr(self.file, "_mmap", None)  # numpy's memmap keeps its mmap there
        if mapping is None:
            return
        page = mmap.PAGESIZE
        start = -(-self.data_offset // page) * page
        end = (self.data_offset + self.nbytes) // page * page
        if end > start:
            mapping.madvise(mmap.MADV_DONTNEED, start, end - start)


@dataclass
class GGUFIndex:
    """A GGUF file's architecture and tensor locations (see the module docstring), and its
    `general.sampling.*` fields (the sampling settings its authors recommend)."""

    path: Path
    arch: LlamaArchConfig
    entries: list[dict[str, Any]]
    sampling: dict[str, Any]

    @cached_property
    def tensors(self) -> list[IndexedTensor]:
        file = np.memmap(self.path, dtype=np.uint8, mode="r")
        return [IndexedTensor(file, e["name"], GGMLQuantizationType(e["type"]), tuple(e["shape"]),
                              e["offset"], e["dtype"], tuple(e["data_shape"]))
                for e in self.entries]  # fmt: skip


# Bumped whenever what the index holds changes, so no stale index outlives it.
INDEX_VERSION = 13


def _arch_from_json(saved: dict[str, Any]) -> LlamaArchConfig:
    """`dataclasses.asdict`'s JSON back to the config: every list a tuple again (JSON turned
    the config's tuples into lists), `rope_scaling`'s items pairs with their values as saved."""
    fields: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v for k, v in saved.items()}
    rope = saved.get("rope_scaling")
    return LlamaArchConfig(**{**fields, "rope_scaling": tuple(map(tuple, rope)) if rope else None})


def _index_entries(tensor: TensorInfo) -> list[dict[str, Any]]:
    """The index's entries of one tensor: itself, or, for a stack of experts' weights (or
    biases: gpt-oss's), one 2-D (1-D) tensor per expert (`blk.N.ffn_gate_exps.E.weight`), each a
    contiguous slice of the stack; DeepSeek's per-head stacks the same way, a head a slice."""
    dtype, data_shape = tensor.data_layout()
    entry = {"name": tensor.name, "type": tensor.type, "shape": list(tensor.shape),
             "offset": tensor.offset, "dtype": dtype, "data_shape": list(data_shape)}  # fmt: skip
    base, _, kind = tensor.name.rpartition(".")
    stacked_dims = 2 if kind == "bias" else 3
    stacks = base.rpartition(".")[2] in _EXPERT_STACKS or base.rpartition(".")[2] in _HEAD_STACKS
    if not stacks or len(tensor.shape) != stacked_dims:
        return [entry]
    experts, rows = data_shape[0], data_shape[1:]
    expert_bytes = int(np.prod(rows)) * np.dtype(dtype).itemsize
    return [
        {**entry, "name": f"{base}.{e}.{kind}", "shape": list(tensor.shape[:-1]),
         "offset": tensor.offset + e * expert_bytes, "data_shape": list(rows)}
        for e in range(experts)
    ]  # fmt: skip


def read_gguf_index(path: Path) -> GGUFIndex:
    """The file's index, from the cache when it was indexed before, else parsed (and cached)."""
    cached = cache_dir() / "gguf-index" / f"{file_cache_key(path)}-v{INDEX_VERSION}.json"
    try:
        saved = json.loads(cached.read_text())
        index = GGUFIndex(path, _arch_from_json(saved["arch"]), saved["tensors"],
                          saved["sampling"])  # fmt: skip
    except (OSError, ValueError, KeyError, TypeError):
        pass  # not indexed yet, or an index from another version: parse the file
    else:  # (the key covers size and mtime; the check is cheap, and what a reload relies on)
        size = path.stat().st_size
        for e in index.entries:
            try:
                check_tensor(e["name"], e["type"], e["shape"], e["offset"], size)
            except ModelLoadError as err:
                raise ModelLoadError(f"{path}: {err}") from None
        return index
    header = read_gguf_header(path)
    size = path.stat().st_size
    entries = []
    for t in header.tensors:
        try:
            check_tensor(t.name, t.type, list(t.shape), t.offset, size)
        except ModelLoadError as err:
            raise ModelLoadError(f"{path}: {err}") from None
        entries.extend(_index_entries(t))
    try:
        arch = gguf_arch_config(header, path)
    except (ValueError, TypeError, ArithmeticError) as e:  # a field of the wrong kind, a shape
        # refused, or a number no arithmetic takes (inf to int)
        raise ModelLoadError(f"{path}: {e}") from None
    sampling = {k: v for k, v in header.fields.items() if k.startswith("general.sampling.")}
    try:
        cached.parent.mkdir(parents=True, exist_ok=True)
        cached.write_text(json.dumps({"arch": dataclasses.asdict(arch), "tensors": entries,
                                      "sampling": sampling}))  # fmt: skip
    except OSError as e:  # a read-only home only costs the parse next time
        logger.warning("could not cache the GGUF index at %s: %s", cached, e)
    return GGUFIndex(path, arch, entries, sampling)


# The block formats `kernels/csrc/gguf_linear.cpp` multiplies from directly (the legacy ones).
KERNEL_BLOCK_TYPES = tuple(GGMLQuantizationType[f.name] for f in FORMATS.values() if f.legacy)


def iter_gguf_weights(
    reader: GGUFReader | GGUFIndex,
    cfg: LlamaArchConfig,
    path: Path,
    blocks: dict[str, torch.Tensor] | None = None,
    blocks_only: Collection[str] = frozenset(),
    block_types: Iterable[int] = KERNEL_BLOCK_TYPES,
) -> Iterator[tuple[str, torch.Tensor]]:
    """(HF name, float32 tensor) for every tensor; with `blocks`, each matrix stored in one of
    `block_types` (GGML types; by default the exact kernel's) also leaves its raw blocks there
    (uint8 [rows, blocks per row, block bytes], Q/K rows un-permuted like the values), for the
    kernels that read them.
    Tensors named in `blocks_only` leave their blocks alone: never dequantized, not yielded."""
    # layers after the last that generation does not run (GLM-4.5's multi-token prediction)
    extra = {
        f"blk.{i}" for i in range(cfg.num_layers, cfg.num_layers + cfg.extra_checkpoint_layers)
    }
    latent_order = latent_rotary_order(cfg) if cfg.kv_lora_rank else {}
    for tensor in reader.tensors:
        if tensor.name in _ROPE_FACTOR_TENSORS:  # read into the config (`gguf_arch_config`)
            continue
        if extra and ".".join(tensor.name.split(".", 2)[:2]) in extra:
            continue
        name = hf_name(tensor.name, cfg.architecture)
        if name is None:
            raise ModelLoadError(f"{path}: unexpected GGUF tensor {tensor.name!r}")
        # GGUF lists dims fastest-first; numpy order is the reverse.
        shape = tuple(reversed([int(d) for d in tensor.shape]))
        array = None
        if name not in blocks_only:
            try:
                array = dequantize(tensor.data, tensor.tensor_type)
            except NotImplementedError as e:
                raise ModelLoadError(f"{path}: tensor {tensor.name!r} has unsupported type "
                                     f"{tensor.tensor_type.name}") from e  # fmt: skip
            array = np.asarray(array, dtype=np.float32).reshape(shape)
        raw = None
        if blocks is not None and tensor.tensor_type in block_types and len(shape) == 2:
            block_size, block_bytes = GGML_QUANT_SIZES[tensor.tensor_type]
            raw = tensor.data.reshape(shape[0], shape[1] // block_size, block_bytes)
        if array is not None and _offset_norm(cfg.architecture, name):
            array = array - 1  # the file holds the 1 + w each norm multiplies by; HF's w
        projection = name.rpartition(".")[0].rpartition(".")[2]  # q_proj of ...q_proj.bias
        heads = {"q_proj": cfg.num_heads, "k_proj": cfg.num_kv_heads}.get(projection)
        if heads is not None and cfg.architecture in PERMUTED_QK:
            array = None if array is None else unpermute_qk(array, heads)
            raw = None if raw is None else unpermute_qk(raw, heads)
        elif heads is not None and cfg.architecture in PAIR_ROTARY and raw is not None:
            # rotary pairs to halves, as `PairRotaryModel.load_weights` reorders the floats
            # (blocks never pass there)
            raw = raw[pairs_to_halves(heads, cfg.head_dim, cfg.rope_dim)]
        elif projection in latent_order and raw is not None:  # (DeepSeek's, the same way)
            raw = raw[latent_order[projection]]
        if array is not None:  # read: its pages can go
            getattr(tensor, "release", lambda: None)()
        if raw is not None:  # a view of the mapped file where it is contiguous (no copy)
            assert blocks is not None, "raw blocks are read only for a caller that keeps them"
            with warnings.catch_warnings():  # the mapping is read-only, and so is every reader
                warnings.filterwarnings("ignore", "The given NumPy array is not writable")
                blocks[name] = torch.from_numpy(np.ascontiguousarray(raw))
        if array is None:
            if raw is None:
                kind = tensor.tensor_type.name
                raise ModelLoadError(f"{path}: tensor {tensor.name!r} was to stay as its "
                                     f"blocks, but its type {kind} has no kernel")  # fmt: skip
            continue
        # (memory-mapped F32 tensors are read-only views; torch wants writable memory)
        yield name, torch.from_numpy(np.require(array, requirements=["C", "W"]))
