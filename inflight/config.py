"""Engine knobs as frozen dataclasses, validated once at construction.

Every knob has a documented default here; `LLM(**knobs)` and the CLI flags are generated from
these fields (`KNOBS`), so the three can never disagree. Values that depend on the loaded model
(`max_model_len`, the number of KV blocks) are resolved by the engine after loading.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import os
import typing
from dataclasses import dataclass, field
from typing import Any, Literal

from inflight.chat_template import chat_template_text
from inflight.errors import ConfigError
from inflight.request import SLOTarget
from inflight.sampling_params import MAX_SEED, MIN_SEED

GiB = 1024**3

# (half and float: vLLM's names for float16 and float32, which its users pass; the config holds
# the names they stand for: `DTYPE_ALIASES`)
Dtype = Literal["auto", "bfloat16", "float16", "float32", "half", "float"]
DTYPE_ALIASES = {"half": "float16", "float": "float32"}
Batching = Literal["continuous", "static"]
Policy = Literal["fcfs", "priority", "sjf", "fair", "edf"]
SLOAdmission = Literal["refuse", "queue"]
PreemptionMode = Literal["recompute", "swap"]
KVAdmission = Literal["on-demand", "reserve"]
AttentionBackend = Literal["auto", "torch", "cpu", "triton"]
QuantizedActivations = Literal["auto", "off", "int16", "int8"]
KVCacheDtype = Literal["auto", "bf16", "fp8", "int8"]
DistributedBackend = Literal["mp", "ray"]
GenerationConfig = Literal["auto", "none"]
# bits of each kind of quantized activations (off: float, the exact path). auto's kind depends
# on the model (loader.model_activations); its 16 serves where only whether x is quantized
# matters: 8 and 16 bits keep the same formats as blocks.
ACTIVATION_BITS = {"auto": 16, "off": 0, "int16": 16, "int8": 8}
MAX_TENSOR_PARALLEL = 1024  # ranks: beyond any machine's; 2**63 must not spawn processes
MAX_CPUS_PER_RANK = 1 << 16  # a Ray rank's CPUs: beyond any node's


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise ConfigError(message)


def is_tenant_weight(value: object) -> bool:
    """A tenant's weight, its share: a positive finite number (not a bool)."""
    return (isinstance(value, int | float) and not isinstance(value, bool)
            and math.isfinite(value) and value > 0)  # fmt: skip


def _take_path(config: Any, name: str) -> None:
    """A path knob's value as text (a `pathlib.Path` too); anything else is refused by name."""
    value = getattr(config, name)
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
        object.__setattr__(config, name, value)
    _require(
        value is None or isinstance(value, str),
        f"{name} must be a path (a model folder or GGUF file), got {value!r}",
    )


def _check_kinds(config: Any) -> None:
    """Each int, bool or float knob holds a value of its kind before any range is checked; else
    torch's shapes fail on a float after the weights load, and a flag takes "no" for true. An
    integer knob takes an integral float too (2e9 bytes, as Python writes it), as an int."""
    hints = typing.get_type_hints(type(config))
    for f in dataclasses.fields(config):
        value, hint = getattr(config, f.name), hints[f.name]
        kinds = [a for a in typing.get_args(hint) if a is not type(None)] or [hint]
        if value is None or len(kinds) != 1 or kinds[0] not in (int, bool, float):
            continue  # (None where the hint allows it; texts and choices: checked by name)
        kind, number = kinds[0], not isinstance(value, bool)
        if kind is bool:
            _require(not number, f"{f.name} must be true or false, got {value!r}")
        elif kind is int:
            integral = number and isinstance(value, numbers.Real) and math.isfinite(value)
            integral = integral and float(value).is_integer()
            _require(integral, f"{f.name} must be an integer, got {value!r}")
            object.__setattr__(config, f.name, int(value))
        else:
            real = number and isinstance(value, numbers.Real) and not math.isnan(value)
            _require(real, f"{f.name} must be a number, got {value!r}")


