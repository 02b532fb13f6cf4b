"""Linear layers with weights reordered once into oneDNN's blocked layout (CPU, bfloat16).

`F.linear` hands oneDNN a plain row-major weight, which it re-packs into its blocked layout on
every call: at decode batch sizes that copy costs as much as the multiply (SmolLM2, 30 layers +
LM head, weights streamed from DRAM: 21 ms -> 12 ms per step at 1-4 tokens, 44 -> 37 ms at 64).
Packing at load time removes it; results are bit-identical to `F.linear` (same kernel, same
accumulation). float32 stays on `F.linear` (MKL), whose results the packed path would not match.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable

import torch
from torch import nn

logger = logging.getLogger(__name__)

# The batch size oneDNN is told to expect; measured insensitive between 1 and 2048 tokens.
_BATCH_HINT = 64


def can_pack(dtype: torch.dtype, device: torch.device) -> bool:
    return (
        device.type == "cpu"
        and dtype == torch.bfloat16
        and torch.backends.mkldnn.is_available()
        and torch.ops.mkldnn._is_mkldnn_bf16_supported()
    )


class PackedLinear(nn.Module):
    """`nn.Linear`'s forward over a weight packed once (no bias-free special case needed)."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        weight = linear.weight.detach()
        self.register_buffer("weight", torch.ops.mkldnn._reorder_linear_weight(weight, _BATCH_HINT))
        bias = None if linear.bias is None else linear.bias.detach()
        self.register_buffer("bias", bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(x, self.weight, self.bias, "none", [], "")

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, packed"


def pack_linears(model: nn.Module) -> int:
    """Replaces every `nn.Linear` under `model` with a `PackedLinear`; returns how many.

    A tied LM head gets its own packed copy; the embedding keeps the plain weight it indexes.
    """
    targets = [(name, m) for name, m in model.named_modules() if isinstance(m, nn.Linear)]
    for name, linear in targets:
        parent_name, _, leaf = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, leaf, PackedLinear(linear))
    logger.info("packed %d linear layers for oneDNN", len(targets))
    return len(targets)


def warm_up(model: nn.Module, batch_sizes: Iterable[int]) -> None:
    """Runs every packed weight shape once at each batch size, so oneDNN builds its kernel for
    it now: a shape it has not seen costs ~1 ms extra on its first call, which would otherwise
    land on the first requests' steps (~5 ms per new decode batch size for a Llama layer).

    Kernels are cached per shape, not per weight, so one layer's projections stand for all."""
    by_shape = {}
    for m in model.modules():
        if isinstance(m, PackedLinear):
            by_shape.setdefault((m.in_features, m.out_features, m.bias is not None), m)
    if not by_shape:
        return
    start = time.perf_counter()
    sizes = sorted(set(batch_sizes))
    with torch.inference_mode():
        for n in sizes:
            for m in by_shape.values():
                m(torch.zeros(n, m.in_features, dtype=m.weight.dtype))
    logger.info(
        "warmed %d packed shapes at %d batch sizes in %.2f s",
        len(by_shape),
        len(sizes),
        time.perf_counter() - start,
    )
