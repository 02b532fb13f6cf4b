"""Model profiles: the byte and FLOP counts the cost model needs, from any Llama-family HF
config.json (or a GGUF file's metadata), a weight / KV dtype and a tensor-parallel size.

Linear layers hold (almost) all parameters; their weights are read once per step and cost
2 FLOPs per parameter per token. The embedding is a lookup (read only for the step's tokens);
the LM head runs only for tokens that sample. Quantized checkpoints (fp8, int4) keep the
embedding and LM head in 16 bits, as common recipes do.

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

    @property
    def linear_params_per_layer(self) -> int:
        """An attention layer's: q/k/v, o and its MLP."""
        a = self.arch
        q = a.num_heads * a.head_dim
        kv = a.num_kv_heads * a.head_dim
        return (
            a.hidden_size * (q + 2 * kv)
            + q * a.hidden_size
            + 3 * a.hidden_size * (a.intermediate_size)
        )

    @property
    def linear_params(self) -> int:
        """Every layer's; a short-convolution layer (LFM2's) has in (3H) and out (H)
        projections where an attention layer has q/k/v and o."""
        a = self.arch
        q = a.num_heads * a.head_dim
        attention = a.hidden_size * (q + 2 * a.num_kv_heads * a.head_dim) + q * a.hidden_size
        convolution = 4 * a.hidden_size * a.hidden_size
        swapped = len(a.conv_layers) * (convolution - attention)
        return a.num_layers * self.linear_params_per_layer + swapped

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
    def weight_bytes_per_step(self) -> float:
        """Weights every step reads: all linear layers and the LM head."""
        return self.linear_params * WEIGHT_BYTES[self.weight_dtype] + self.head_bytes

    @property
    def weight_bytes_total(self) -> float:
        """Memory the weights occupy (the embedding too, when not tied to the head)."""
        untied = 0 if self.arch.tie_word_embeddings else self.head_bytes
        return self.weight_bytes_per_step + untied

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