@dataclass(frozen=True)
class ModelConfig:
    model: str | None = field(
        default=None,
        metadata={"help": "HF model folder, GGUF file, or None for SmolLM2-135M-Instruct"},
    )
    dtype: Dtype = field(
        default="auto",
        metadata={"help": "weights/activations dtype; auto = bfloat16 where supported"},
    )
    max_model_len: int | None = field(
        default=None,
        metadata={"help": "max prompt + output tokens per request; default: the model's limit"},
    )
    device: str = field(default="auto", metadata={"help": "cpu, cuda or auto"})
    seed: int = field(default=0, metadata={"help": "seed for requests that set none"})
    attention_backend: AttentionBackend = field(
        default="auto",
        metadata={
            "help": "torch (pure-PyTorch reference), cpu (C++ kernels: paged attention and fused "
            "norm/RoPE/SiLU), triton (decode attention as a Triton kernel, for CUDA), or auto: "
            "cpu on a CPU, triton on a GPU"
        },
    )
    quantized_activations: QuantizedActivations = field(
        default="auto",
        metadata={
            "help": "int16 or int8: round activations to 16 or 8 bits per block of 32 and "
            "multiply them with the weights in integers (int8 is what llama.cpp does); off: "
            "the dtype's own path throughout (the exact one); auto: int8 in float32 where "
            "K-quant blocks hold most of a GGUF file's layer weights (Q4_K_M, Q5_K_M, Q6_K "
            "files: llama.cpp's rounding) or where the CPU has AMX tiles (which multiply "
            "8-bit batches of 8 rows or more up to 2-3x faster) or AVX-512 VNNI, int16 "
            "elsewhere (the legacy formats on AVX2 alone), and off for a bf16 engine of more "
            "than 8 seats (max_num_seqs) on a CPU with AMX tiles whose large bf16 batches go "
            "through oneDNN on them (INFLIGHT_ONEDNN_BF16=1). Applies to a GGUF file's "
            "block-quantized weights (Q4_0 to Q8_0, the K-quants and MXFP4): every float32 "
            "batch on AVX2 CPUs, AVX-512 ones included, and on AVX-512 VNNI ones (int16, "
            "Q4_0 / Q4_1 / Q8_0) every bf16 decode row, while bf16 prompts stay exact. int16 "
            "decodes a few sequences ~2x faster than off with the same greedy tokens on the "
            "parity prompts; int8 computes a 3B-shaped Q4_K_M file's mixed batches 1.4x "
            "faster again, and moves perplexity by about 0.2 percent (docs/benchmarks.md)"
        },
    )
    tensor_parallel_size: int = field(
        default=1,
        metadata={
            "help": "ranks the model is split over (its heads, KV heads, MLP columns and "
            "vocabulary), each a process on this machine with its share of the cores, "
            "all-reducing through shared memory; CPU only; each rank holds its slices of the "
            "weights (a GGUF's blocks too) and its own share of every KV block "
            "(kv_cache_memory_bytes is each rank's)"
        },
    )
    distributed_executor_backend: DistributedBackend = field(
        default="mp",
        metadata={
            "help": "how ranks 1..N-1 of a split model start: mp, processes on this machine; "
            "ray, Ray actors in a placement group of the Ray cluster this process has joined "
            "(ray.init, or `inflight serve --ray-address`, where each replica is one group), "
            "one rank per node by default (ray_cpus_per_rank)"
        },
    )
    ray_cpus_per_rank: int | None = field(
        default=None,
        metadata={
            "help": "CPUs each Ray rank reserves and computes on (its threads); default: every "
            "CPU of the cluster's smallest node, so that each rank has a node to itself"
        },
    )
    chat_template: str | None = field(
        default=None,
        metadata={
            "help": "a Jinja chat template (its file's path, or the text itself) for chat "
            "requests in place of the model's own: for a file without one (a base model's) or "
            "to change how conversations are laid out. The config holds its text"
        },
    )
    generation_config: GenerationConfig = field(
        default="auto",
        metadata={
            "help": "auto: the sampling settings the model's files recommend (a folder's "
            "generation_config.json, a GGUF file's general.sampling keys: temperature, top_p, "
            "top_k, min_p, repetition_penalty) are the defaults of requests that leave them "
            "unset, as vLLM and llama.cpp take them; none: OpenAI's defaults (temperature 1, "
            "top_p 1, no top-k)"
        },
    )
    enforce_eager: bool = field(
        default=False,
        metadata={
            "help": "run every step op by op: no CUDA graphs for decode-only steps (graphs are "
            "used on a GPU with the triton backend)"
        },
    )

    def __post_init__(self) -> None:
        _check_kinds(self)
        _take_path(self, "model")
        dtype: Any = self.dtype
        if type(dtype).__module__ == "torch" and type(dtype).__name__ == "dtype":  # torch.float16
            dtype = str(dtype).removeprefix("torch.")
        if isinstance(dtype, str):
            object.__setattr__(self, "dtype", DTYPE_ALIASES.get(dtype, dtype))
        _require(
            self.dtype in ("auto", "bfloat16", "float16", "float32"),
            f"dtype must be auto, bfloat16, float16 or float32 (or a torch dtype of those, or "
            f"half, float), got {self.dtype!r}",
        )
        _require(
            self.max_model_len is None or self.max_model_len >= 1,
            f"max_model_len must be >= 1, got {self.max_model_len}",
        )
        _require(self.device in ("auto", "cpu", "cuda"), f"unknown device {self.device!r}")
        _require(
            MIN_SEED <= self.seed <= MAX_SEED,
            f"seed must be in [{MIN_SEED}, {MAX_SEED}], got {self.seed}",
        )
        _require(
            1 <= self.tensor_parallel_size <= MAX_TENSOR_PARALLEL,
            f"tensor_parallel_size must be an integer from 1 to {MAX_TENSOR_PARALLEL}, got "
            f"{self.tensor_parallel_size!r}",
        )
        _require(
            self.distributed_executor_backend in ("mp", "ray"),
            f"distributed_executor_backend must be mp or ray, got "
            f"{self.distributed_executor_backend!r}",
        )
        _require(
            self.ray_cpus_per_rank is None or 1 <= self.ray_cpus_per_rank <= MAX_CPUS_PER_RANK,
            f"ray_cpus_per_rank must be an integer from 1 to {MAX_CPUS_PER_RANK}, got "
            f"{self.ray_cpus_per_rank!r}",
        )
        _require(
            self.quantized_activations in tuple(ACTIVATION_BITS),  # any value, hashable or not
            "quantized_activations must be auto, off, int16 or int8, got "
            f"{self.quantized_activations!r}",
        )
        if self.chat_template is not None:
            template = self.chat_template
            _require(isinstance(template, str), f"chat_template must be text, not {template!r}")
            # read once, and refused now rather than after loading the weights
            object.__setattr__(self, "chat_template", chat_template_text(template))
        _require(
            self.generation_config in ("auto", "none"),
            f"generation_config must be auto or none, got {self.generation_config!r}",
        )
        _require(
            self.attention_backend in ("auto", "torch", "cpu", "triton"),
            f"attention_backend must be auto, torch, cpu or triton, got {self.attention_backend!r}",
        )


