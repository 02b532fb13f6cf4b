"""LlamaArchConfig: the shape of a Llama-family model, from HF config.json or GGUF metadata.

Covers Llama (with llama3 / linear RoPE scaling), Mistral (sliding window), Qwen2 (q/k/v bias),
Qwen3 (q/k norms), SmolLM3 (layers without RoPE), EXAONE 4 (norms of the sublayers' outputs
alone, windowed layers beside global ones without RoPE), OLMo 2 (the same norms, its q/k norms
across all heads) and OLMo 3 (with windowed layers of their own RoPE), GLM-4 (RoPE in
interleaved pairs over half of each head) and ERNIE 4.5 (over all of it), Seed-OSS (q/k/v
biases), Arcee (an MLP without a gate), Hunyuan (q/k norms after RoPE), Qwen3-MoE and Mixtral
(experts), Phi-3 / Phi-4 (fused projections in the checkpoint, LongRoPE, Phi-4-mini's partial
rotary embeddings), Gemma 3 text (windowed and global layers, each kind with its own RoPE),
gpt-oss (attention sinks, banded and global layers, YaRN, biased experts with a clamped SwiGLU)
and SmolLM2. Both transformers 4 (`rope_theta` + `rope_scaling`) and transformers 5
(`rope_parameters`, per layer kind where layers differ) spellings of RoPE settings are read.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

SUPPORTED_ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
    "Qwen3MoeForCausalLM": "qwen3_moe",
    "Qwen2MoeForCausalLM": "qwen2_moe",
    "Glm4MoeForCausalLM": "glm4_moe",
    "MiniMaxM2ForCausalLM": "minimax_m2",
    "Dots1ForCausalLM": "dots1",
    "OlmoeForCausalLM": "olmoe",
    "MixtralForCausalLM": "mixtral",
    "Phi3ForCausalLM": "phi3",
    "GraniteForCausalLM": "granite",
    "GraniteMoeForCausalLM": "granitemoe",
    "GraniteMoeSharedForCausalLM": "granitemoe",  # (a shared MLP beside the experts)
    "GemmaForCausalLM": "gemma",
    "Gemma2ForCausalLM": "gemma2",
    "Gemma3ForCausalLM": "gemma3",
    "Gemma3ForConditionalGeneration": "gemma3",  # its language model (`_text_config`)
    "Ministral3ForCausalLM": "ministral3",
    "GptOssForCausalLM": "gpt_oss",
    "SmolLM3ForCausalLM": "smollm3",
    "Exaone4ForCausalLM": "exaone4",
    "ExaoneForCausalLM": "exaone",  # EXAONE 3.0 and 3.5 (`_exaone_config`)
    "Olmo2ForCausalLM": "olmo2",
    "Olmo3ForCausalLM": "olmo3",
    "Glm4ForCausalLM": "glm4",
    "Ernie4_5ForCausalLM": "ernie4_5",
    "Ernie4_5_MoeForCausalLM": "ernie4_5_moe",
    "SeedOssForCausalLM": "seed_oss",
    "ArceeForCausalLM": "arcee",
    "HunYuanDenseV1ForCausalLM": "hunyuan_dense",
    "HunYuanMoEV1ForCausalLM": "hunyuan_moe",
    "DeepseekV2ForCausalLM": "deepseek_v2",
    "DeepseekV3ForCausalLM": "deepseek_v3",  # (Kimi K2's and Moonlight's too)
    "Glm4MoeLiteForCausalLM": "glm4_moe_lite",  # GLM-4.7-Flash: DeepSeek-V3's layers
    "Lfm2ForCausalLM": "lfm2",  # LFM2: short convolutions beside attention layers
    "Lfm2MoeForCausalLM": "lfm2_moe",  # (its MLPs experts after the first dense ones)
    "Qwen3_5ForCausalLM": "qwen3_5",  # Qwen3.5: gated DeltaNet layers beside gated attention
    "Qwen3_5MoeForCausalLM": "qwen3_5_moe",  # (its MLPs experts and a gated shared expert)
    "Qwen3NextForCausalLM": "qwen3_next",  # (Qwen3.5-MoE's layers, their projections grouped)
    # the bare decoders, without an LM head, that embedding models are (Qwen3-Embedding's
    # weights): they pool the last token's hidden state unless the folder says otherwise
    "LlamaModel": "llama",
    "MistralModel": "mistral",
    "Qwen2Model": "qwen2",
    "Qwen3Model": "qwen3",
}
# how an embedding model pools its hidden states into one vector: the last token's (decoder
# embedding models: Qwen3-Embedding, e5-mistral, gte-Qwen2) or their mean
POOLING_MODES = ("last", "mean")
MAX_LAYERS = 1024  # far beyond any model's; a config asking more is broken or hostile
MAX_EXPERTS = 4096  # the same for experts a layer (the largest published MoEs have 256)
MAX_CONV_KERNEL = 64  # a short convolution's positions (LFM2's are 3)
# the families whose configs tie the LM head to the embeddings where they do not say (as
# transformers' config classes default); the others untie it
TIED_BY_DEFAULT = ("gemma", "gemma2", "gemma3", "smollm3", "ernie4_5", "ernie4_5_moe", "lfm2",
                   "lfm2_moe")  # fmt: skip
# the families whose MLPs are experts (`_experts`)
EXPERT_ARCHS = ("qwen3_moe", "qwen2_moe", "mixtral", "gpt_oss", "glm4_moe", "ernie4_5_moe",
                "minimax_m2", "dots1", "hunyuan_moe", "olmoe", "granitemoe", "deepseek_v2",
                "deepseek_v3", "glm4_moe_lite", "lfm2_moe", "qwen3_5_moe",
                "qwen3_next")  # fmt: skip
# the families with LFM2's short convolutions (`conv_layers`)
CONV_ARCHS = ("lfm2", "lfm2_moe")
# the families with gated DeltaNet layers (`delta_value_heads`: Qwen3.5's)
DELTA_ARCHS = ("qwen3_5", "qwen3_5_moe", "qwen3_next")
MAX_DELTA_SIZE = 2**12  # a DeltaNet head count or width (Qwen3.5's: 16-64 heads of 128)
# the families whose attention is DeepSeek's multi-head latent attention (`kv_lora_rank`)
LATENT_ATTENTION_ARCHS = ("deepseek_v2", "deepseek_v3", "glm4_moe_lite")
# every n-th layer without RoPE, where a config does not list them (SmolLM3's fourth; llama.cpp
# assumes it for every `smollm3` file)
SMOLLM3_NO_ROPE_INTERVAL = 4
# every n-th layer global, where a config does not list them: Gemma 3's sixth, Gemma 2's second
GEMMA3_SLIDING_WINDOW_PATTERN = 6
GEMMA2_SLIDING_WINDOW_PATTERN = 2
EXAONE4_SLIDING_WINDOW_PATTERN = 4  # EXAONE 4's fourth, OLMo 3's
DOTS1_MAX_WINDOW_LAYERS = 62  # dots.llm1's layers before the windowed ones (all of its 62)


@dataclass(frozen=True)
class LlamaArchConfig:
    architecture: str  # a key of model/registry.py's MODEL_CLASSES
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    qkv_bias: bool = False
    sliding_window: int | None = None
    rope_scaling: tuple[tuple[str, Any], ...] | None = None  # frozen dict items
    # a GGUF's `rope_freqs`: each frequency divided by its factor (llama3 scaling, as llama.cpp
    # stores it), in place of `rope_scaling`; with LongRoPE (`rope_scaling` type `longrope`),
    # its short factors, and `rope_long_factors` its long ones (`LlamaModel.fit_rope_to`)
    rope_freq_factors: tuple[float, ...] | None = None
    rope_long_factors: tuple[float, ...] | None = None
    # how many of each head's dimensions RoPE rotates, the first ones (0: all; Phi-4-mini's 3/4)
    rotary_dim: int = 0
    # layers that see every position although the model has a `sliding_window` (Gemma 3's every
    # sixth); () where all layers share the window
    full_attention_layers: tuple[int, ...] = ()
    # layers whose queries and keys are not rotated at all (SmolLM3's every fourth: "NoPE")
    nope_layers: tuple[int, ...] = ()
    # the RoPE base of the windowed layers where it is not the global layers' (Gemma 3's 10k);
    # `rope_scaling` and `rope_freq_factors` apply to the global layers only
    local_rope_theta: float | None = None
    query_pre_attn_scalar: float | None = None  # scores scaled by its -1/2 power, not head_dim's
    # Granite's multipliers: of the embeddings, of attention's and the MLP's outputs before each
    # joins the residual stream, of the scores (in place of head_dim ** -0.5), and a divisor of
    # the logits; 1 (None) for every other family
    embedding_multiplier: float = 1.0
    residual_multiplier: float = 1.0
    attention_multiplier: float | None = None
    logits_scaling: float = 1.0
    # Gemma 2's soft caps: each scaled attention score s, and each logit, becomes c tanh(s / c)
    attn_logit_softcapping: float | None = None
    final_logit_softcapping: float | None = None
    # mixture of experts (Qwen3-MoE): each token's MLP is its `experts_per_token` best of
    # `num_experts` SiLU MLPs of `expert_intermediate_size`, weighted by the router's softmax
    # (renormalized over those chosen with `norm_topk_prob`); `dense_layers` keep one MLP
    num_experts: int = 0
    experts_per_token: int = 0
    expert_intermediate_size: int = 0
    norm_topk_prob: bool = False
    dense_layers: tuple[int, ...] = ()
    # how the router scores experts: "softmax" over all of them, or "sigmoid" (GLM-4.5's,
    # DeepSeek-V3's): each expert's own sigmoid. With `router_score_bias` (GLM-4.5's, ERNIE 4.5's)
    # or `float32_router` (DeepSeek-V2's, without the bias) the router is float32, and a learned
    # bias added to the scores counts only for the choice, within the `expert_groups_used` best
    # of `expert_groups` groups (by their two best biased scores; by their best with
    # `expert_group_by_max`, DeepSeek-V2's); the chosen scores, renormalized with
    # `norm_topk_prob`, weigh the experts times `routed_scaling_factor`
    router_scoring: str = "softmax"
    router_score_bias: bool = False
    float32_router: bool = False
    expert_groups: int = 1
    expert_groups_used: int = 1
    expert_group_by_max: bool = False
    routed_scaling_factor: float = 1.0
    # what a float32 router adds to the sum it renormalizes by (LFM2-MoE's 1e-6)
    router_norm_epsilon: float = 1e-20
    # a shared expert (Qwen2-MoE's, GLM-4.5's): one more SiLU MLP of this width that every
    # token of a sparse layer runs through, added to the routed experts' sum (0: none); Qwen2-MoE
    # scales it by a sigmoid gate of the token's own (`shared_expert_gate`)
    shared_expert_intermediate_size: int = 0
    shared_expert_gate: bool = False
    # per-head q/k RMSNorms where a family has them only in some sizes (GLM-4.5's use_qk_norm)
    qk_norm: bool = False
    # layers the checkpoint holds after the last one that generation does not run (GLM-4.5's
    # multi-token-prediction layer): skipped at load
    extra_checkpoint_layers: int = 0
    # DeepSeek's multi-head latent attention (`kv_lora_rank` > 0): a token's keys and values
    # are one latent of `kv_lora_rank` plus `rotary_dim` rotated dimensions shared by every
    # head, cached as one KV head of `head_dim` = their sum; each head's query
    # (`qk_nope_head_dim` + `rotary_dim`, through a latent of `q_lora_rank` where nonzero) and
    # value (`v_head_dim`) are projections of that latent, absorbed into the query and the
    # output (`model/deepseek.py`); the scores' scale is `attention_multiplier`
    kv_lora_rank: int = 0
    q_lora_rank: int = 0
    qk_nope_head_dim: int = 0
    v_head_dim: int = 0
    # the latent's expansion held one matrix a head (W_UK transposed, W_UV: a GGUF file's
    # `attn_k_b` / `attn_v_b`), each head's a linear of its own that multiplies from its blocks,
    # rather than `kv_b_proj` whole (a folder's, an older file's)
    latent_expansion_per_head: bool = False
    # the heads whose W_UK and W_UV (as per-head linears) a rank holds: every head of the model
    # under tensor parallelism (a few MiB a layer), each rank multiplying its own (0: the
    # model's own `num_heads`, unsplit)
    latent_expansion_heads: int = 0
    # where q/k norms span all heads (`qk_norms_span_heads`) under tensor parallelism: the
    # whole model's query and KV heads, which a rank's norms normalize together (its heads
    # gathered with the others'); 0: the model's own `num_heads` / `num_kv_heads`
    qk_norm_heads: tuple[int, int] = (0, 0)
    # Llama 4's attention temperature (Ministral 3's): after RoPE each query is multiplied by
    # 1 + beta ln(1 + floor(position / interval)), so that scores stay sharp past the original
    # context (beta 0: none; it is 1 within the first interval)
    query_temperature_beta: float = 0.0
    query_temperature_interval: int = 0
    # gpt-oss: the router keeps the best logits before its softmax (over those chosen), router
    # and experts have biases, and each expert's gate is `swiglu_limit`-clamped SwiGLU with
    # sigmoid slope `swiglu_alpha` (its up half clamped too, plus 1); None: SiLU experts
    swiglu_limit: float | None = None
    swiglu_alpha: float = 1.702
    # gpt-oss's attention: a learned logit per head joins each softmax's denominator (a sink
    # that takes probability from every key), and the output projection has a bias
    attention_sinks: bool = False
    o_bias: bool = False
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    # LFM2's short-convolution layers, which hold no KV: each mixes a token with the
    # `conv_kernel - 1` before it (a gated depthwise convolution), whose inputs each request
    # carries from step to step (`runner/conv_state.py`); the other layers attend
    conv_layers: tuple[int, ...] = ()
    conv_kernel: int = 0
    # the channels of each of LFM2's convolutions a rank holds under tensor parallelism (0: all
    # of `hidden_size`)
    conv_channels: int = 0
    # Qwen3.5's gated DeltaNet layers, which are `conv_layers` too (a short convolution of
    # their q, k and v rows, `delta_conv_channels` wide, comes first): each also carries a state
    # matrix [delta_key_dim, delta_value_dim] per value head from step to step, decayed and
    # corrected by the delta rule at every token (`model/qwen3_5.py`); 0 heads: none. Each key
    # head serves `delta_value_heads / delta_key_heads` value heads.
    delta_value_heads: int = 0
    delta_key_heads: int = 0
    delta_key_dim: int = 0
    delta_value_dim: int = 0
    # value head i is served by key head i % key heads (llama.cpp's files, whose converter
    # reorders the value heads so), not i // (value heads / key heads) (the checkpoints')
    delta_heads_tiled: bool = False
    # the attention's output multiplied by the sigmoid of a gate that the query projection
    # makes beside each query head (Qwen3.5's)
    attention_output_gate: bool = False
    # an embedding model's pooling (`POOLING_MODES`); None for a generative model
    pooling: str | None = None
    # its vectors' leading dimensions are a vector too (Matryoshka training, `is_matryoshka`):
    # a client may ask for fewer (`dimensions`)
    matryoshka: bool = False

    def __post_init__(self) -> None:
        """Refuses shapes no model has (ValueError, which the loaders report with the file):
        a hostile or broken config must not hang building 2**64 layers or divide by zero."""
        sizes = ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads",
                 "num_kv_heads", "head_dim")  # fmt: skip
        for name in sizes:
            value = getattr(self, name)
            if not isinstance(value, int) or not 0 < value < 2**31:
                raise ValueError(f"{name} must be a positive integer below 2**31, not {value!r}")
        if self.num_layers > MAX_LAYERS:
            raise ValueError(f"{self.num_layers} layers: more than {MAX_LAYERS}")
        if not all(isinstance(i, int) and 0 <= i < self.num_layers for i in self.nope_layers):
            raise ValueError(f"nope_layers {self.nope_layers} must be layers of the "
                             f"{self.num_layers}")  # fmt: skip
        if not all(isinstance(i, int) and 0 <= i < self.num_layers for i in self.conv_layers):
            raise ValueError(f"conv_layers {self.conv_layers} must be layers of the "
                             f"{self.num_layers}")  # fmt: skip
        if len(self.conv_layers) == self.num_layers:
            raise ValueError("a model of convolution layers alone is not supported: at least "
                             "one layer attends")  # fmt: skip
        if self.conv_layers and not (isinstance(self.conv_kernel, int)
                                     and 2 <= self.conv_kernel <= MAX_CONV_KERNEL):  # fmt: skip
            raise ValueError(f"conv_L_cache {self.conv_kernel!r}: a kernel of 2 to "
                             f"{MAX_CONV_KERNEL} positions")  # fmt: skip
        if self.delta_value_heads:
            self._check_delta_layers()
        if self.sliding_window is not None and self.sliding_window <= 0:
            raise ValueError(f"sliding_window must be positive, not {self.sliding_window}")
        scalar = self.query_pre_attn_scalar
        if scalar is not None and not (math.isfinite(scalar) and scalar > 0):
            raise ValueError(f"query_pre_attn_scalar must be positive, not {scalar}")
        for name in ("embedding_multiplier", "residual_multiplier", "attention_multiplier",
                     "logits_scaling", "attn_logit_softcapping",
                     "final_logit_softcapping"):  # fmt: skip
            value = getattr(self, name)
            if value is not None and not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be positive, not {value}")
        if self.num_experts and not 0 < self.experts_per_token <= self.num_experts:
            raise ValueError(f"{self.experts_per_token} experts a token of {self.num_experts}")
        if not 0 <= self.num_experts <= MAX_EXPERTS:
            raise ValueError(f"{self.num_experts} experts a layer: more than {MAX_EXPERTS}")
        if self.num_experts and not 0 < self.expert_intermediate_size < 2**31:
            raise ValueError(f"expert_intermediate_size {self.expert_intermediate_size!r}")
        self._check_routing()
        self._check_latent_attention()
        beta, interval = self.query_temperature_beta, self.query_temperature_interval
        if not (isinstance(beta, float) and math.isfinite(beta) and beta >= 0):
            raise ValueError(f"query temperature beta {beta!r}: a number of at least 0")
        if beta and not (isinstance(interval, int) and 0 < interval < 2**31):
            raise ValueError(f"query temperature interval {interval!r}: a positive context")
        if not 0 <= self.rotary_dim <= self.head_dim or self.rotary_dim % 2:
            raise ValueError(f"rotary_dim {self.rotary_dim} of heads of {self.head_dim}: it "
                             "must be even and at most head_dim")  # fmt: skip
        frequencies = self.rope_dim // 2
        for factors in (self.rope_freq_factors, self.rope_long_factors):
            if factors is not None and (
                len(factors) != frequencies or not all(math.isfinite(f) and f > 0 for f in factors)
            ):  # fmt: skip
                raise ValueError(f"RoPE factors must be {frequencies} positive numbers, "
                                 f"got {len(factors)}")  # fmt: skip
        if self.rope_scaling_dict.get("rope_type") == "longrope":
            if self.rope_freq_factors is None or self.rope_long_factors is None:
                raise ValueError("longrope scaling needs its short and its long factors")
            original = self.rope_scaling_dict.get("original_max_position_embeddings")
            if not isinstance(original, int) or not 1 < original < 2**31:
                raise ValueError(f"original_max_position_embeddings {original!r}: a context "
                                 "length of more than one position")  # fmt: skip
        if self.pooling is not None and self.pooling not in POOLING_MODES:
            raise ValueError(f"pooling {self.pooling!r}: only {' and '.join(POOLING_MODES)} "
                             "pooling are supported")  # fmt: skip
        if self.swiglu_limit is not None and not (
            math.isfinite(self.swiglu_limit) and self.swiglu_limit > 0
            and math.isfinite(self.swiglu_alpha)
        ):  # fmt: skip
            raise ValueError(f"swiglu_limit {self.swiglu_limit} must be positive")
        attention = self.rope_attention_factor
        if not (math.isfinite(attention) and attention > 0):
            raise ValueError(f"the RoPE attention factor must be positive, not {attention}")

    def _check_routing(self) -> None:
        """Refuses routing settings no router can follow (ValueError)."""
        if self.router_scoring not in ("softmax", "sigmoid"):
            raise ValueError(f"router scoring {self.router_scoring!r}: softmax or sigmoid")
        if self.router_scoring == "sigmoid" and not self.router_score_bias:
            raise ValueError("a sigmoid router without its score bias is not supported")
        groups, used = self.expert_groups, self.expert_groups_used
        if not (isinstance(groups, int) and isinstance(used, int) and 0 < used <= groups
                and (not self.num_experts or self.num_experts % groups == 0)):  # fmt: skip
            raise ValueError(
                f"{used} of {groups} expert groups over {self.num_experts} experts: "
                "the groups must divide the experts, and be used at most all"
            )
        if self.num_experts and self.experts_per_token > used * (self.num_experts // groups):
            raise ValueError(f"{self.experts_per_token} experts a token from {used} groups of "
                             f"{self.num_experts // groups}")  # fmt: skip
        scale = self.routed_scaling_factor
        if not (isinstance(scale, float) and math.isfinite(scale) and scale > 0):
            raise ValueError(f"routed_scaling_factor must be positive, not {scale!r}")
        eps = self.router_norm_epsilon
        if not (isinstance(eps, float) and math.isfinite(eps) and 0 <= eps < 1):
            raise ValueError(f"router_norm_epsilon {eps!r}: a number in [0, 1)")
        size = self.shared_expert_intermediate_size
        if not (isinstance(size, int) and 0 <= size < 2**31):
            raise ValueError(f"shared_expert_intermediate_size {size!r}")
        if not (isinstance(self.extra_checkpoint_layers, int)
                and 0 <= self.extra_checkpoint_layers <= MAX_LAYERS):  # fmt: skip
            raise ValueError(f"{self.extra_checkpoint_layers!r} extra checkpoint layers")

    def _check_latent_attention(self) -> None:
        """Refuses latent-attention shapes that do not make one cached head (ValueError)."""
        sizes = (self.kv_lora_rank, self.q_lora_rank, self.qk_nope_head_dim, self.v_head_dim)
        if not all(isinstance(v, int) and 0 <= v < 2**31 for v in sizes):
            raise ValueError(f"latent attention sizes {sizes}: integers of at least 0")
        if not self.kv_lora_rank:
            return
        if self.query_temperature_beta:  # (a deepseek2 file may name one: Mistral Large 3's)
            raise ValueError("a query temperature with latent attention is not supported")
        if not (self.qk_nope_head_dim and self.v_head_dim and self.rotary_dim):
            raise ValueError("latent attention needs positive qk_nope_head_dim, v_head_dim and "
                             "qk_rope_head_dim")  # fmt: skip
        if self.num_kv_heads != 1 or self.head_dim != self.kv_lora_rank + self.rotary_dim:
            raise ValueError(f"latent attention caches one KV head of kv_lora_rank + "
                             f"qk_rope_head_dim, not {self.num_kv_heads} of "
                             f"{self.head_dim}")  # fmt: skip

    @property
    def values_are_keys(self) -> bool:
        """Whether each layer attends with its keys as its values (latent attention's cached
        row is both), so that its cache may hold them once (`runner/kv_cache.py`)."""
        return self.kv_lora_rank > 0

    @property
    def routes_in_float32(self) -> bool:
        """Whether the router's weights stay float32 and it chooses in float32 (a score-biased
        router's, or DeepSeek-V2's `float32_router`)."""
        return self.router_score_bias or self.float32_router

    @property
    def rope_dim(self) -> int:
        """The dimensions of each head that RoPE rotates."""
        return self.rotary_dim or self.head_dim

    @property
    def rope_attention_factor(self) -> float:
        """What LongRoPE and YaRN multiply cos and sin by (1 otherwise)."""
        return float(self.rope_scaling_dict.get("attention_factor", 1.0))

    @property
    def rope_scaling_dict(self) -> dict[str, Any]:
        return dict(self.rope_scaling or ())

    @property
    def qk_norms_span_heads(self) -> bool:
        """Whether each token's queries (and keys) are normalized as one vector across all heads
        (OLMo 2's), not head by head (Qwen3's)."""
        return self.architecture in ("olmo2", "olmo3", "minimax_m2", "olmoe")

    def layer_rotary(self, layer: int) -> bool:
        """Whether this layer rotates its queries and keys (RoPE)."""
        return layer not in self.nope_layers

    def layer_window(self, layer: int) -> int | None:
        """How many positions back a query of this layer sees (None: all of them)."""
        return None if layer in self.full_attention_layers else self.sliding_window

    def _check_delta_layers(self) -> None:
        names = ("value_heads", "key_heads", "key_dim", "value_dim")
        for name in names:
            value = getattr(self, f"delta_{name}")
            if not (isinstance(value, int) and 0 < value <= MAX_DELTA_SIZE):
                raise ValueError(f"the DeltaNet layers' {name} {value!r}: a positive integer "
                                 f"up to {MAX_DELTA_SIZE}")  # fmt: skip
        if self.delta_value_heads % self.delta_key_heads:
            raise ValueError(f"{self.delta_value_heads} DeltaNet value heads do not share "
                             f"{self.delta_key_heads} key heads evenly")  # fmt: skip

    @property
    def delta_conv_channels(self) -> int:
        """The width of a DeltaNet layer's q, k and v rows, which its convolution mixes."""
        return (2 * self.delta_key_heads * self.delta_key_dim
                + self.delta_value_heads * self.delta_value_dim)  # fmt: skip

    @property
    def conv_width(self) -> int:
        """The channels of each short convolution this model (a rank's share of it) holds."""
        if self.delta_value_heads:
            return self.delta_conv_channels
        return self.conv_channels or self.hidden_size

    @property
    def kv_layers(self) -> tuple[int, ...]:
        """The layers that attend, and so hold keys and values in the KV cache, in order: every
        layer but LFM2's convolutions. KV-side structures (the cache's tensors, the KV groups'
        layouts, per-layer attention metadata) are indexed by position in this tuple."""
        if not self.conv_layers:
            return tuple(range(self.num_layers))
        return tuple(i for i in range(self.num_layers) if i not in self.conv_layers)

    @property
    def recurrent_shape(self) -> tuple[int, int, int] | None:
        """A DeltaNet layer's state matrices of one request [value heads, key dim, value dim]
        (None: the model has no DeltaNet layers)."""
        if not self.delta_value_heads:
            return None
        return self.delta_value_heads, self.delta_key_dim, self.delta_value_dim

    def sequence_state_bytes(self, element_bytes: int) -> int:
        """One sequence's state in every convolution layer: its last inputs, `element_bytes`
        each, and where the layers are DeltaNet's, their float32 matrices (0 without them)."""
        if not self.conv_layers:
            return 0
        inputs = (self.conv_kernel - 1) * self.conv_width * element_bytes
        shape = self.recurrent_shape
        return len(self.conv_layers) * (inputs + (0 if shape is None else math.prod(shape) * 4))

    def saved_states(self, prefix_caching: bool, num_saved_states: int | None, seats: int) -> int:
        """The states a state-carrying model saves for prefix-cache hits (`StateSnapshots`):
        `num_saved_states`, by default one a seat, where the cache is on; else none (and none
        for a model that pools every prompt position, which no hit may skip)."""
        if not (self.conv_layers and prefix_caching and self.pooling != "mean"):
            return 0
        return seats if num_saved_states is None else num_saved_states

    def caches_prefixes(self, prefix_caching: bool, saved_states: int) -> bool:
        """Whether the prefix cache serves this model: not where pooling reads every prompt
        position (none may come from the cache), nor for a state-carrying model without saved
        states (none could resume)."""
        return (prefix_caching and self.pooling != "mean"
                and (saved_states > 0 or not self.conv_layers))  # fmt: skip

    @property
    def layer_windows(self) -> list[int | None]:
        """Every KV layer's `layer_window`, in order."""
        return [self.layer_window(layer) for layer in self.kv_layers]

    @property
    def windowed_fraction(self) -> float:
        """The fraction of layers that attend within `sliding_window` (0 without one)."""
        if self.sliding_window is None:
            return 0.0
        return 1 - len(self.full_attention_layers) / self.num_layers

    @property
    def attention_scale(self) -> float | None:
        """The scores' scale where the family sets its own (None: head_dim ** -0.5)."""
        if self.attention_multiplier is not None:
            return self.attention_multiplier
        return None if self.query_pre_attn_scalar is None else self.query_pre_attn_scalar**-0.5

    @classmethod
    def from_hf_config(cls, config: dict[str, Any]) -> LlamaArchConfig:
        """Raises KeyError / ValueError on an unsupported or incomplete config (loader wraps)."""
        archs = config.get("architectures") or []
        if any(a in _IMAGE_AND_TEXT for a in archs):
            config = _text_config(config, next(a for a in archs if a in _IMAGE_AND_TEXT))
            archs = config["architectures"]
        if config.get("model_type") == "exaone":  # (transformers 5 saves it as Llama's)
            config, archs = _exaone_config(config), ["ExaoneForCausalLM"]
        arch = next(
            (SUPPORTED_ARCHITECTURES[a] for a in archs if a in SUPPORTED_ARCHITECTURES), None
        )
        if arch is None:
            raise ValueError(
                f"unsupported architecture {archs or config.get('model_type')!r}; "
                f"supported: {', '.join(SUPPORTED_ARCHITECTURES)}"
            )
        quantization = config.get("quantization_config")
        if quantization is not None:  # gpt-oss's MXFP4 experts load (`model/mxfp4.py`)
            method = quantization.get("quant_method") if isinstance(quantization, dict) else None
            if (method, arch) != ("mxfp4", "gpt_oss"):
                raise ValueError(f"quantization {method or quantization!r} is not supported: "
                                 "quantized weights load from GGUF files, or as gpt-oss's "
                                 "mxfp4 checkpoints")  # fmt: skip
        latent: dict[str, Any] = {}
        if arch in LATENT_ATTENTION_ARCHS:
            config, latent = _latent_attention(config)
        convolutions: dict[str, Any] = {}
        if arch in CONV_ARCHS:
            config, convolutions = _lfm2_config(config, adjust_mlp=arch == "lfm2")
        if arch in DELTA_ARCHS:
            config, convolutions = _gated_delta_config(config)
        for key in ("num_attention_heads", "hidden_size", "head_dim"):  # (divided below)
            value = config.get(key)
            if value is None and key == "head_dim":
                continue  # (hidden_size / heads)
            if not (isinstance(value, int) and not isinstance(value, bool) and 0 < value < 2**31):
                raise ValueError(f"{key} must be a positive integer below 2**31, not {value!r}")
        num_heads = config["num_attention_heads"]
        hidden = config["hidden_size"]
        params = dict(config.get("rope_parameters") or {})
        local_params = params.pop("sliding_attention", None)  # per layer kind (Gemma 3)
        params = params.pop("full_attention", params)
        if arch in ("hunyuan_dense", "hunyuan_moe"):
            params = _ntk_alpha_base(params or dict(config.get("rope_scaling") or {}), config)
        # Ministral 3's query temperature, which transformers keeps with its RoPE settings
        temperature_beta = (
            params.pop("llama_4_scaling_beta", None) if arch == "ministral3" else None
        )
        params.pop("max_position_embeddings", None)  # (Ministral 3's copy of the config's)
        rope_theta, rope, rope_type = _rope_settings(params, config, config.get("rope_theta"))
        # (GLM-4.5's rotates half of each head unless its config says otherwise; MiniMax-M2's
        # say how many dimensions, `rotary_dim`)
        default_rotary = 0.25 if arch in DELTA_ARCHS else 0.5 if arch == "glm4_moe" else 1.0
        if arch == "minimax_m2" and isinstance(config.get("rotary_dim"), int):
            default_rotary = config["rotary_dim"] / (config.get("head_dim") or hidden // num_heads)
        rotary = float(
            rope.pop("partial_rotary_factor", config.get("partial_rotary_factor", default_rotary))
        )
        if not 0 < rotary <= 1:  # (NaN and infinities too)
            raise ValueError(f"partial_rotary_factor {rotary} must be in (0, 1]")
        head_dim = config.get("head_dim") or hidden // num_heads
        short = long = None
        mscale_all = rope.get("mscale_all_dim")  # (YaRN's settings keep no copy)
        if rope_type == "longrope":
            rope, short, long = _longrope(rope, config)
        elif rope_type == "yarn":
            rope = yarn_settings(rope, config)
        if latent:
            latent["attention_multiplier"] = latent_scale(
                latent["qk_nope_head_dim"] + config["qk_rope_head_dim"], rope, mscale_all
            )
        temperature: dict[str, Any] = {}
        if temperature_beta is not None:  # (its positions per step: YaRN's original context)
            beta = temperature_beta
            temperature = {
                "query_temperature_beta": float(beta) if isinstance(beta, int | float) else beta,
                "query_temperature_interval": rope.get("original_max_position_embeddings"),
            }
        window = config.get("sliding_window") if arch != "llama" else None
        if arch in ("qwen2", "qwen3", "qwen3_moe", "qwen2_moe", "smollm3"):
            if config.get("use_sliding_window", False):
                family = "SmolLM3" if arch == "smollm3" else "Qwen"
                raise ValueError(f"{family} per-layer sliding window attention is not supported")
            window = None
        nope = _nope_layers(config) if arch == "smollm3" else ()
        if arch == "olmoe" and config.get("clip_qkv") is not None:
            raise ValueError("OLMoE with clipped q/k/v (clip_qkv) is not supported")
        if arch in ("ernie4_5", "ernie4_5_moe") and config.get("use_bias"):
            raise ValueError("ERNIE 4.5 with biased linears (use_bias) is not supported")
        if arch == "arcee" and (config.get("hidden_act", "relu2") != "relu2"
                                or config.get("mlp_bias")):  # fmt: skip
            raise ValueError(f"Arcee with hidden_act {config.get('hidden_act')!r} or MLP "
                             "biases is not supported (relu2, unbiased)")  # fmt: skip
        if arch == "seed_oss" and (config.get("attention_out_bias") or config.get("mlp_bias")):
            raise ValueError("Seed-OSS with biases on its output projection or MLP "
                             "(attention_out_bias, mlp_bias) is not supported")  # fmt: skip
        full_layers: tuple[int, ...] = ()
        local_theta = query_scalar = None
        softcaps: dict[str, Any] = {}
        if arch == "gemma" and (config.get("hidden_activation") or "gelu_pytorch_tanh") != (
            "gelu_pytorch_tanh"
        ):  # (transformers' Gemma takes tanh-GELU where `hidden_activation` is unset)
            raise ValueError(f"unsupported hidden_activation {config['hidden_activation']!r}")
        if arch in ("gemma2", "gemma3"):
            full_layers, local_theta = _gemma_layers(config, local_params, arch)
            query_scalar = float(config.get("query_pre_attn_scalar", 256))
            for key in ("attn_logit_softcapping", "final_logit_softcapping"):
                softcaps[key] = None if config.get(key) is None else float(config[key])
        experts = _experts(config, arch) if arch in EXPERT_ARCHS else {}
        sinks: dict[str, Any] = {}
        if arch == "dots1":  # windowed from `max_window_layers` on, where a window is set
            full_layers = _dots1_full_layers(config, window)
            window = None if len(full_layers) == config["num_hidden_layers"] else window
        if arch == "exaone4":  # its global layers attend without RoPE
            full_layers = nope = _global_layers(config, window)
        if arch == "olmo3" and window is not None:  # its windowed layers rotate unscaled
            full_layers = _global_layers(config, window)
            local_theta = _local_rope_theta(local_params, rope_theta)
        if arch == "gpt_oss":
            full_layers = _layer_types(config)
            bias = bool(config.get("attention_bias", True))
            sinks = {"attention_sinks": True, "o_bias": bias,
                     "swiglu_limit": float(config.get("swiglu_limit", 7.0)),
                     "swiglu_alpha": float(config.get("swiglu_alpha", 1.702))}  # fmt: skip
        multipliers: dict[str, Any] = {}
        if arch in ("granite", "granitemoe"):
            multipliers = {key: float(config.get(key, 1.0)) for key in (
                "embedding_multiplier", "residual_multiplier", "attention_multiplier",
                "logits_scaling")}  # fmt: skip
        eos = config.get("eos_token_id")
        eos_ids = tuple(eos) if isinstance(eos, list) else (() if eos is None else (eos,))
        return cls(
            architecture=arch,
            vocab_size=config["vocab_size"],
            hidden_size=hidden,
            intermediate_size=config["intermediate_size"],
            num_layers=config["num_hidden_layers"],
            num_heads=num_heads,
            num_kv_heads=config.get("num_key_value_heads") or num_heads,
            head_dim=head_dim,
            rms_norm_eps=config.get("rms_norm_eps", 1e-6),
            rope_theta=float(rope_theta),
            max_position_embeddings=config.get("max_position_embeddings", 2048),
            tie_word_embeddings=bool(config.get("tie_word_embeddings", arch in TIED_BY_DEFAULT)),
            # (Seed-OSS's q/k/v biases are on unless its config says otherwise)
            qkv_bias=_qkv_bias(config, arch),
            sliding_window=window,
            rope_scaling=None if rope_type == "default" else tuple(sorted(rope.items())),
            rope_freq_factors=short,
            rope_long_factors=long,
            rotary_dim=0 if rotary == 1.0 else round(head_dim * rotary),
            full_attention_layers=full_layers,
            nope_layers=nope,
            local_rope_theta=local_theta,
            query_pre_attn_scalar=query_scalar,
            **experts,
            **temperature,
            **sinks,
            **multipliers,
            **softcaps,
            **latent,
            **convolutions,
            bos_token_id=config.get("bos_token_id"),
            eos_token_ids=eos_ids,
            matryoshka=bool(config.get("is_matryoshka") or config.get("matryoshka_dimensions")),
        ).pooled("last" if any(a.endswith("Model") for a in archs) else None)

    def pooled(self, pooling: str | None) -> LlamaArchConfig:
        """The same model as an embedding model pooling its hidden states `pooling`'s way (None:
        generative, unchanged). Its LM head is never used: tied to the embeddings, so that a
        checkpoint without one loads, and one with it skips it."""
        if pooling is None:
            return self
        return dataclasses.replace(self, pooling=pooling, tie_word_embeddings=True)


def _rope_settings(
    params: dict[str, Any], config: dict[str, Any], theta: float | None
) -> tuple[float, dict[str, Any], str]:
    """(base, scaling settings, scaling type) from one set of transformers 5 `rope_parameters`,
    or from transformers 4's `rope_theta` (`theta`) and `rope_scaling` when it is empty."""
    rope = dict(params)
    rope_theta = rope.pop("rope_theta", None) or theta or 10000.0
    if not rope:
        rope = dict(config.get("rope_scaling") or {})
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type == "su":  # LongRoPE's name in the first Phi-3 128k configs
        rope_type = "longrope"
    if rope_type == "mrope":  # the Qwen VLs' multimodal RoPE: the plain one over text alone
        rope_type = "default"
    if rope_type not in ("default", "llama3", "linear", "longrope", "yarn"):
        raise ValueError(f"unsupported rope_type {rope_type!r}")
    rope["rope_type"] = rope_type
    rope.pop("type", None)
    return float(rope_theta), rope, rope_type


def _longrope(
    rope: dict[str, Any], config: dict[str, Any]
) -> tuple[dict[str, Any], tuple[float, ...], tuple[float, ...]]:
    """LongRoPE's settings (as transformers reads them): its short and long factors apart, and
    the original context and the attention factor (cos and sin are multiplied by it: by default
    sqrt(1 + ln(factor) / ln(original)), factor = max positions / original) in the scaling."""
    original = rope.get("original_max_position_embeddings") or config[
        "original_max_position_embeddings"
    ]  # fmt: skip
    if not isinstance(original, int) or not 1 < original < 2**31:  # (ln(1) divides below)
        raise ValueError(f"original_max_position_embeddings {original!r}: a context length of "
                         "more than one position")  # fmt: skip
    factor = rope.get("factor") or config["max_position_embeddings"] / original
    attention = rope.get("attention_factor")
    if attention is None:
        attention = 1.0 if factor <= 1 else math.sqrt(1 + math.log(factor) / math.log(original))
    short = tuple(float(f) for f in rope.pop("short_factor"))
    long = tuple(float(f) for f in rope.pop("long_factor"))
    scaling = {"rope_type": "longrope", "original_max_position_embeddings": int(original),
               "attention_factor": float(attention)}  # fmt: skip
    return scaling, short, long


def yarn_settings(rope: dict[str, Any], config: dict[str, Any]) -> dict[str, Any]:
    """YaRN's settings as transformers reads them: the scale `factor` (by default the max
    positions over the original context), `beta_fast` / `beta_slow` (the ramp's rotation
    bounds), `truncate` (whole dimensions at the ramp's ends), and the attention factor cos and
    sin are multiplied by (by default 0.1 ln(factor) + 1, or the `mscale` / `mscale_all_dim`
    ratio of that)."""
    original = rope.get("original_max_position_embeddings") or config.get(
        "original_max_position_embeddings", config.get("max_position_embeddings")
    )
    if not isinstance(original, int) or not 0 < original < 2**31:
        raise ValueError(f"original_max_position_embeddings {original!r}")
    factor = float(rope.get("factor") or config["max_position_embeddings"] / original)
    if not (math.isfinite(factor) and factor > 0):
        raise ValueError(f"YaRN factor {factor} must be positive")

    def mscale(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    attention = rope.get("attention_factor")
    if attention is None:
        m, m_all = rope.get("mscale"), rope.get("mscale_all_dim")
        if not all(v is None or (isinstance(v, int | float) and math.isfinite(v))
                   for v in (m, m_all)):  # fmt: skip
            raise ValueError(f"YaRN mscale {m!r} and mscale_all_dim {m_all!r}: numbers")
        attention = mscale(factor, m) / mscale(factor, m_all) if m and m_all else mscale(factor)
    return {"rope_type": "yarn", "factor": factor, "original_max_position_embeddings": original,
            "beta_fast": float(rope.get("beta_fast") or 32), "beta_slow":
            float(rope.get("beta_slow") or 1), "truncate": bool(rope.get("truncate", True)),
            "attention_factor": float(attention)}  # fmt: skip


def _latent_attention(config: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """DeepSeek's multi-head latent attention: the config with its cached row as one KV head
    (`kv_lora_rank` + `qk_rope_head_dim`, of which RoPE rotates the last part, put first by
    the model), and the latent's fields. Refuses what the layer does not compute: biased
    projections, RoPE over whole halves of each head (`rope_interleave` false)."""
    sizes: dict[str, int] = {}
    for key in ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim",
                "q_lora_rank"):  # fmt: skip
        value = config.get(key) or 0 if key == "q_lora_rank" else config.get(key)
        if not (isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**31
                and (value or key == "q_lora_rank")):  # fmt: skip
            raise ValueError(f"{key} must be a positive integer below 2**31, not {value!r}")
        sizes[key] = value
    q_lora = sizes["q_lora_rank"]
    if config.get("attention_bias"):
        raise ValueError("DeepSeek attention with biases (attention_bias) is not supported")
    if config.get("rope_interleave", True) is not True:
        raise ValueError("DeepSeek RoPE over halves of each head (rope_interleave false) is "
                         "not supported")  # fmt: skip
    rope, row = sizes["qk_rope_head_dim"], sizes["kv_lora_rank"] + sizes["qk_rope_head_dim"]
    # (a partial factor, where a config gives one, is of the rotated part: GLM-4.7-Flash's 1)
    parameters = dict(config.get("rope_parameters") or {})
    partial = parameters.pop("partial_rotary_factor", config.get("partial_rotary_factor", 1.0))
    if partial != 1.0:
        raise ValueError(f"latent attention rotating {partial!r} of its qk_rope_head_dim "
                         "dimensions is not supported (all of them)")  # fmt: skip
    shaped = {**config, "head_dim": row, "num_key_value_heads": 1,
              "partial_rotary_factor": rope / row, "rope_parameters": parameters}  # fmt: skip
    return shaped, {"kv_lora_rank": sizes["kv_lora_rank"], "q_lora_rank": q_lora,
                    "qk_nope_head_dim": sizes["qk_nope_head_dim"],
                    "v_head_dim": sizes["v_head_dim"]}  # fmt: skip


def latent_scale(query_head: int, rope: dict[str, Any], mscale_all: Any) -> float:
    """The scores' scale of latent attention: the full query head's (`qk_nope_head_dim` +
    `qk_rope_head_dim`) -1/2 power, times YaRN's correction by `mscale_all` squared (`rope`:
    the scaling settings, `yarn_settings`' where YaRN)."""
    scale = query_head**-0.5
    if rope.get("rope_type") == "yarn" and mscale_all:
        if not (isinstance(mscale_all, int | float) and math.isfinite(mscale_all)):
            raise ValueError(f"YaRN mscale_all_dim {mscale_all!r}: a number")
        if rope["factor"] > 1:
            scale *= (0.1 * mscale_all * math.log(rope["factor"]) + 1.0) ** 2
    return float(scale)


def _layer_types(config: dict[str, Any]) -> tuple[int, ...]:
    """The global layers of a model whose `layer_types` name each layer's attention (gpt-oss's
    every other); the rest attend within `sliding_window`."""
    n, types = config["num_hidden_layers"], config.get("layer_types")
    if types is None:
        return ()
    if (
        not isinstance(n, int)
        or len(types) != n
        or not set(types) <= {"full_attention", "sliding_attention"}
    ):
        raise ValueError(f"layer_types must name {n} full_attention / sliding_attention layers")
    return tuple(i for i, t in enumerate(types) if t == "full_attention")


def _dots1_full_layers(config: dict[str, Any], window: int | None) -> tuple[int, ...]:
    """dots.llm1's global layers: as `layer_types` names them, else those before
    `max_window_layers` (all of them without a window), as transformers reads its config."""
    if config.get("layer_types") is not None:
        return _layer_types(config)
    n, first = _layer_count(config), config.get("max_window_layers", DOTS1_MAX_WINDOW_LAYERS)
    if not isinstance(first, int):
        raise ValueError(f"max_window_layers {first!r} must be an integer")
    return tuple(i for i in range(n) if window is None or i < first)


def _layer_count(config: dict[str, Any]) -> int:
    """`num_hidden_layers`, refused unless 1 to MAX_LAYERS (before anything counts them out)."""
    n = config["num_hidden_layers"]
    if not isinstance(n, int) or not 0 < n <= MAX_LAYERS:
        raise ValueError(f"{n!r} layers: not 1 to {MAX_LAYERS}")
    return n


def _ntk_alpha_base(rope: dict[str, Any], config: dict[str, Any]) -> dict[str, Any]:
    """Hunyuan's RoPE settings with their NTK `alpha` (type "dynamic", whose fixed alpha makes the
    frequencies static) turned into the base it stretches to: base * alpha ** (d / (d - 2)),
    d the head's dimensions, as transformers and llama.cpp's converter compute it."""
    if not rope.get("alpha"):
        return rope
    alpha = float(rope["alpha"])
    d = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    base = float(rope.get("rope_theta") or config.get("rope_theta") or 10000.0)
    if not (math.isfinite(alpha) and alpha > 0 and isinstance(d, int) and d > 2):
        raise ValueError(f"RoPE alpha {alpha} over heads of {d}: a positive alpha, heads over 2")
    return {"rope_type": "default", "rope_theta": base * alpha ** (d / (d - 2))}


def _global_layers(config: dict[str, Any], window: int | None) -> tuple[int, ...]:
    """The global layers of a model whose others attend within its window (EXAONE 4's, OLMo
    3's): as `layer_types` names them, or `sliding_window_pattern` spaces them (every n-th, or a
    string such as "LLLG" repeated), every fourth by default; none without a window."""
    if window is None:
        return ()
    if config.get("layer_types") is not None:
        return _layer_types(config)
    n = _layer_count(config)
    pattern = config.get("sliding_window_pattern", EXAONE4_SLIDING_WINDOW_PATTERN)
    if isinstance(pattern, str) and pattern and set(pattern) <= {"L", "G"}:
        return tuple(i for i in range(n) if pattern[i % len(pattern)] == "G")
    if isinstance(pattern, int) and not isinstance(pattern, bool) and pattern > 0:
        return tuple(i for i in range(n) if (i + 1) % pattern == 0)
    raise ValueError(f"sliding_window_pattern {pattern!r}: a positive integer, or a string of "
                     "L and G")  # fmt: skip


def _lfm2_config(config: dict[str, Any], adjust_mlp: bool) -> tuple[dict[str, Any], dict[str, Any]]:
    """LFM2's config under Llama's names, and its convolution fields: the layers `layer_types`
    (or `full_attn_idxs`) does not name as attention, the kernel (`conv_L_cache`); with
    `adjust_mlp` (LFM2's, not LFM2-MoE's) the MLP's width adjusted as transformers does
    (`block_auto_adjust_ff_dim`: two thirds, times the multiplier, rounded up to
    `block_multiple_of`); RoPE's base 1e6 where unset."""
    n = _layer_count(config)
    types = config.get("layer_types")
    if types is None:
        attending = config.get("full_attn_idxs")
        if attending is None:
            attending = list(range(n))
        if not isinstance(attending, list) or not all(isinstance(i, int) for i in attending):
            raise ValueError(f"full_attn_idxs {attending!r}: a list of layer indices")
        types = ["full_attention" if i in attending else "conv" for i in range(n)]
    if not isinstance(types, list) or len(types) != n or not set(types) <= {"full_attention",
                                                                            "conv"}:  # fmt: skip
        raise ValueError(f"layer_types must name {n} full_attention / conv layers")
    if config.get("conv_bias"):
        raise ValueError("LFM2 with biased convolutions (conv_bias) is not supported")
    width = config.get("block_ff_dim", config.get("intermediate_size"))
    if not (isinstance(width, int) and 0 < width < 2**31):
        raise ValueError(f"intermediate_size {width!r}: a positive integer below 2**31")
    if adjust_mlp and config.get("block_auto_adjust_ff_dim", True):
        width = int(2 * width / 3)
        multiplier = config.get("block_ffn_dim_multiplier", 1.0)
        multiple = config.get("block_multiple_of", 256)
        if multiplier is not None:
            if not (isinstance(multiplier, int | float) and math.isfinite(multiplier)
                    and 0 < multiplier < 2**16):  # fmt: skip
                raise ValueError(f"block_ffn_dim_multiplier {multiplier!r}: a positive number")
            if not (isinstance(multiple, int) and 0 < multiple < 2**20):
                raise ValueError(f"block_multiple_of {multiple!r}: a positive integer")
            width = multiple * -(-int(multiplier * width) // multiple)
    tied = config.get("tie_embedding", config.get("tie_word_embeddings", True))
    renamed = {**config, "intermediate_size": width, "tie_word_embeddings": tied,
               "rms_norm_eps": config.get("norm_eps", 1e-5)}  # fmt: skip
    if not renamed.get("rope_parameters") and renamed.get("rope_theta") is None:
        renamed["rope_theta"] = 1e6
    fields = {"conv_layers": tuple(i for i, t in enumerate(types) if t == "conv"),
              "conv_kernel": config.get("conv_L_cache", 3)}  # fmt: skip
    return renamed, fields


def _gated_delta_config(config: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Qwen3.5's config and its DeltaNet fields: the layers `layer_types` names
    `linear_attention` (by default all but every `full_attention_interval`-th, as transformers
    fills them in), their heads and convolution; refused where it asks for what its layers do
    not compute (another activation, biased attention)."""
    n = _layer_count(config)
    types = config.get("layer_types")
    if types is None:
        interval = config.get("full_attention_interval", 4)
        if not (isinstance(interval, int) and 0 < interval <= n):
            raise ValueError(f"full_attention_interval {interval!r}: a positive layer count")
        types = ["linear_attention" if (i + 1) % interval else "full_attention"
                 for i in range(n)]  # fmt: skip
    kinds = {"full_attention", "linear_attention"}
    if not isinstance(types, list) or len(types) != n or not set(types) <= kinds:
        raise ValueError(f"layer_types must name {n} full_attention / linear_attention layers")
    if config.get("hidden_act", "silu") != "silu":
        raise ValueError(f"Qwen3.5 with hidden_act {config['hidden_act']!r} is not supported")
    if config.get("attention_bias"):
        raise ValueError("Qwen3.5 with biased attention (attention_bias) is not supported")
    if config.get("intermediate_size") is None and "moe_intermediate_size" in config:
        # (Qwen3.5-MoE's every MLP is experts: a dense one's width is never used)
        config = {**config, "intermediate_size": config["moe_intermediate_size"]}
    fields = {
        "conv_layers": tuple(i for i, t in enumerate(types) if t == "linear_attention"),
        "conv_kernel": config.get("linear_conv_kernel_dim", 4),
        "delta_value_heads": config.get("linear_num_value_heads", 32),
        "delta_key_heads": config.get("linear_num_key_heads", 16),
        "delta_key_dim": config.get("linear_key_head_dim", 128),
        "delta_value_dim": config.get("linear_value_head_dim", 128),
        "attention_output_gate": True,
    }
    return config, fields


def _nope_layers(config: dict[str, Any]) -> tuple[int, ...]:
    """SmolLM3's layers without RoPE: where `no_rope_layers` (1 a layer with RoPE, 0 one
    without) says 0, or every `no_rope_layer_interval`-th layer where it is absent."""
    n = _layer_count(config)
    flags = config.get("no_rope_layers")
    if flags is None:
        interval = config.get("no_rope_layer_interval", SMOLLM3_NO_ROPE_INTERVAL)
        if not isinstance(interval, int) or interval <= 0:
            raise ValueError(f"no_rope_layer_interval {interval!r} must be a positive integer")
        return tuple(i for i in range(n) if (i + 1) % interval == 0)
    if not isinstance(flags, list) or len(flags) != n or not all(f in (0, 1) for f in flags):
        raise ValueError(f"no_rope_layers must be {n} flags of 0 or 1")
    return tuple(i for i, rotary in enumerate(flags) if not rotary)


def _gemma_layers(
    config: dict[str, Any], local_params: dict[str, Any] | None, arch: str
) -> tuple[tuple[int, ...], float | None]:
    """Gemma 3's global layers (`layer_types`, or every `sliding_window_pattern`-th) and the RoPE
    base of its windowed ones; refuses what its layers do not compute (soft-capping, other
    activations)."""
    activation = config.get("hidden_activation") or "gelu_pytorch_tanh"
    if activation != "gelu_pytorch_tanh":
        raise ValueError(f"unsupported hidden_activation {activation!r}")
    n = config["num_hidden_layers"]
    types = config.get("layer_types")
    if types is None:
        gemma2 = arch == "gemma2"
        default = GEMMA2_SLIDING_WINDOW_PATTERN if gemma2 else GEMMA3_SLIDING_WINDOW_PATTERN
        pattern = config.get("sliding_window_pattern", default)
        if not isinstance(pattern, int) or not 0 < pattern <= MAX_LAYERS or n > MAX_LAYERS:
            raise ValueError(f"sliding_window_pattern {pattern!r} over {n!r} layers")
        types = ["full_attention" if (i + 1) % pattern == 0 else "sliding_attention"
                 for i in range(n)]  # fmt: skip
    if len(types) != n or not set(types) <= {"full_attention", "sliding_attention"}:
        raise ValueError(f"layer_types must name {n} full_attention / sliding_attention layers")
    full = tuple(i for i, t in enumerate(types) if t == "full_attention")
    if arch == "gemma2":  # one RoPE for every layer
        return full, None
    return full, _local_rope_theta(local_params, config.get("rope_local_base_freq", 10000.0))


def _local_rope_theta(local_params: dict[str, Any] | None, default: float) -> float:
    """The RoPE base of the sliding-window layers (their `rope_parameters`, transformers 5's
    spelling), which rotate unscaled (Gemma 3's, OLMo 3's)."""
    local = dict(local_params or {})
    if local.get("rope_type", "default") != "default":
        raise ValueError("RoPE scaling of the sliding-window layers is not supported")
    return float(local.get("rope_theta") or default)


# image-and-text architectures whose language model is served (their images are not read):
# each text model type's config class (in transformers) and text-only architecture
_IMAGE_AND_TEXT = {
    "Gemma3ForConditionalGeneration": {"gemma3_text": ("Gemma3TextConfig", "Gemma3ForCausalLM")},
    # Qwen2-VL's, Qwen2.5-VL's and Qwen3-VL's (dense and MoE): with text alone, each position is
    # the same in
    # all three sections of their multimodal RoPE, which is then the plain one
    "Qwen2VLForConditionalGeneration": {"qwen2_vl_text": ("Qwen2VLTextConfig", "Qwen2ForCausalLM")},
    "Qwen2_5_VLForConditionalGeneration": {
        "qwen2_5_vl_text": ("Qwen2_5_VLTextConfig", "Qwen2ForCausalLM")
    },
    "Qwen3VLForConditionalGeneration": {"qwen3_vl_text": ("Qwen3VLTextConfig", "Qwen3ForCausalLM")},
    "Qwen3VLMoeForConditionalGeneration": {
        "qwen3_vl_moe_text": ("Qwen3VLMoeTextConfig", "Qwen3MoeForCausalLM")
    },
    "Qwen3_5ForConditionalGeneration": {
        "qwen3_5_text": ("Qwen3_5TextConfig", "Qwen3_5ForCausalLM")
    },
    "Qwen3_5MoeForConditionalGeneration": {
        "qwen3_5_moe_text": ("Qwen3_5MoeTextConfig", "Qwen3_5MoeForCausalLM")
    },
    "Mistral3ForConditionalGeneration": {  # Ministral 3's and Mistral Small 3.1's
        "ministral3": ("Ministral3Config", "Ministral3ForCausalLM"),
        "mistral": ("MistralConfig", "MistralForCausalLM"),
    },
}


def _text_config(config: dict[str, Any], outer: str) -> dict[str, Any]:
    """An image-and-text folder's language model: its `text_config`, filled in with
    transformers' defaults (published configs name only what differs from them), and the
    token ids and tying, which the outer config holds."""
    import transformers
    from huggingface_hub.errors import StrictDataclassError

    kinds = _IMAGE_AND_TEXT[outer]
    given = config.get("text_config")
    if given is None:  # (Qwen2-VL's and Qwen2.5-VL's published configs hold it at the top)
        given = {k: v for k, v in config.items() if k not in ("vision_config", "model_type")}
    if not isinstance(given, dict):
        raise ValueError(f"{outer}'s text_config must be an object, not {given!r:.100}")
    given = {k: v for k, v in given.items() if k != "architectures"}
    kind = given.get("model_type", next(iter(kinds)))
    if kind not in kinds:
        raise ValueError(f"{outer} with a {kind!r} language model is not supported; "
                         f"supported: {', '.join(kinds)}")  # fmt: skip
    config_class, architecture = kinds[kind]
    try:
        text = getattr(transformers, config_class)(**given).to_dict()
    except StrictDataclassError as e:  # (a value transformers' config refuses)
        raise ValueError(f"{outer}'s language model config: {e}") from None
    for key in ("bos_token_id", "eos_token_id", "tie_word_embeddings"):
        if config.get(key) is not None:
            text[key] = config[key]
    if kind == "qwen3_vl_moe_text":  # (its router always renormalizes the chosen)
        text["norm_topk_prob"] = True
    return {**text, "architectures": [architecture]}


def _exaone_config(config: dict[str, Any]) -> dict[str, Any]:
    """EXAONE 3's config under Llama's names (`num_layers`, `layer_norm_epsilon`); refused
    unless its activation is SiLU, the only one its layer computes."""
    activation = config.get("activation_function", config.get("hidden_act", "silu"))
    if activation != "silu":
        raise ValueError(f"EXAONE with activation_function {activation!r} is not supported")
    aliases = {"num_hidden_layers": "num_layers", "rms_norm_eps": "layer_norm_epsilon"}
    return {**config, **{ours: config[theirs] for ours, theirs in aliases.items()
                         if ours not in config and theirs in config}}  # fmt: skip


def _one_value(value: Any, name: str) -> Any:
    """A per-layer setting that a config may give as a list of one value a layer (Hunyuan's):
    that value; refused where the layers differ."""
    if not isinstance(value, list):
        return value
    if not value or any(v != value[0] for v in value):
        raise ValueError(f"{name} {value!r}: one value for every layer is supported")
    return value[0]


def _qkv_bias(config: dict[str, Any], arch: str) -> bool:
    """Whether q, k and v have biases: always Qwen2's; Qwen2-MoE's and Seed-OSS's unless the
    config says otherwise; the others' where `attention_bias` says so."""
    if arch == "qwen2":
        return True
    if arch == "qwen2_moe":
        return bool(config.get("qkv_bias", True))
    return bool(config.get("attention_bias", arch == "seed_oss"))


def _experts(config: dict[str, Any], arch: str) -> dict[str, Any]:
    """The expert fields: Mixtral's every layer routes through experts of `intermediate_size`,
    renormalizing the chosen; Qwen3-MoE's and Qwen2-MoE's every `decoder_sparse_step`-th layer
    but those in `mlp_only_layers`, experts of `moe_intermediate_size` (Qwen2-MoE's with a
    gated shared expert); GLM-4.5's every layer after the `first_k_dense_replace` first, a
    sigmoid router with a score bias, and `n_shared_experts` experts' width of shared expert."""
    if arch == "minimax_m2" and (
        config.get("scoring_func", "sigmoid") != "sigmoid"
        or not config.get("use_routing_bias", True)
        or not config.get("use_qk_norm", True)
        or config.get("qk_norm_type", "per_layer") != "per_layer"
    ):
        raise ValueError("MiniMax-M2 is supported with its published router (sigmoid, with a "
                         "routing bias) and q/k norms (per layer)")  # fmt: skip
    if arch == "hunyuan_moe":  # (lists of one value a layer in published configs; transformers
        # reads ints, and experts and shared expert as wide as `intermediate_size`)
        experts, k = config.get("num_experts"), config.get("moe_topk")
        config = {**config, "num_experts": _one_value(experts, "num_experts"),
                  "num_experts_per_tok": _one_value(k, "moe_topk")}  # fmt: skip
    if arch == "olmoe":  # experts as wide as `intermediate_size` in every layer
        config = {**config, "moe_intermediate_size": config["intermediate_size"],
                  "decoder_sparse_step": 1, "mlp_only_layers": []}  # fmt: skip
    if arch in ("mixtral", "gpt_oss", "minimax_m2", "hunyuan_moe", "granitemoe"):  # (gpt-oss's
        # and Granite's softmax over the chosen renormalizes; MiniMax-M2's sigmoid scores and
        # Hunyuan's are renormalized)
        config = {**config, "moe_intermediate_size": config["intermediate_size"],
                  "norm_topk_prob": True, "decoder_sparse_step": 1,
                  "mlp_only_layers": []}  # fmt: skip
    n, step = config["num_hidden_layers"], config.get("decoder_sparse_step", 1)
    if not isinstance(n, int) or n > MAX_LAYERS:
        raise ValueError(f"{n!r} layers: more than {MAX_LAYERS}")
    dense_only = set(config.get("mlp_only_layers") or ())
    # published configs say num_experts; transformers 5 writes num_local_experts; GLM-4.5's
    # n_routed_experts, ERNIE 4.5's moe_num_experts
    num_experts = (config.get("num_experts") or config.get("n_routed_experts")
                   or config.get("moe_num_experts") or config["num_local_experts"])  # fmt: skip
    k = config.get("num_experts_per_tok") or config["moe_k"]
    if not isinstance(num_experts, int) or not isinstance(k, int):
        raise ValueError(f"{num_experts!r} experts, {k!r} a token: integers")
    if not 0 < k <= num_experts:
        raise ValueError(f"num_experts_per_tok {k} must be in 1..num_experts ({num_experts})")
    fields: dict[str, Any] = {
        "num_experts": num_experts,
        "experts_per_token": k,
        "expert_intermediate_size": config["moe_intermediate_size"],
        "norm_topk_prob": bool(config.get("norm_topk_prob", False)),
        "dense_layers": tuple(i for i in range(n)
                              if i in dense_only or step <= 0 or (i + 1) % step),
    }  # fmt: skip
    if arch in ("qwen2_moe", "qwen3_5_moe", "qwen3_next"):
        fields["shared_expert_intermediate_size"] = config["shared_expert_intermediate_size"]
        fields["shared_expert_gate"] = True
    if arch == "qwen3_5_moe":  # (its router always renormalizes the chosen)
        fields["norm_topk_prob"] = True
    if arch == "minimax_m2":
        fields.update(router_scoring="sigmoid", router_score_bias=True)
    if arch == "hunyuan_moe":
        fields.update(shared_expert_intermediate_size=config["intermediate_size"])
    if arch == "granitemoe":  # (GraniteMoeShared's shared MLP)
        fields.update(shared_expert_intermediate_size=config.get("shared_intermediate_size") or 0)
    if arch == "ernie4_5_moe":  # every `moe_layer_interval`-th layer from the start to the end
        # index, a float32 softmax router whose score bias chooses, and shared experts
        start, end = config.get("moe_layer_start_index", 1), config.get("moe_layer_end_index", -1)
        interval, shared = (
            config.get("moe_layer_interval", 1),
            config.get("moe_num_shared_experts", 0),
        )
        if not all(isinstance(v, int) for v in (start, end, interval, shared)) or interval <= 0:
            raise ValueError(f"ERNIE 4.5 experts from layer {start!r} to {end!r} every "
                             f"{interval!r}, {shared!r} shared: integers, a positive "
                             "interval")  # fmt: skip
        end = n - 1 if end == -1 else end
        fields.update(
            norm_topk_prob=True,
            dense_layers=tuple(i for i in range(n)
                               if not ((i + 1) % interval == 0 and start <= i <= end)),
            router_score_bias=True,
            shared_expert_intermediate_size=config["moe_intermediate_size"] * max(shared, 0),
        )  # fmt: skip
    if arch in ("glm4_moe", "dots1"):  # (dots.llm1's experts are GLM-4.5's, its q/k norms
        # always there)
        glm = arch == "glm4_moe"  # (transformers' defaults differ between the two)
        first_dense = config.get("first_k_dense_replace", int(glm))
        extra = config.get("num_nextn_predict_layers", 0)
        if not isinstance(first_dense, int) or not isinstance(extra, int):
            raise ValueError(f"first_k_dense_replace {first_dense!r}, num_nextn_predict_layers "
                             f"{extra!r}: integers")  # fmt: skip
        scale = config.get("routed_scaling_factor", 1.0)
        fields.update(
            norm_topk_prob=bool(config.get("norm_topk_prob", glm)),
            dense_layers=tuple(range(min(max(first_dense, 0), n))),
            router_scoring="sigmoid",
            router_score_bias=True,
            expert_groups=config.get("n_group", 1),
            expert_groups_used=config.get("topk_group", 1),
            routed_scaling_factor=float(scale) if isinstance(scale, (int, float)) else scale,
            shared_expert_intermediate_size=(config["moe_intermediate_size"]
                                             * config.get("n_shared_experts", 1)),
            qk_norm=arch == "dots1" or bool(config.get("use_qk_norm", False)),
            extra_checkpoint_layers=extra,
        )  # fmt: skip
    if arch in LATENT_ATTENTION_ARCHS:
        fields.update(_deepseek_routing(config, arch))
    if arch == "lfm2_moe":  # experts after its `num_dense_layers` first, chosen by sigmoid
        # scores plus a learned bias, renormalized (plus 1e-6), scaled
        first_dense, scale = (
            config.get("num_dense_layers", 2),
            config.get("routed_scaling_factor", 1.0),
        )
        if not config.get("use_expert_bias", True):
            raise ValueError("LFM2-MoE without its expert bias (use_expert_bias) is not supported")
        if not isinstance(first_dense, int):
            raise ValueError(f"num_dense_layers {first_dense!r}: an integer")
        fields.update(
            dense_layers=tuple(range(min(max(first_dense, 0), n))),
            norm_topk_prob=bool(config.get("norm_topk_prob", True)),
            router_scoring="sigmoid",
            router_score_bias=True,
            routed_scaling_factor=float(scale) if isinstance(scale, (int, float)) else scale,
            router_norm_epsilon=1e-6,
        )  # fmt: skip
    return fields


def _deepseek_routing(config: dict[str, Any], arch: str) -> dict[str, Any]:
    """DeepSeek's experts, as transformers computes them: every layer after the
    `first_k_dense_replace` first, shared experts of `n_shared_experts` experts' width, and a
    float32 router whose weights are scaled by `routed_scaling_factor`. DeepSeek-V2's softmax
    (`topk_method` greedy, or group_limited_greedy: within the best groups by their best
    score) never renormalizes; DeepSeek-V3's sigmoid plus a score bias (noaux_tc) within the
    best groups by their two best, renormalized where `norm_topk_prob` says. GLM-4.7-Flash's
    (`glm4_moe_lite`) are V3's, its dense layers those `mlp_layer_types` names."""
    v3, lite = arch in ("deepseek_v3", "glm4_moe_lite"), arch == "glm4_moe_lite"
    n = config["num_hidden_layers"]
    first_dense = config.get("first_k_dense_replace", 1 if lite else 3 if v3 else 0)
    shared = config.get("n_shared_experts") or 0
    extra = config.get("num_nextn_predict_layers", config.get("num_mtp_layers", 0)) or 0
    scale = config.get("routed_scaling_factor", 1.8 if lite else 2.5 if v3 else 1.0)
    method = config.get("topk_method", "noaux_tc" if v3 else "greedy")
    scoring = config.get("scoring_func", "sigmoid" if v3 else "softmax")
    width = config.get("moe_intermediate_size")
    numbers = (first_dense, shared, extra, width)
    if not (isinstance(width, int)
            and all(isinstance(v, int) and not isinstance(v, bool) for v in numbers)):  # fmt: skip
        raise ValueError(f"first_k_dense_replace {first_dense!r}, n_shared_experts {shared!r}, "
                         f"num_nextn_predict_layers {extra!r}, moe_intermediate_size "
                         f"{width!r}: integers")  # fmt: skip
    if config.get("moe_layer_freq", 1) != 1:
        raise ValueError(f"experts every {config['moe_layer_freq']!r} layers (moe_layer_freq) "
                         "are not supported: every layer after the dense ones")  # fmt: skip
    routers = {"deepseek_v2": {("greedy", "softmax"), ("group_limited_greedy", "softmax")},
               "deepseek_v3": {("noaux_tc", "sigmoid")},
               "glm4_moe_lite": {("noaux_tc", "sigmoid")}}  # fmt: skip
    if (
        not isinstance(method, str)
        or not isinstance(scoring, str)
        or ((method, scoring) not in routers[arch])
    ):
        raise ValueError(f"{arch} routing {method!r} over {scoring!r} scores is not supported "
                         f"(supported: {sorted(routers[arch])})")  # fmt: skip
    grouped = method != "greedy"
    dense = tuple(range(min(max(first_dense, 0), n)))
    if lite and config.get("mlp_layer_types") is not None:
        types = config["mlp_layer_types"]
        if not isinstance(types, list) or len(types) != n or not set(types) <= {"dense", "sparse"}:
            raise ValueError(f"mlp_layer_types must name {n} dense / sparse layers")
        dense = tuple(i for i, kind in enumerate(types) if kind == "dense")
    return dict(
        norm_topk_prob=v3 and bool(config.get("norm_topk_prob", True)),
        dense_layers=dense,
        router_scoring=scoring,
        router_score_bias=v3,
        float32_router=not v3,
        expert_groups=config.get("n_group", 8 if v3 and not lite else 1) if grouped else 1,
        expert_groups_used=config.get("topk_group", 4 if v3 and not lite else 1) if grouped else 1,
        expert_group_by_max=not v3,
        routed_scaling_factor=float(scale) if isinstance(scale, int | float) else scale,
        shared_expert_intermediate_size=width * max(shared, 0),
        extra_checkpoint_layers=extra,
    )
