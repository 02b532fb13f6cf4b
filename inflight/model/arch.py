"""LlamaArchConfig: the shape of a Llama-family model, from HF config.json or GGUF metadata.

Covers Llama (with llama3 / linear RoPE scaling), Mistral (sliding window), Qwen2 (q/k/v bias),
Qwen3 (q/k norms), Phi-3 / Phi-4 (fused projections in the checkpoint) and SmolLM2. Both
transformers 4 (`rope_theta` + `rope_scaling`) and transformers 5 (`rope_parameters`) spellings
of RoPE settings are read.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

SUPPORTED_ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
    "Phi3ForCausalLM": "phi3",
}


@dataclass(frozen=True)
class LlamaArchConfig:
    architecture: str  # "llama" | "mistral" | "qwen2" | "qwen3" | "phi3" (model/registry.py)
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
    # stores it), in place of `rope_scaling`
    rope_freq_factors: tuple[float, ...] | None = None
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()

    @property
    def rope_scaling_dict(self) -> dict[str, Any]:
        return dict(self.rope_scaling or ())

    @classmethod
    def from_hf_config(cls, config: dict[str, Any]) -> LlamaArchConfig:
        """Raises KeyError / ValueError on an unsupported or incomplete config (loader wraps)."""
        archs = config.get("architectures") or []
        arch = next(
            (SUPPORTED_ARCHITECTURES[a] for a in archs if a in SUPPORTED_ARCHITECTURES), None
        )
        if arch is None:
            raise ValueError(
                f"unsupported architecture {archs or config.get('model_type')!r}; "
                f"supported: {', '.join(SUPPORTED_ARCHITECTURES)}"
            )
        num_heads = config["num_attention_heads"]
        hidden = config["hidden_size"]
        rope = dict(config.get("rope_parameters") or {})
        rope_theta = rope.pop("rope_theta", None) or config.get("rope_theta", 10000.0)
        if not rope:
            rope = dict(config.get("rope_scaling") or {})
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        if rope_type not in ("default", "llama3", "linear"):
            raise ValueError(f"unsupported rope_type {rope_type!r}")
        rope["rope_type"] = rope_type
        rope.pop("type", None)
        rotary = rope.pop("partial_rotary_factor", config.get("partial_rotary_factor", 1.0))
        if rotary != 1.0:
            raise ValueError(f"partial rotary embeddings are not supported (factor {rotary})")
        window = config.get("sliding_window") if arch != "llama" else None
        if arch in ("qwen2", "qwen3"):
            if config.get("use_sliding_window", False):
                raise ValueError("Qwen per-layer sliding window attention is not supported")
            window = None
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
            head_dim=config.get("head_dim") or hidden // num_heads,
            rms_norm_eps=config.get("rms_norm_eps", 1e-6),
            rope_theta=float(rope_theta),
            max_position_embeddings=config.get("max_position_embeddings", 2048),
            tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
            qkv_bias=arch == "qwen2" or bool(config.get("attention_bias", False)),
            sliding_window=window,
            rope_scaling=None if rope_type == "default" else tuple(sorted(rope.items())),
            bos_token_id=config.get("bos_token_id"),
            eos_token_ids=eos_ids,
        )
