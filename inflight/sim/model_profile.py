"""Model profiles: the byte and FLOP counts the cost model needs, from any Llama-family HF
config.json (or a GGUF file's metadata), a weight / KV dtype and a tensor-parallel size.

Linear layers hold (almost) all parameters; their weights are read once per step and cost
2 FLOPs per parameter per token. The embedding is a lookup (read only for the step's tokens);
the LM head runs only for tokens that sample. Quantized checkpoints (fp8, int4) keep the
embedding and LM head in 16 bits, as common recipes do.

Each layer is counted as the engine builds it: attention (its query rows doubled where they
carry an output gate; DeepSeek's latent attention by its low-rank projections), or an LFM2
short convolution's in and out projections, or a Qwen3.5 DeltaNet layer's q/k/v/z, b/a and out
projections; then a gated MLP (Arcee's ungated up and down), or in a sparse layer a router, its
experts and a shared expert. Memory holds every expert; a token multiplies its
`experts_per_token` of them, and a step reads the experts its tokens chose: for tokens routed
independently and evenly, E (1 - (1 - k / E)^tokens) of a layer's E.

Tensor parallelism over `tensor_parallel` devices (Megatron's split, as vLLM does it): q/k/v,
gate and up by output columns, o and down by input rows, embedding and LM head by vocabulary, so
each rank holds and reads 1/TP of the weights and does 1/TP of the FLOPs. Each rank caches its
own KV heads; where TP exceeds the KV heads, each KV head is replicated on TP / kv_heads ranks.
The per-rank counts below are what one device sees: `kv_bytes_per_token` sizes its pool.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from inflight.model.arch import LlamaArchConfig

# Bytes per weight; int4 carries one fp16 scale per group of 128 weights.
WEIGHT_BYTES = {"fp32": 4.0, "bf16": 2.0, "fp16": 2.0, "fp8": 1.0, "int4": 0.5 + 2 / 128}
# The matmul dtype each weight dtype runs in (int4 is dequantized to bf16: W4A16).
COMPUTE_DTYPE = {"fp32": "fp32", "bf16": "bf16", "fp16": "bf16", "fp8": "fp8", "int4": "bf16"}
KV_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1}
# Bytes of one activation in an all-reduce, by the matmul dtype (fp8 matmuls output bf16)
ACTIVATION_BYTES = {"fp32": 4, "bf16": 2, "fp8": 2}


@dataclass(frozen=True)
class ModelProfile:
    name: str
    arch: LlamaArchConfig
    weight_dtype: str = "bf16"
    kv_dtype: str = "bf16"
    tensor_parallel: int = 1

    def __post_init__(self) -> None:
        if self.weight_dtype not in WEIGHT_BYTES:
            raise ValueError(f"weight dtype must be one of {', '.join(WEIGHT_BYTES)}")
        if self.kv_dtype not in KV_BYTES:
            raise ValueError(f"KV dtype must be one of {', '.join(KV_BYTES)}")
        # (imported here: the module imports torch, which every `inflight` command's parser,
        # `--help` and `doctor` included, would otherwise import through this one: ~2.3 s)
        from inflight.parallel.shard import check_tensor_parallel

        check_tensor_parallel(self.arch, self.tensor_parallel)

    def _mixer_params(self, layer: int) -> int:
        """Layer `layer`'s attention (or what takes its place) projections."""
        a, h = self.arch, self.arch.hidden_size
        if layer in a.conv_layers and a.delta_value_heads:  # Qwen3.5's DeltaNet
            values = a.delta_value_heads * a.delta_value_dim
            return h * (a.conv_width + values) + h * 2 * a.delta_value_heads + values * h
        if layer in a.conv_layers:  # LFM2's short convolution: B, C, x in; out
            return 4 * h * a.conv_width
        if a.kv_lora_rank:  # latent attention: q (through its own latent), kv latent, o
            query = a.num_heads * (a.qk_nope_head_dim + a.rotary_dim)
            q = h * a.q_lora_rank + a.q_lora_rank * query if a.q_lora_rank else h * query
            kv = (h * (a.kv_lora_rank + a.rotary_dim)
                  + a.kv_lora_rank * a.num_heads * (a.qk_nope_head_dim + a.v_head_dim))  # fmt: skip
            return q + kv + a.num_heads * a.v_head_dim * h
        q = a.num_heads * a.head_dim
        q_rows = 2 * q if a.attention_output_gate else q
        return h * (q_rows + 2 * a.num_kv_heads * a.head_dim) + q * h

    def _mlp_params(self, layer: int) -> tuple[int, int]:
        """Layer `layer`'s MLP: (parameters every token multiplies, one routed expert's); the
        latter 0 in a dense layer."""
        a, h = self.arch, self.arch.hidden_size
        gated = 2 if a.architecture == "arcee" else 3  # (Arcee's up and down alone)
        if not a.num_experts or layer in a.dense_layers:
            return gated * h * a.intermediate_size, 0
        shared = 3 * h * a.shared_expert_intermediate_size + (h if a.shared_expert_gate else 0)
        return a.num_experts * h + shared, 3 * h * a.expert_intermediate_size

    def _linears(self, experts: int) -> int:
        """Every layer's linear weights, with `experts` of each sparse layer's experts."""
        total = 0
        for i in range(self.arch.num_layers):
            every_token, expert = self._mlp_params(i)
            total += self._mixer_params(i) + every_token + experts * expert
        return total

    @property
    def linear_params(self) -> int:
        """Every layer's linear weights, every expert's among them: what memory holds."""
        return self._linears(self.arch.num_experts)

    @property
    def active_linear_params(self) -> int:
        """The linear weights one token multiplies: its `experts_per_token` in a sparse layer."""
        return self._linears(self.arch.experts_per_token)

    def experts_read(self, num_tokens: int) -> float:
        """How many of a sparse layer's experts a step of `num_tokens` tokens reads: those
        chosen at least once, tokens routed independently and evenly."""
        e, k = self.arch.num_experts, self.arch.experts_per_token
        return e * (1 - (1 - k / e) ** num_tokens) if e and num_tokens else 0.0

    def step_weight_bytes(self, num_tokens: int) -> float:
        """Weights a step of `num_tokens` tokens reads: every linear but the experts its tokens
        did not choose, and the LM head."""
        if not num_tokens:
            return 0.0
        unread = self.arch.num_experts - self.experts_read(num_tokens)
        expert_params = sum(self._mlp_params(i)[1] for i in range(self.arch.num_layers))
        params = self.linear_params - unread * expert_params
        return params * WEIGHT_BYTES[self.weight_dtype] + self.head_bytes

    @property
    def head_params(self) -> int:
        """The LM head (the embedding matrix again when tied)."""
        return self.arch.vocab_size * self.arch.hidden_size

    @property
    def num_params(self) -> int:
        embed = self.head_params
        return self.linear_params + embed + (0 if self.arch.tie_word_embeddings else embed)

    @property
    def compute_dtype(self) -> str:
        return COMPUTE_DTYPE[self.weight_dtype]

    @property
    def head_bytes(self) -> float:
        quantized = self.weight_dtype in ("fp8", "int4")
        return self.head_params * (2.0 if quantized else WEIGHT_BYTES[self.weight_dtype])

    @property
    def weight_bytes_total(self) -> float:
        """Memory the weights occupy (every expert; the embedding too, when not tied to the
        head)."""
        untied = 0 if self.arch.tie_word_embeddings else self.head_bytes
        return self.linear_params * WEIGHT_BYTES[self.weight_dtype] + self.head_bytes + untied

    @property
    def rank_weight_bytes(self) -> float:
        """Memory one rank's share of the weights occupies."""
        return self.weight_bytes_total / self.tensor_parallel

    @property
    def kv_heads_per_rank(self) -> int:
        return max(1, self.arch.num_kv_heads // self.tensor_parallel)

    @property
    def kv_bytes_per_token(self) -> int:
        """One token's K and V in every layer that attends, on one rank (its own KV heads); the
        keys alone where they are the values (latent attention)."""
        a = self.arch
        rows = 1 if a.values_are_keys else 2
        return (
            rows * len(a.kv_layers) * self.kv_heads_per_rank * a.head_dim * KV_BYTES[self.kv_dtype]
        )

    @property
    def activation_bytes_per_value(self) -> int:
        return ACTIVATION_BYTES[self.compute_dtype]

    @property
    def sequence_state_bytes(self) -> int:
        """One sequence's state in the layers that carry it in place of KV (LFM2's
        convolutions, Qwen3.5's DeltaNet matrices), on one rank (its share of the channels and
        heads); 0 for a model that attends in every layer."""
        return (
            self.arch.sequence_state_bytes(self.activation_bytes_per_value) // self.tensor_parallel
        )

    @property
    def attention_flops_per_pair(self) -> int:
        """FLOPs for one (query token, key token) pair over all layers that attend: QK^T and
        PV."""
        a = self.arch
        return 4 * len(a.kv_layers) * a.num_heads * a.head_dim

    def activation_bytes(self, max_num_batched_tokens: int, max_num_seqs: int) -> int:
        """Peak activation memory of one step on one rank (rough): its share of the MLP's
        widest intermediate and a few hidden-sized buffers per token in 16 bits, plus fp32
        logits for every sequence (gathered whole on every rank)."""
        a = self.arch
        per_token = (2 * a.intermediate_size // self.tensor_parallel + 4 * a.hidden_size) * 2
        return max_num_batched_tokens * per_token + max_num_seqs * a.vocab_size * 4


PRESETS = ("llama-3.3-70b", "llama-3.1-8b", "qwen2.5-7b", "smollm2-135m", "gemma-3-270m")


def load_model_profile(
    spec: str | None, weight_dtype: str = "bf16", kv_dtype: str = "bf16", tensor_parallel: int = 1
) -> ModelProfile:
    """`spec`: a preset name (config.json files shipped in `inflight/sim/models`), an HF config
    .json file, a model folder, a GGUF file, or None for the engine's default model."""
    from inflight.model.gguf_loader import read_gguf_index
    from inflight.model.loader import is_gguf, load_hf_arch_config, resolve_model_path

    if spec in PRESETS:
        text = resources.files("inflight.sim").joinpath(f"models/{spec}.json").read_text()
        arch = LlamaArchConfig.from_hf_config(json.loads(text))
        return ModelProfile(spec, arch, weight_dtype, kv_dtype, tensor_parallel)
    if spec is not None and spec.endswith(".json"):
        path = Path(spec)
        arch = LlamaArchConfig.from_hf_config(json.loads(path.read_text()))
        return ModelProfile(path.parent.name or path.stem, arch, weight_dtype, kv_dtype,
                            tensor_parallel)  # fmt: skip
    path = resolve_model_path(spec)
    arch = read_gguf_index(path).arch if is_gguf(path) else load_hf_arch_config(path)
    return ModelProfile(path.stem, arch, weight_dtype, kv_dtype, tensor_parallel)
