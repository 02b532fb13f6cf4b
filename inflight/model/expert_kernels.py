"""A step's experts on a GPU: each linear of every chosen expert in one Triton launch, routed on
the device, so that a CUDA graph can capture an expert layer's decode steps.

The host path (`moe.route`) reads which experts were chosen back to the host and runs each one's
linears over its rows: a synchronisation per layer that no graph can hold, and a launch per
expert. Here the (token, rank) pairs are laid out by expert on the device (`group_pairs`: a
stable sort, then each expert's pairs padded to whole tiles of `tile` rows), and one grouped
matmul (`expert_matmul`) runs a program per (tile, block of output columns), which reads its
tile's expert from a table and its rows from a gather list: only the chosen experts' weights
are read, each once per tile of its rows. Every shape is fixed by the step's token count and the
number of experts, never by the routing, so the same launches serve any choice of experts.

A token's outputs of its experts add in expert order, each rounded to the model's dtype, as the
host path adds them. The experts' weights are stacked per layer at load (`stack_experts`); each
expert's `nn.Linear` keeps a view of its slice, so the stack costs no second copy.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from inflight.attention.triton_runtime import tl, triton

BLOCK_N = 64  # output columns per program
BLOCK_K = 64  # inputs per loop iteration


@dataclass
class ExpertStack:
    """One sparse layer's experts, each projection's weights [E, out, in] (biases [E, out])."""

    gate_up: torch.Tensor
    down: torch.Tensor
    gate_up_bias: torch.Tensor | None = None
    down_bias: torch.Tensor | None = None


def stack_experts(experts: nn.ModuleList) -> ExpertStack:
    """Stacks every expert's weights and points each expert's linears at its slice."""

    def stack(projection: str, part: str) -> torch.Tensor | None:
        tensors = [getattr(getattr(e, projection), part) for e in experts]
        if tensors[0] is None:
            return None
        stacked = torch.stack(tensors)
        for e, expert in enumerate(experts):
            linear = getattr(expert, projection)
            setattr(linear, part, nn.Parameter(stacked[e], requires_grad=False))
        return stacked

    gate_up, down = stack("gate_up_proj", "weight"), stack("down_proj", "weight")
    assert gate_up is not None and down is not None
    return ExpertStack(gate_up, down, stack("gate_up_proj", "bias"), stack("down_proj", "bias"))


def tile_rows(num_pairs: int) -> int:
    """Rows of a tile: 16 (the least a matrix product takes) for decode-sized steps, where an
    expert rarely has more pairs; 64 for prompt-sized ones."""
    return 16 if num_pairs <= 1024 else 64


def max_tiles(num_pairs: int, num_experts: int, tile: int) -> int:
    """A bound on the tiles of any routing of `num_pairs` pairs: each expert with pairs wastes
    less than one tile, and at most min(E, pairs) experts have any."""
    return -(-num_pairs // tile) + min(num_experts, num_pairs)


def group_pairs(
    chosen: torch.Tensor, num_experts: int, tile: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The step's pairs (flat index `token * k + rank` of `chosen` [T, k]) laid out by expert,
    all on the device: `rows` [tiles * tile], each expert's pairs in token order from the start
    of its first tile, -1 in the padding; `tile_expert` [tiles], each tile's expert
    (`num_experts` for tiles past the last one used)."""
    flat = chosen.flatten()
    num_pairs = flat.numel()
    order = torch.argsort(flat, stable=True)
    counts = torch.zeros(num_experts, dtype=torch.long, device=flat.device)
    counts.scatter_add_(0, flat, torch.ones_like(flat))
    tiles = (counts + tile - 1) // tile
    tile_end = tiles.cumsum(0)
    expert = flat[order]
    rank = torch.arange(num_pairs, device=flat.device) - (counts.cumsum(0) - counts)[expert]
    dest = (tile_end - tiles)[expert] * tile + rank
    n = max_tiles(num_pairs, num_experts, tile)
    rows = torch.full((n * tile,), -1, dtype=torch.long, device=flat.device)
    rows.scatter_(0, dest, order)
    tile_expert = torch.searchsorted(tile_end, torch.arange(n, device=flat.device), right=True)
    return rows, tile_expert


