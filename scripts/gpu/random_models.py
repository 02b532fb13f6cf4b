"""On the GPU machine: random-weight bf16 models with SmolLM2-135M's shapes and a ~1B Llama's,
with SmolLM2's tokenizer, as HF folders (`python random_models.py OUT [smol] [llama1b]`).

Timing does not depend on weight values; with `ignore_eos` every request runs to `max_tokens`.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM

META = Path(".gpu/smol-meta")  # written by scripts/gpu/prepare.sh
SHAPES = {
    "smol": {},
    "llama1b": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                    num_attention_heads=32, num_key_value_heads=8, head_dim=64),
}  # fmt: skip


def main(out: Path, names: list[str]) -> None:
    for name in names or list(SHAPES):
        config = LlamaConfig.from_pretrained(META)
        for key, value in SHAPES[name].items():
            setattr(config, key, value)
        torch.manual_seed(0)
        with torch.device("cuda"):
            model = LlamaForCausalLM(config).to(torch.bfloat16)
        model.save_pretrained(out / name, safe_serialization=True)
        for f in META.iterdir():
            if f.name != "config.json":
                shutil.copy(f, out / name / f.name)
        print(f"{name}: {sum(p.numel() for p in model.parameters()) / 1e6:.0f}M parameters")


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2:])