@dataclass(frozen=True)
class CacheConfig:
    kv_block_size: int = field(default=16, metadata={"help": "tokens per KV cache block"})
    kv_cache_memory_bytes: int = field(
        default=2 * GiB, metadata={"help": "memory budget for the KV cache, in bytes"}
    )
    num_kv_blocks: int | None = field(
        default=None, metadata={"help": "number of KV blocks; overrides the memory budget"}
    )
    swap_space_bytes: int = field(
        default=GiB, metadata={"help": "CPU memory for swapped-out KV blocks (preemption swap)"}
    )
    enable_prefix_caching: bool = field(
        default=True, metadata={"help": "reuse the KV of full blocks shared by earlier requests"}
    )
    num_saved_states: int | None = field(
        default=None,
        metadata={
            "help": "states a model that carries state between steps (LFM2, Qwen3.5) keeps for "
            "prefix-cache hits, each a seat's state in bytes, least recently used given up "
            "first (default: one a seat; 0: no hits for such a model)"
        },
    )
    reuse_decoded_kv: bool = field(
        default=False,
        metadata={
            "help": "let a prompt hit cached blocks of tokens another request decoded (a "
            "conversation's last answer): its next turn skips computing them, but their KV "
            "(and a state-carrying model's state) is then the decode kernel's, which rounds "
            "otherwise than the prompt kernel, so its log-probabilities move in the last bits "
            "with what the cache held"
        },
    )
    free_window_blocks: bool = field(
        default=True,
        metadata={
            "help": "layers that attend within a window give back the KV blocks it no longer "
            "reaches (their own block tables; a draft model or CUDA graphs keep one table)"
        },
    )
    kv_cache_dtype: KVCacheDtype = field(
        default="auto",
        metadata={
            "help": "what the KV cache stores: auto (the model's dtype), bf16, or 8 bits per "
            "value with a float32 scale per position and head (int8, or fp8: float8 e4m3); a "
            "float32 engine's cache holds 2x (bf16) or ~3.8x (8-bit, head_dim 64) the tokens "
            "in the same memory, at some cost in agreement with the exact path "
            "(docs/benchmarks.md)"
        },
    )

    def __post_init__(self) -> None:
        _check_kinds(self)
        _require(self.kv_block_size >= 1, f"kv_block_size must be >= 1, got {self.kv_block_size}")
        _require(
            self.kv_cache_memory_bytes >= 1,
            f"kv_cache_memory_bytes must be >= 1, got {self.kv_cache_memory_bytes}",
        )
        _require(
            self.swap_space_bytes >= 0,
            f"swap_space_bytes must be >= 0, got {self.swap_space_bytes}",
        )
        _require(
            self.num_kv_blocks is None or self.num_kv_blocks >= 1,
            f"num_kv_blocks must be >= 1, got {self.num_kv_blocks}",
        )
        _require(
            self.num_saved_states is None or self.num_saved_states >= 0,
            f"num_saved_states must be >= 0, got {self.num_saved_states}",
        )
        _require(
            self.kv_cache_dtype in ("auto", "bf16", "fp8", "int8"),
            f"kv_cache_dtype must be auto, bf16, fp8 or int8, got {self.kv_cache_dtype!r}",
        )


