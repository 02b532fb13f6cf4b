"""On the GPU machine: random-weight bf16 models with SmolLM2-135M's shapes, a ~1B Llama's and a
~1B Qwen3-MoE's (64 experts, 8 a token), with SmolLM2's tokenizer, as HF folders
(`python random_models.py OUT [smol] [llama1b] [qwen3moe]`).

Timing does not depend on weight values; with `ignore_eos` every request runs to `max_tokens`.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM

META = Path(".gpu/smol-meta")  # written by scripts/gpu/prepare.sh
SHAPES = {
    "smol": {},
    "llama1b": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                    num_attention_heads=32, num_key_value_heads=8, head_dim=64),
    "qwen3moe": dict(hidden_size=1024, num_hidden_layers=12, num_attention_heads=16,
                     num_key_value_heads=4, head_dim=64, num_experts=64, num_experts_per_tok=8,
                     moe_intermediate_size=256, intermediate_size=1024, norm_topk_prob=True),
}  # fmt: skip
MOE = {"qwen3moe": (Qwen3MoeConfig, Qwen3MoeForCausalLM)}


def main(out: Path, names: list[str]) -> None:
    for name in names or list(SHAPES):
        config_class, model_class = MOE.get(name, (LlamaConfig, LlamaForCausalLM))
        config = config_class.from_pretrained(META)
        # META is a Llama's: without its own model type, transformers saves the experts stacked
        # (its in-memory layout), not per expert as published checkpoints hold them
        config.model_type = config_class.model_type
        for key, value in SHAPES[name].items():
            setattr(config, key, value)
        torch.manual_seed(0)
        with torch.device("cuda"):
            model = model_class(config).to(torch.bfloat16)
        model.save_pretrained(out / name, safe_serialization=True)
        for f in META.iterdir():
            if f.name != "config.json":
                shutil.copy(f, out / name / f.name)
        print(f"{name}: {sum(p.numel() for p in model.parameters()) / 1e6:.0f}M parameters")


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2:])
