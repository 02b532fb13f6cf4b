"""Shared fixtures: tiny random Llama-family models written as HF folders, and a local tokenizer.

Nothing is downloaded: the tokenizer is a byte-level BPE trained here on a few sentences, and
the models are randomly initialised transformers models saved as safetensors + config.json.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from inflight.process_setup import skip_teardown_at_exit

skip_teardown_at_exit()  # each test worker exits sooner
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
if not torch.cuda.is_available():
    # The Triton decode kernel runs under Triton's interpreter here; it must be on before any
    # library (transformers' generate does) imports Triton.
    os.environ.setdefault("TRITON_INTERPRET", "1")

# Test workers (pytest-xdist) share the cores: each takes its share of threads, and so do the
# servers it starts, rather than every OpenMP pool spinning on all cores at once.
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if _WORKERS > 1:
    _THREADS = max(1, (os.cpu_count() or 1) // _WORKERS)
    os.environ.setdefault("OMP_NUM_THREADS", str(_THREADS))
    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))

CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
CORPUS = [
    "Continuous batching schedules work at the level of single iterations.",
    "The quick brown fox jumps over the lazy dog while the cat sleeps.",
    "PagedAttention stores keys and values in fixed-size blocks of memory.",
    "Émigré café naïve façade: UTF-8 text with accents, and emoji 🚀🙂 too.",
    "Numbers like 12345 and 67890 appear in tables, lists and prose.",
] * 20


def build_tokenizer(folder: Path):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(CORPUS, trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        bos_token="<|im_start|>",
        unk_token="<|endoftext|>",
        pad_token="<|endoftext|>",
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(folder)
    return fast


TINY_ARCHS = ("llama", "llama3_rope", "qwen2", "qwen3", "qwen3_moe", "mixtral", "phi3", "mistral",
              "gemma2", "gemma3", "granite", "gpt_oss", "smollm3", "exaone4", "olmo2",
              "olmo3", "glm4", "ernie4_5", "seed_oss",
              "arcee", "hunyuan_dense", "qwen2_moe", "glm4_moe", "ministral3",
              "ernie4_5_moe", "minimax_m2", "dots1", "hunyuan_moe", "olmoe",
              "granitemoe", "exaone", "gemma", "deepseek_v2", "deepseek_v3",
              "glm4_moe_lite", "lfm2", "lfm2_moe", "qwen3_5", "qwen3_5_moe",
              "qwen3_next")  # fmt: skip


# the tiny Ministral 3's RoPE settings (its published ones: original context 16,384, beta 0.1)
MINISTRAL3_ROPE = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 32.0,
                   "original_max_position_embeddings": 16, "beta_fast": 32.0, "beta_slow": 1.0,
                   "mscale": 1.0, "mscale_all_dim": 1.0, "llama_4_scaling_beta": 2.0}  # fmt: skip


# the tiny Granites' multipliers: none 1, but near enough to it that every sublayer still moves
# the greedy tokens (the published 12, 0.22, 1/128 and 8 leave a tiny random model repeating
# its last token)
GRANITE_MULTIPLIERS = {
    "embedding_multiplier": 2.0,
    "residual_multiplier": 0.5,
    "attention_multiplier": 0.125,
    "logits_scaling": 0.5,
}
# families whose router's score bias, and those whose norms (of w, not 1 + w), the tiny models
# draw at random rather than leave at their initial 0 and 1
SCORE_BIASED = ("glm4_moe", "ernie4_5_moe", "minimax_m2", "dots1", "deepseek_v3",
                "glm4_moe_lite", "lfm2_moe")  # fmt: skip
UNIT_NORMS = ("exaone4", "olmo2", "olmo3", "glm4", "hunyuan_dense", "glm4_moe", "minimax_m2",
              "dots1", "hunyuan_moe", "olmoe", "deepseek_v2", "deepseek_v3",
              "glm4_moe_lite", "lfm2", "lfm2_moe")  # fmt: skip
# families whose norms multiply by 1 + w (w from 0), which the tiny models draw at random
OFFSET_NORMS = ("gemma", "gemma2", "gemma3", "qwen3_5", "qwen3_5_moe", "qwen3_next")
# the tiny DeepSeeks' latent attention (heads of 32 + 32 rotated dimensions, a latent of 32:
# whole quantization blocks, and a cached row of 64, whose values the CPU kernels read out of
# its keys) and YaRN past an original context of 16 positions, with `mscale_all_dim` scaling
# the scores (as many KV heads as query heads, as transformers' expanded attention needs)
DEEPSEEK_LATENT = {"kv_lora_rank": 32, "qk_nope_head_dim": 32, "qk_rope_head_dim": 32,
                   "v_head_dim": 16, "num_key_value_heads": 4}  # fmt: skip
DEEPSEEK_YARN = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 32.0,
                 "original_max_position_embeddings": 16, "beta_fast": 32.0, "beta_slow": 1.0,
                 "mscale": 0.707, "mscale_all_dim": 0.707}  # fmt: skip


def build_tiny_model(
    folder: Path, arch: str, vocab_size: int, seed: int = 0, odd_widths: bool = False
) -> Path:
    from transformers import (
        ArceeConfig,
        ArceeForCausalLM,
        DeepseekV2Config,
        DeepseekV2ForCausalLM,
        DeepseekV3Config,
        DeepseekV3ForCausalLM,
        Dots1Config,
        Dots1ForCausalLM,
        Ernie4_5_MoeConfig,
        Ernie4_5_MoeForCausalLM,
        Ernie4_5Config,
        Ernie4_5ForCausalLM,
        Exaone4Config,
        Exaone4ForCausalLM,
        ExaoneConfig,
        Gemma2Config,
        Gemma2ForCausalLM,
        Gemma3ForCausalLM,
        Gemma3TextConfig,
        GemmaConfig,
        GemmaForCausalLM,
        Glm4Config,
        Glm4ForCausalLM,
        Glm4MoeConfig,
        Glm4MoeForCausalLM,
        Glm4MoeLiteConfig,
        Glm4MoeLiteForCausalLM,
        GptOssConfig,
        GptOssForCausalLM,
        GraniteConfig,
        GraniteForCausalLM,
        GraniteMoeSharedConfig,
        GraniteMoeSharedForCausalLM,
        HunYuanDenseV1Config,
        HunYuanDenseV1ForCausalLM,
        HunYuanMoEV1Config,
        HunYuanMoEV1ForCausalLM,
        Lfm2Config,
        Lfm2ForCausalLM,
        Lfm2MoeConfig,
        Lfm2MoeForCausalLM,
        LlamaConfig,
        LlamaForCausalLM,
        MiniMaxM2Config,
        MiniMaxM2ForCausalLM,
        Ministral3Config,
        Ministral3ForCausalLM,
        MistralConfig,
        MistralForCausalLM,
        MixtralConfig,
        MixtralForCausalLM,
        Olmo2Config,
        Olmo2ForCausalLM,
        Olmo3Config,
        Olmo3ForCausalLM,
        OlmoeConfig,
        OlmoeForCausalLM,
        Phi3Config,
        Phi3ForCausalLM,
        Qwen2Config,
        Qwen2ForCausalLM,
        Qwen2MoeConfig,
        Qwen2MoeForCausalLM,
        Qwen3_5ForCausalLM,
        Qwen3_5MoeForCausalLM,
        Qwen3_5MoeTextConfig,
        Qwen3_5TextConfig,
        Qwen3Config,
        Qwen3ForCausalLM,
        Qwen3MoeConfig,
        Qwen3MoeForCausalLM,
        Qwen3NextConfig,
        Qwen3NextForCausalLM,
        SeedOssConfig,
        SeedOssForCausalLM,
        SmolLM3Config,
        SmolLM3ForCausalLM,
    )

    # `odd_widths`: hidden, MLP and expert widths that are no multiple of 32 floats (ATen's
    # vector loops take two AVX-512 vectors a turn), where an element-wise op over a whole
    # [T, width] tensor puts an element in a vector lane or in the scalar tail by T
    hidden, intermediate, expert = (80, 136, 24) if odd_widths else (64, 128, 32)
    common = dict(
        vocab_size=vocab_size,
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        rms_norm_eps=1e-5,
        initializer_range=0.2,  # large enough that greedy argmax has clear winners
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    if arch == "llama":
        config, cls = LlamaConfig(**common, rope_theta=10000.0), LlamaForCausalLM
    elif arch == "llama3_rope":
        rope = {
            "rope_type": "llama3",
            "rope_theta": 500000.0,
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64,
        }
        config = LlamaConfig(**common, rope_scaling=rope, tie_word_embeddings=True)
        cls = LlamaForCausalLM
    elif arch in ("llama_wide", "llama_wide_tied"):  # widths of whole 256-weight super-blocks,
        # for the K-quants
        wide = {**common, "hidden_size": 256, "intermediate_size": 512}
        config = LlamaConfig(**wide, rope_theta=10000.0, tie_word_embeddings=arch.endswith("tied"))
        cls = LlamaForCausalLM
    elif arch == "qwen2":
        config, cls = Qwen2Config(**common, tie_word_embeddings=False), Qwen2ForCausalLM
    elif arch == "qwen3":  # heads of 128 as in every Qwen3 (4 x 128 > hidden 64), which is also
        # what transformers assumes for a qwen3 GGUF
        config = Qwen3Config(**common, head_dim=128, tie_word_embeddings=True)
        cls = Qwen3ForCausalLM
    elif arch == "qwen3_moe":  # 2 of 4 experts a token (renormalized) in layer 0, a dense
        # MLP in layer 1
        config = Qwen3MoeConfig(**common, num_experts=4, num_experts_per_tok=2,
                                moe_intermediate_size=expert, norm_topk_prob=True,
                                mlp_only_layers=[1])  # fmt: skip
        cls = Qwen3MoeForCausalLM
    elif arch == "qwen3_moe_sparse":  # experts in every layer, as llama.cpp's qwen3moe has them
        config = Qwen3MoeConfig(**common, num_experts=4, num_experts_per_tok=2,
                                moe_intermediate_size=expert, norm_topk_prob=True)  # fmt: skip
        cls = Qwen3MoeForCausalLM
    elif arch == "qwen2_moe":  # 2 of 4 experts a token (not renormalized) and a gated shared
        # expert in every layer, as llama.cpp's qwen2moe has them; q/k/v biases
        config = Qwen2MoeConfig(**common, num_experts=4, num_experts_per_tok=2,
                                moe_intermediate_size=expert, shared_expert_intermediate_size=64,
                                tie_word_embeddings=False)  # fmt: skip
        cls = Qwen2MoeForCausalLM
    elif arch == "glm4_moe":  # a dense layer, then a sparse one: 2 of 8 experts a token by
        # sigmoid scores plus a bias, from the better of 2 groups, renormalized and scaled, and a
        # shared expert; q/k norms, q/k/v biases, RoPE over half of each head (of 32)
        config = Glm4MoeConfig(**common, head_dim=32, n_routed_experts=8, num_experts_per_tok=2,
                               moe_intermediate_size=expert, n_shared_experts=1,
                               first_k_dense_replace=1, n_group=2, topk_group=1,
                               routed_scaling_factor=2.5, use_qk_norm=True,
                               attention_bias=True)  # fmt: skip
        cls = Glm4MoeForCausalLM
    elif arch == "deepseek_v2":  # DeepSeek-V2-Lite's shape: queries without a latent; a
        # dense layer, then 2 of 8 experts a token by a float32 softmax within the better of 2
        # groups (by their best), unrenormalized and scaled, beside a shared expert
        config = DeepseekV2Config(**{**common, **DEEPSEEK_LATENT}, q_lora_rank=None,
                                  n_routed_experts=8, num_experts_per_tok=2,
                                  moe_intermediate_size=expert, n_shared_experts=1,
                                  first_k_dense_replace=1, topk_method="group_limited_greedy",
                                  n_group=2, topk_group=1, routed_scaling_factor=2.0,
                                  rope_parameters=DEEPSEEK_YARN)  # fmt: skip
        cls = DeepseekV2ForCausalLM
    elif arch == "deepseek_v3":  # queries through a latent; a dense layer, then 2 of 8 experts
        # by sigmoid scores plus a bias from the better of 2 groups, renormalized and scaled,
        # beside a shared expert
        rope = {**DEEPSEEK_YARN, "mscale": 1.0, "mscale_all_dim": 1.0}
        config = DeepseekV3Config(**{**common, **DEEPSEEK_LATENT}, q_lora_rank=32,
                                  n_routed_experts=8, num_experts_per_tok=2,
                                  moe_intermediate_size=expert, n_shared_experts=1,
                                  first_k_dense_replace=1, n_group=2, topk_group=1,
                                  routed_scaling_factor=2.5, rope_parameters=rope)  # fmt: skip
        cls = DeepseekV3ForCausalLM
    elif arch == "glm4_moe_lite":  # GLM-4.7-Flash: DeepSeek-V3's layers (queries through a
        # latent, the biased sigmoid router within the better of 2 groups) named by
        # `mlp_layer_types`, and RoPE without YaRN
        config = Glm4MoeLiteConfig(**{**common, **DEEPSEEK_LATENT}, q_lora_rank=32,
                                   n_routed_experts=8, num_experts_per_tok=2,
                                   moe_intermediate_size=expert, n_shared_experts=1,
                                   mlp_layer_types=["dense", "sparse"], n_group=2, topk_group=1,
                                   routed_scaling_factor=1.8,
                                   rope_parameters={"rope_type": "default",
                                                    "rope_theta": 10000.0})  # fmt: skip
        cls = Glm4MoeLiteForCausalLM
    elif arch == "ministral3":  # YaRN past an original context of 16 positions, and queries
        # tempered from there on, by a beta far above the published 0.1 so that it moves tokens
        config = Ministral3Config(**common, head_dim=16, rope_parameters=MINISTRAL3_ROPE)
        cls = Ministral3ForCausalLM
    elif arch == "ernie4_5_moe":  # a dense layer, then a sparse one: 2 of 8 experts a token by
        # a float32 softmax plus a bias, renormalized, beside a shared expert; rotary pairs
        config = Ernie4_5_MoeConfig(**common, head_dim=16, rope_theta=10000.0, moe_num_experts=8,
                                    moe_k=2, moe_intermediate_size=expert, moe_num_shared_experts=1,
                                    moe_layer_start_index=1)  # fmt: skip
        cls = Ernie4_5_MoeForCausalLM
    elif arch == "minimax_m2":  # 2 of 4 experts a token in every layer by sigmoid scores plus a
        # bias, renormalized; q/k norms across all heads; RoPE over half of each head
        config = MiniMaxM2Config(**{**common, "intermediate_size": expert}, head_dim=16,
                                 num_local_experts=4, num_experts_per_tok=2,
                                 rotary_dim=8)  # fmt: skip
        cls = MiniMaxM2ForCausalLM
    elif arch == "dots1":  # GLM-4.5's experts (dense first layer, 2 of 8 by sigmoid scores
        # plus a bias from the better of 2 groups, renormalized and scaled, a shared expert)
        # beside Qwen3's attention, with as many KV heads as query heads (as published, and as
        # llama.cpp assumes)
        config = Dots1Config(**{**common, "num_key_value_heads": 4}, head_dim=16,
                             n_routed_experts=8, num_experts_per_tok=2,
                             moe_intermediate_size=expert, n_shared_experts=1,
                             first_k_dense_replace=1, n_group=2, topk_group=1,
                             routed_scaling_factor=2.5, norm_topk_prob=True,
                             rope_theta=10000.0)  # fmt: skip
        cls = Dots1ForCausalLM
    elif arch == "mixtral":  # 2 of 4 experts a token in every layer, a sliding window
        config = MixtralConfig(**{**common, "intermediate_size": expert}, num_local_experts=4,
                               num_experts_per_tok=2, sliding_window=24)  # fmt: skip
        cls = MixtralForCausalLM
    elif arch == "phi3":  # fused q/k/v and gate/up in the checkpoint, a sliding window
        config, cls = Phi3Config(**common, sliding_window=24), Phi3ForCausalLM
    elif arch == "phi4_mini":  # Phi-4-mini's RoPE: the first 3/4 of each head rotate, with
        # LongRoPE factors past an original context of 64 positions
        rope = {"rope_type": "longrope", "rope_theta": 10000.0, "partial_rotary_factor": 0.75,
                "short_factor": [1.0, 1.1, 1.3, 1.6, 2.0, 2.5],
                "long_factor": [1.0, 2.0, 4.0, 8.0, 16.0, 32.0],
                "original_max_position_embeddings": 64}  # fmt: skip
        config = Phi3Config(**common, rope_parameters=rope, original_max_position_embeddings=64)
        cls = Phi3ForCausalLM
    elif arch == "granite":  # its four multipliers, none of them 1
        config = GraniteConfig(**common, **GRANITE_MULTIPLIERS, tie_word_embeddings=True)
        cls = GraniteForCausalLM
    elif (
        arch == "granitemoe"
    ):  # Granite's multipliers, 2 of 4 experts a token (a softmax over the chosen) in every
        # layer, stacked in the checkpoint, and a shared MLP (Granite MoE Shared's; plain Granite
        # MoE has none)
        config = GraniteMoeSharedConfig(**{**common, "intermediate_size": expert},
                                        num_local_experts=4, num_experts_per_tok=2,
                                        shared_intermediate_size=64, tie_word_embeddings=True,
                                        **GRANITE_MULTIPLIERS)  # fmt: skip
        cls = GraniteMoeSharedForCausalLM
    elif arch == "mistral":
        config, cls = MistralConfig(**common, sliding_window=24), MistralForCausalLM
    elif arch == "exaone":  # EXAONE 3.5: Llama's layer under GPT-2-style names (transformers 5
        # saves the original names, and architectures as Llama's), llama3 RoPE
        rope = {"rope_type": "llama3", "rope_theta": 1e6, "factor": 8.0, "low_freq_factor": 1.0,
                "high_freq_factor": 4.0, "original_max_position_embeddings": 64}  # fmt: skip
        config, cls = ExaoneConfig(**common, rope_parameters=rope), LlamaForCausalLM
    elif arch == "exaone4":  # three windowed layers with RoPE, then a global one without
        # (the 32B's pattern); norms of the sublayers' outputs alone, per-head q/k norms
        config = Exaone4Config(**{**common, "num_hidden_layers": 4}, sliding_window=24,
                               sliding_window_pattern=4, rope_theta=10000.0)  # fmt: skip
        cls = Exaone4ForCausalLM
    elif arch == "olmo2":  # norms of the sublayers' outputs alone, q/k norms across heads
        config, cls = Olmo2Config(**common, rope_theta=10000.0), Olmo2ForCausalLM
    elif arch == "olmo3":  # OLMo 2's layers, three windowed with a RoPE base of their own to
        # each global one with YaRN past an original context of 64 positions
        rope = {"full_attention": {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 8.0,
                                   "original_max_position_embeddings": 64},
                "sliding_attention": {"rope_type": "default", "rope_theta": 5000.0}}  # fmt: skip
        config = Olmo3Config(**{**common, "num_hidden_layers": 4}, sliding_window=24,
                             rope_parameters=rope)  # fmt: skip
        cls = Olmo3ForCausalLM
    elif arch == "glm4":  # RoPE in interleaved pairs over half of each head (heads of 32:
        # the 16 rotary dimensions fill a multiple of 8 lanes), q/k/v biases, four norms a layer
        rope = {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5}
        config = Glm4Config(**common, head_dim=32, attention_bias=True, rope_parameters=rope)
        cls = Glm4ForCausalLM
    elif arch == "ernie4_5":  # the Llama decoder rotating interleaved pairs, tied embeddings
        config = Ernie4_5Config(**common, head_dim=16, rope_theta=10000.0)
        cls = Ernie4_5ForCausalLM
    elif arch == "seed_oss":  # q/k/v biases, none on the output projection
        config = SeedOssConfig(**common, head_dim=16, rope_theta=10000.0)
        cls = SeedOssForCausalLM
    elif arch == "lfm2":  # short convolutions in layers 0, 2 and 3, attention with per-head q/k
        # norms in 1 and 4 (LFM2's mix); its MLP's width adjusted as published (2/3, rounded
        # up to a multiple of 32 here)
        types = ["conv", "full_attention", "conv", "conv", "full_attention"]
        rope = {"rope_type": "default", "rope_theta": 10000.0}
        config = Lfm2Config(**{**common, "num_hidden_layers": 5}, norm_eps=1e-5,
                            layer_types=types, block_multiple_of=32,
                            rope_parameters=rope)  # fmt: skip
        cls = Lfm2ForCausalLM
    elif arch == "qwen3_5":  # gated DeltaNet in layers 0 and 2 (2 key heads of 16 over 4 value
        # heads of 32, a convolution of 4), gated attention in 1 and 3 (heads of 64, RoPE over
        # their first quarter: 16 dimensions): every other layer attends, a pattern a GGUF file
        # can state. Value heads of a whole Q8_0 block: a GGUF file reorders them in out_proj's
        # columns, which blocks across heads would round apart
        rope = {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25}
        config = Qwen3_5TextConfig(**{**common, "num_hidden_layers": 4}, head_dim=64,
                                   full_attention_interval=2, rope_parameters=rope,
                                   linear_num_key_heads=2, linear_num_value_heads=4,
                                   linear_key_head_dim=16, linear_value_head_dim=32)  # fmt: skip
        cls = Qwen3_5ForCausalLM
    elif arch == "qwen3_5_moe":  # Qwen3.5's layers (as its tiny model's above), 2 of 4 experts
        # a token, renormalized, beside a shared expert under a sigmoid gate, in every layer
        rope = {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25}
        dense = {k: v for k, v in common.items() if k != "intermediate_size"}
        config = Qwen3_5MoeTextConfig(**{**dense, "num_hidden_layers": 4}, head_dim=64,
                                      full_attention_interval=2, rope_parameters=rope,
                                      linear_num_key_heads=2, linear_num_value_heads=4,
                                      linear_key_head_dim=16, linear_value_head_dim=32,
                                      num_experts=4, num_experts_per_tok=2,
                                      moe_intermediate_size=expert,
                                      shared_expert_intermediate_size=32)  # fmt: skip
        cls = Qwen3_5MoeForCausalLM
    elif arch == "qwen3_next":  # Qwen3.5-MoE's layers (as above), the projections grouped by
        # key head; a dense MLP in layer 1 (`mlp_only_layers`)
        rope = {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25}
        config = Qwen3NextConfig(**{**common, "num_hidden_layers": 4}, head_dim=64,
                                 layer_types=["linear_attention", "full_attention"] * 2,
                                 rope_parameters=rope, linear_num_key_heads=2,
                                 linear_num_value_heads=4, linear_key_head_dim=16,
                                 linear_value_head_dim=32, num_experts=4, num_experts_per_tok=2,
                                 moe_intermediate_size=expert, shared_expert_intermediate_size=32,
                                 norm_topk_prob=True, mlp_only_layers=[1])  # fmt: skip
        cls = Qwen3NextForCausalLM
    elif arch == "lfm2_moe":  # LFM2's layers, a dense first MLP, then 2 of 4 experts a token
        # chosen by sigmoid scores plus a learned bias, renormalized
        types = ["conv", "full_attention", "conv", "conv", "full_attention"]
        rope = {"rope_type": "default", "rope_theta": 10000.0}
        config = Lfm2MoeConfig(**{**common, "num_hidden_layers": 5}, norm_eps=1e-5,
                               layer_types=types, rope_parameters=rope, num_experts=4,
                               num_experts_per_tok=2, moe_intermediate_size=expert,
                               num_dense_layers=1)  # fmt: skip
        cls = Lfm2MoeForCausalLM
    elif arch == "arcee":  # an MLP without a gate: up, ReLU squared, down
        config, cls = ArceeConfig(**common, rope_theta=10000.0), ArceeForCausalLM
    elif arch == "hunyuan_dense":  # per-head q/k norms after RoPE, whose NTK alpha stretches
        # the base
        rope = {"rope_type": "dynamic", "alpha": 1000.0, "factor": 1.0, "rope_theta": 10000.0}
        config = HunYuanDenseV1Config(**common, head_dim=16, rope_parameters=rope)
        cls = HunYuanDenseV1ForCausalLM
    elif arch == "hunyuan_moe":  # Hunyuan's attention with 2 of 4 experts a token, renormalized,
        # beside a shared expert, in every layer
        rope = {"rope_type": "dynamic", "alpha": 1000.0, "factor": 1.0, "rope_theta": 10000.0}
        config = HunYuanMoEV1Config(**{**common, "intermediate_size": expert}, head_dim=16,
                                    num_experts=4, moe_topk=2, rope_parameters=rope)  # fmt: skip
        cls = HunYuanMoEV1ForCausalLM
    elif arch == "olmoe":  # q/k norms across all heads, 2 of 4 experts a token (not
        # renormalized) in every layer; as many KV heads as query heads (as published, and as
        # llama.cpp assumes)
        config = OlmoeConfig(**{**common, "intermediate_size": expert, "num_key_value_heads": 4},
                             num_experts=4, num_experts_per_tok=2, rope_theta=10000.0)  # fmt: skip
        cls = OlmoeForCausalLM
    elif arch == "smollm3":  # its fourth layer without RoPE (SmolLM3's default interval, the
        # one its GGUF files imply)
        config = SmolLM3Config(**{**common, "num_hidden_layers": 4}, rope_theta=10000.0)
        cls = SmolLM3ForCausalLM
    elif arch == "gemma":  # Gemma's `1 + w` norms before the sublayers, tanh-GELU, scaled
        # embeddings, tied LM head; heads of 32 (the 2B's one KV head)
        config = GemmaConfig(**{**common, "num_key_value_heads": 1}, head_dim=32,
                             rope_theta=10000.0)  # fmt: skip
        cls = GemmaForCausalLM
    elif arch == "gemma2":  # every other layer windowed, and soft caps far below the tiny
        # model's scores and logits, so that both change what it computes
        config = Gemma2Config(**{**common, "num_hidden_layers": 4}, head_dim=32,
                              query_pre_attn_scalar=24, sliding_window=24,
                              attn_logit_softcapping=2.0, final_logit_softcapping=3.0)  # fmt: skip
        cls = Gemma2ForCausalLM
    elif arch == "gemma3":  # five windowed layers and a global one (Gemma 3's pattern, which
        # its GGUF files imply), each kind with its RoPE base; a score scale not head_dim's
        rope = {"full_attention": {"rope_type": "default", "rope_theta": 1e6},
                "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}  # fmt: skip
        config = Gemma3TextConfig(**{**common, "num_hidden_layers": 6}, head_dim=32,
                                  query_pre_attn_scalar=24, sliding_window=24,
                                  rope_parameters=rope)  # fmt: skip
        cls = Gemma3ForCausalLM
    elif arch == "gpt_oss":  # 2 of 4 biased experts, a banded and a global layer, sinks, YaRN
        # past an original context of 64 positions, and a SwiGLU limit the tiny values reach
        rope = {
            "rope_type": "yarn",
            "rope_theta": 150000.0,
            "factor": 8.0,
            "beta_fast": 32.0,
            "beta_slow": 1.0,
            "truncate": False,
            "original_max_position_embeddings": 64,
        }
        config = GptOssConfig(**{**common, "intermediate_size": expert}, head_dim=16,
                              num_local_experts=4, num_experts_per_tok=2, sliding_window=24,
                              layer_types=["sliding_attention", "full_attention"],
                              rope_parameters=rope, attention_bias=True,
                              swiglu_limit=0.5)  # fmt: skip
        cls = GptOssForCausalLM
    else:
        raise ValueError(arch)
    torch.manual_seed(seed)
    model = cls(config).eval()
    if arch in ("gpt_oss", "glm4", "seed_oss", "glm4_moe"):  # sinks and biases start at 0:
        # make them matter
        with torch.no_grad():
            for name, param in model.named_parameters():
                if name.endswith(("sinks", "bias")):
                    param.uniform_(-1.0, 1.0)
    if arch in SCORE_BIASED:  # the router's score bias starts at 0 too (a buffer of GLM-4.5's
        # and MiniMax-M2's): by about the scores' spread
        spread = 0.1 if arch == "ernie4_5_moe" else 0.3
        with torch.no_grad():
            for name, tensor in [*model.named_buffers(), *model.named_parameters()]:
                if name.endswith(("e_score_correction_bias", "expert_bias")):
                    tensor.uniform_(-spread, spread)
    if arch in UNIT_NORMS:  # norms start at 1: make them matter
        with torch.no_grad():
            for name, param in model.named_parameters():
                if name.endswith("norm.weight"):
                    param.uniform_(0.5, 1.5)
    if arch in OFFSET_NORMS:  # norms start at w = 0 (a scale of 1 + w): make it matter
        # (Qwen3.5's DeltaNet output norm multiplies by w, from 1)
        with torch.no_grad():
            for name, param in model.named_parameters():
                if name.endswith("linear_attn.norm.weight"):
                    param.uniform_(0.5, 1.5)
                elif name.endswith("norm.weight"):
                    param.uniform_(-0.5, 0.5)
    model.save_pretrained(folder, safe_serialization=True)
    return folder


@pytest.fixture(scope="session")
def tokenizer_dir(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("tokenizer")
    build_tokenizer(folder)
    return folder


@pytest.fixture(scope="session")
def tiny_model_factory(tmp_path_factory, tokenizer_dir):
    """Returns a function (arch, odd_widths) -> folder with a tiny random model plus the local
    tokenizer."""
    cache: dict[str, Path] = {}

    def make(arch: str = "llama", odd_widths: bool = False) -> Path:
        key = f"{arch}-odd" if odd_widths else arch
        if key not in cache:
            from transformers import AutoTokenizer

            folder = tmp_path_factory.mktemp(f"tiny-{key}")
            tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
            tokenizer.save_pretrained(folder)
            cache[key] = build_tiny_model(folder, arch, len(tokenizer), odd_widths=odd_widths)
        return cache[key]

    return make


@pytest.fixture(scope="session")
def tiny_llama(tiny_model_factory) -> Path:
    return tiny_model_factory("llama")


# The longest files, longest first (20 s to over two minutes each on the 2-core CI machine,
# measured with `--durations=0`): one of them started last holds its worker long after the
# others are done.
LONGEST_FILES = (
    "bench/test_bench_smoke.py", "server/test_replicas.py", "integration/test_smollm2_parity.py",
    "parallel/test_tensor_parallel.py", "model/test_parity_tiny.py",
    "integration/test_batch_invariance.py", "integration/test_structured_outputs.py",
    "runner/test_attention.py", "server/test_fuzz_api.py", "runner/test_kv_cache_dtype.py",
    "server/test_load_and_faults.py", "server/test_observability.py",
    "integration/test_gemma3_parity.py", "integration/test_openai_server.py", "test_tokenizer.py",
    "model/test_fused_layers.py", "integration/test_hf_export.py",
)  # fmt: skip


def pytest_collection_modifyitems(config, items):
    """The longest files first, then the other files with slow tests, then the rest:
    pytest-xdist hands out whole files (`--dist loadfile`) in collection order (with
    `--no-loadscope-reorder`; by default it sorts them by their number of tests, which sends
    the few-test heavy files last), and a slow file started last leaves the other workers idle
    at the end."""
    slow_files = {item.path for item in items if item.get_closest_marker("slow")}
    tests_dir = Path(__file__).parent

    def rank(item) -> tuple[int, int]:
        name = item.path.relative_to(tests_dir).as_posix() if item.path.is_relative_to(
            tests_dir) else ""  # fmt: skip
        if name in LONGEST_FILES:
            return 0, LONGEST_FILES.index(name)
        return (1 if item.path in slow_files else 2), 0

    items.sort(key=rank)  # stable: the rest keep their order


def pytest_addoption(parser):
    parser.addoption(
        "--full", action="store_true", default=False,
        help="long variants of bounded tests (API fuzzing: 10,000 requests instead of 1,000)",
    )  # fmt: skip