@dataclass(frozen=True)
class SchedulerConfig:
    max_num_seqs: int = field(default=64, metadata={"help": "max sequences in flight"})
    max_num_batched_tokens: int = field(
        default=2048, metadata={"help": "token budget of one step (prefill chunks + decodes)"}
    )
    prefill_chunk_size: int | None = field(
        default=None,
        metadata={"help": "max prompt tokens of one request per step; default: the budget"},
    )
    batching: Batching = field(
        default="continuous",
        metadata={"help": "continuous, or static (admit only into an empty batch)"},
    )
    scheduling_policy: Policy = field(
        default="fcfs",
        metadata={
            "help": "waiting-queue order: fcfs, priority (lower first), sjf, or fair "
            "(the tenant with the least weighted tokens served first, within each "
            "priority class), or edf (earliest deadline first: arrival + TTFT target)"
        },
    )
    preemption_mode: PreemptionMode = field(
        default="recompute",
        metadata={"help": "recompute, or swap KV to CPU (recompute when the swap space is full)"},
    )
    kv_admission: KVAdmission = field(
        default="on-demand",
        metadata={
            "help": "on-demand (admit when the first chunk's blocks are free, preempt when blocks"
            " run out) or reserve (admit only when the whole prompt + max_tokens fits beside what"
            " running requests may still grow into: no preemption for blocks)"
        },
    )
    predictive_admission: bool = field(
        default=False,
        metadata={"help": "admit when blocks that finishing requests will free soon suffice"},
    )
    prediction_horizon: int = field(
        default=32, metadata={"help": "steps ahead predictive admission counts freed blocks"}
    )
    aging_s: float = field(
        default=10.0,
        metadata={"help": "seconds of waiting worth one priority level (sjf: 2x length)"},
    )
    num_speculative_tokens: int = field(
        default=0,
        metadata={
            "help": "draft tokens per decode from n-gram prompt lookup, verified in the same "
            "forward pass (0: off); each request drafts only while its acceptance pays for "
            "the step time its drafts add"
        },
    )
    speculative_model: str | None = field(
        default=None,
        metadata={
            "help": "a small model sharing the target's tokenizer (HF folder or GGUF file) that "
            "writes the num_speculative_tokens drafts instead of n-gram lookup; its KV cache "
            "shares the pool's blocks and the KV memory budget"
        },
    )
    slo_ttft: float | None = field(
        default=None,
        metadata={
            "help": "TTFT target in seconds for requests that set none; a request predicted to "
            "miss its target is refused at once (429 with Retry-After; see slo_admission)"
        },
    )
    slo_tpot: float | None = field(
        default=None,
        metadata={
            "help": "TPOT target in seconds (mean time per output token after the first) for "
            "requests that set none; steps cap their prompt tokens to keep decodes within it"
        },
    )
    slo_admission: SLOAdmission = field(
        default="refuse",
        metadata={
            "help": "refuse (a request predicted to miss its TTFT target is refused at once) or "
            "queue (queued anyway; targets still order edf and count toward goodput)"
        },
    )
    # `fair` scheduling's tenant weights (tenant, weight); unnamed tenants weigh 1. A knob of
    # the Python API; the server sets it from its API keys file (no flag of its own).
    tenant_weights: tuple[tuple[str, float], ...] = field(default=(), metadata={"flag": False})
    # Resolved by the engine once the model is loaded; not a user knob.
    max_model_len: int = field(default=0, metadata={"knob": False})

    def __post_init__(self) -> None:
        _check_kinds(self)
        _require(self.max_num_seqs >= 1, f"max_num_seqs must be >= 1, got {self.max_num_seqs}")
        pairs = self.tenant_weights
        _require(
            isinstance(pairs, tuple | list)
            and all(isinstance(p, tuple | list) and len(p) == 2 and isinstance(p[0], str)
                    and is_tenant_weight(p[1]) for p in pairs),
            f"tenant_weights must be (tenant, positive finite weight) pairs, got {pairs!r}",
        )  # fmt: skip
        _require(
            self.max_num_batched_tokens >= 1,
            f"max_num_batched_tokens must be >= 1, got {self.max_num_batched_tokens}",
        )
        _require(
            self.prefill_chunk_size is None or self.prefill_chunk_size >= 1,
            f"prefill_chunk_size must be >= 1, got {self.prefill_chunk_size}",
        )
        _require(
            self.batching in ("continuous", "static"),
            f"batching must be 'continuous' or 'static', got {self.batching!r}",
        )
        _require(
            self.scheduling_policy in ("fcfs", "priority", "sjf", "fair", "edf"),
            "scheduling_policy must be fcfs, priority, sjf, fair or edf, got "
            f"{self.scheduling_policy!r}",
        )
        _require(self.aging_s > 0, f"aging_s must be > 0, got {self.aging_s}")
        for name in ("slo_ttft", "slo_tpot"):
            value = getattr(self, name)
            _require(
                value is None or (math.isfinite(value) and value > 0),
                f"{name} must be a positive finite number of seconds, got {value!r}",
            )  # fmt: skip
        _require(
            self.slo_admission in ("refuse", "queue"),
            f"slo_admission must be refuse or queue, got {self.slo_admission!r}",
        )
        _require(
            0 <= self.num_speculative_tokens <= 64,
            f"num_speculative_tokens must be in [0, 64], got {self.num_speculative_tokens}",
        )
        _take_path(self, "speculative_model")
        _require(
            self.speculative_model is None or self.num_speculative_tokens >= 1,
            "speculative_model drafts num_speculative_tokens tokens: set it to 1 or more",
        )
        _require(
            self.prediction_horizon >= 1,
            f"prediction_horizon must be >= 1, got {self.prediction_horizon}",
        )
        _require(
            self.kv_admission in ("on-demand", "reserve"),
            f"kv_admission must be on-demand or reserve, got {self.kv_admission!r}",
        )
        _require(
            self.preemption_mode in ("recompute", "swap"),
            f"preemption_mode must be recompute or swap, got {self.preemption_mode!r}",
        )

    @property
    def default_slo(self) -> SLOTarget:
        """The targets of a request that sets none."""
        return SLOTarget(self.slo_ttft, self.slo_tpot)

    @property
    def chunk_limit(self) -> int:
        """Most prompt tokens one request may compute in one step."""
        if self.prefill_chunk_size is None:
            return self.max_num_batched_tokens
        return min(self.prefill_chunk_size, self.max_num_batched_tokens)


