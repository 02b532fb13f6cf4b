"""gpt-oss's MXFP4 checkpoints: HF folders whose config says `quantization_config.quant_method`
"mxfp4" (the published gpt-oss ones). Each layer's expert stacks arrive as
`mlp.experts.{gate_up,down}_proj_blocks` (uint8 [experts, rows, in / 32, 16]: two FP4 codes a
byte, the even element's in the low nibble; gate_up's rows interleave gate and up) and
`..._scales` (uint8 [experts, rows, in / 32]: E8M0 exponents, 2^(e - 127)).

They become GGUF MXFP4 blocks (`gguf_blocks`: the exponent byte, then 16 bytes whose byte i
holds element i low and element i + 16 high; an FP4 value times 2^(e - 127) is its doubled
value times 2^(e - 128), so the bytes carry over and only the nibbles move), one expert and one
projection at a time, under the names a GGUF index gives them (`mlp.experts.E.gate_proj.weight`):
the loader then keeps them as blocks the kernels multiply from, exactly as a GGUF file's, or
dequantizes them where no kernel applies.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import torch
from gguf import GGMLQuantizationType

from inflight.model.gguf_blocks import dequantize

MXFP4_TYPE = int(GGMLQuantizationType.MXFP4)
_STACK = re.compile(r"(.*\.mlp\.experts)\.(gate_up_proj|down_proj)_(blocks|scales)")
# a stack's rows, split into the projections the other expert families load
_PARTS = {"gate_up_proj": (("gate_proj", 0), ("up_proj", 1)), "down_proj": (("down_proj", 0),)}


def is_mxfp4_checkpoint(folder: Path) -> bool:
    """Whether an HF folder's config says its experts are MXFP4 (read as `from_hf_config`
    reads it; a config it refuses is refused there)."""
    try:
        config = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError):
        return False
    quantization = config.get("quantization_config") if isinstance(config, dict) else None
    return isinstance(quantization, dict) and quantization.get("quant_method") == "mxfp4"


def to_gguf_blocks(blocks: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """HF MXFP4 [..., G, 16] codes and [..., G] exponents -> GGUF MXFP4 blocks [..., G, 17]."""
    if blocks.dtype != torch.uint8 or scales.dtype != torch.uint8:
        raise ValueError(f"MXFP4 blocks and scales must be uint8, not {blocks.dtype} and "
                         f"{scales.dtype}")  # fmt: skip
    if blocks.shape[-1] != 16 or blocks.shape[:-1] != scales.shape:
        raise ValueError(f"MXFP4 blocks {tuple(blocks.shape)} and scales {tuple(scales.shape)} "
                         "do not pair: [..., G, 16] and [..., G]")  # fmt: skip
    codes = torch.stack([blocks & 15, blocks >> 4], dim=-1).flatten(-2)  # [..., G, 32] in order
    packed = codes[..., :16] | (codes[..., 16:] << 4)
    return torch.cat([scales.unsqueeze(-1), packed], dim=-1)


def block_entries(shapes: dict[str, tuple[int, ...]]) -> dict[str, dict[str, Any]]:
    """The per-expert weights an MXFP4 checkpoint holds as blocks, from its tensors' shapes:
    HF name -> {"name", "type" (GGML's), "shape" ([in, out], GGUF's order)}, as a GGUF index
    lists them (what `drop_block_weights` reads)."""
    entries = {}
    for name, shape in shapes.items():
        match = _STACK.fullmatch(name)
        if match is None or match[3] != "blocks" or len(shape) != 4:
            continue
        experts, rows, groups, _ = shape
        parts = _PARTS[match[2]]
        for e in range(experts):
            for part, _ in parts:
                hf = f"{match[1]}.{e}.{part}.weight"
                entries[hf] = {"name": hf, "type": MXFP4_TYPE,
                               "shape": [groups * 32, rows // len(parts)]}  # fmt: skip
    return entries


def stack_part(name: str) -> str | None:
    """Which part of an MXFP4 expert stack a tensor is ("blocks", "scales"), or None."""
    match = _STACK.fullmatch(name)
    return None if match is None else match[3]


def blocks_bytes(shape: tuple[int, ...]) -> int:
    """The GGUF blocks' bytes of a `_blocks` tensor of this shape (17 for its 16 and scale)."""
    return math.prod(shape) // 16 * 17


def iter_mxfp4_weights(
    weights: Iterable[tuple[str, torch.Tensor]],
    blocks: dict[str, torch.Tensor] | None,
    skip: set[str],
) -> Iterator[tuple[str, torch.Tensor]]:
    """The checkpoint's tensors with each expert stack's blocks and scales turned into per-expert
    GGUF MXFP4 blocks: left in `blocks` (when given) and yielded dequantized (float32 [out, in])
    unless their name is in `skip` (kept as blocks alone). Other tensors pass through."""
    pending: dict[str, dict[str, torch.Tensor]] = {}
    for name, tensor in weights:
        match = _STACK.fullmatch(name)
        if match is None:
            yield name, tensor
            continue
        prefix, projection, kind = match.groups()
        pair = pending.setdefault(f"{prefix}.{projection}", {})
        pair[kind] = tensor
        if len(pair) < 2:
            continue
        del pending[f"{prefix}.{projection}"]
        stack = to_gguf_blocks(pair["blocks"], pair["scales"])  # [E, rows, G, 17]
        parts = _PARTS[projection]
        for e, expert in enumerate(stack):
            for part, first_row in parts:
                hf = f"{prefix}.{e}.{part}.weight"
                part_blocks = expert[first_row :: len(parts)].contiguous()  # gate_up interleaves
                if blocks is not None:
                    blocks[hf] = part_blocks
                if hf not in skip:
                    yield hf, dequantize(part_blocks)
    if pending:
        raise KeyError(f"MXFP4 blocks without their scales, or scales alone: {sorted(pending)}")