@triton.jit(do_not_specialize=["num_out", "num_in"])
def _expert_matmul_kernel(
    x_ptr,  # [*, num_in] rows read by `pair // PAIRS_PER_ROW`
    w_ptr,  # [E, num_out, num_in]
    bias_ptr,  # [E, num_out] (read where HAS_BIAS)
    out_ptr,  # [pairs, num_out], row `pair`
    rows_ptr,  # [tiles * TILE] pair of each tile row, -1: padding
    tile_expert_ptr,  # [tiles]
    num_out,
    num_in,
    NUM_EXPERTS: tl.constexpr,
    PAIRS_PER_ROW: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    TILE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    PRECISION: tl.constexpr,
    UPCAST: tl.constexpr,  # float32 products: the interpreter's products of 16-bit floats fail
):
    t = tl.program_id(0)
    expert = tl.load(tile_expert_ptr + t)
    if expert < NUM_EXPERTS:
        pairs = tl.load(rows_ptr + t * TILE + tl.arange(0, TILE))
        live = pairs >= 0
        src = tl.where(live, pairs // PAIRS_PER_ROW, 0)
        n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        n_ok = n < num_out
        w_rows = w_ptr + expert.to(tl.int64) * num_out * num_in + n.to(tl.int64) * num_in
        acc = tl.zeros((TILE, BLOCK_N), tl.float32)
        for k0 in range(0, num_in, BLOCK_K):
            k = k0 + tl.arange(0, BLOCK_K)
            k_ok = k < num_in
            a = tl.load(x_ptr + src[:, None] * num_in + k[None, :],
                        mask=live[:, None] & k_ok[None, :], other=0.0)  # fmt: skip
            b = tl.load(w_rows[None, :] + k[:, None], mask=k_ok[:, None] & n_ok[None, :],
                        other=0.0)  # fmt: skip
            if UPCAST:
                a, b = a.to(tl.float32), b.to(tl.float32)
            acc += tl.dot(a, b, input_precision=PRECISION)
        if HAS_BIAS:
            acc += tl.load(bias_ptr + expert * num_out + n, mask=n_ok, other=0.0).to(tl.float32)
        tl.store(out_ptr + pairs[:, None] * num_out + n[None, :],
                 acc.to(out_ptr.dtype.element_ty), mask=live[:, None] & n_ok[None, :])  # fmt: skip


def expert_matmul(
    x: torch.Tensor,  # [R, in]
    weight: torch.Tensor,  # [E, out, in]
    bias: torch.Tensor | None,  # [E, out]
    rows: torch.Tensor,
    tile_expert: torch.Tensor,
    num_pairs: int,
    pairs_per_row: int,
) -> torch.Tensor:
    """Row `p` of the result [num_pairs, out] is x[p // pairs_per_row] times the transposed
    weight (plus bias) of pair p's expert, for the layout `group_pairs` made."""
    num_experts, num_out, num_in = weight.shape
    out = torch.empty(num_pairs, num_out, dtype=x.dtype, device=x.device)
    tile = rows.numel() // tile_expert.numel()
    interpreted = x.device.type == "cpu"
    precision = "ieee" if x.dtype == torch.float32 or interpreted else "tf32"
    grid = (tile_expert.numel(), triton.cdiv(num_out, BLOCK_N))
    _expert_matmul_kernel[grid](
        x.contiguous(), weight, weight if bias is None else bias, out, rows, tile_expert,
        num_out, num_in, NUM_EXPERTS=num_experts, PAIRS_PER_ROW=pairs_per_row,
        HAS_BIAS=bias is not None, TILE=tile, BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K,
        PRECISION=precision, UPCAST=interpreted,
    )  # fmt: skip
    return out


def sum_in_expert_order(h: torch.Tensor, chosen: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Each token's rows of `h` [T * k, H] (already scaled by their router weights) added in
    the order of their experts, each rounded to `dtype` first: the host path's sum."""
    num_tokens, k = chosen.shape
    by_expert = chosen.argsort(dim=1, stable=True)
    parts = h.to(dtype).view(num_tokens, k, -1)
    parts = torch.take_along_dim(parts, by_expert[:, :, None], dim=1)
    total = torch.zeros(num_tokens, parts.shape[-1], dtype=dtype, device=h.device)
    for rank in range(k):
        total = total + parts[:, rank]
    return total