@dataclass(frozen=True)
class EngineConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    cache: CacheConfig = field(default_factory=CacheConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)

    @classmethod
    def from_knobs(cls, **knobs: Any) -> EngineConfig:
        """Builds a config from flat knob names (`max_num_seqs=8`); unknown names are errors."""
        parts: dict[type, dict[str, Any]] = {ModelConfig: {}, CacheConfig: {}, SchedulerConfig: {}}
        for name, value in knobs.items():
            owner = KNOBS.get(name)
            if owner is None:
                raise ConfigError(f"unknown knob {name!r}; known knobs: {', '.join(sorted(KNOBS))}")
            parts[owner][name] = value
        return cls(
            model=ModelConfig(**parts[ModelConfig]),
            cache=CacheConfig(**parts[CacheConfig]),
            scheduler=SchedulerConfig(**parts[SchedulerConfig]),
        )


def knob_fields() -> list[tuple[type, dataclasses.Field]]:
    """Every user-settable knob with the dataclass that owns it, in declaration order."""
    return [
        (owner, f)
        for owner in (ModelConfig, CacheConfig, SchedulerConfig)
        for f in dataclasses.fields(owner)
        if f.metadata.get("knob", True)
    ]


KNOBS: dict[str, type] = {f.name: owner for owner, f in knob_fields()}
