"""Paged decode attention as Triton kernels, for CUDA GPUs (flash-decoding).

A request's context is cut into partitions of `partition_size(...)` positions, one program per
(request, KV head, partition), so that a few requests with long contexts still fill the GPU: one
program per (request, KV head) leaves most of a large GPU idle at a few dozen requests, each
program walking its whole context one dependent load after another. A program walks
its partition `TOKENS` positions at a time, reading keys and values in place from the reference
backend's token-major cache ([num_blocks, block_size, KVH, D]), scores all query heads of its
group at once and keeps an online softmax (running max and sum, float32); a second kernel merges
the partitions' partial results. Partitions past a request's context (or before its sliding
window) exit at once, so the grid can be sized from the block tables' width alone: the same
launch serves any lengths, which CUDA graphs need.

`triton_backend.TritonBackend` pairs these with the prompt kernel of `triton_prefill.py`.
Without a GPU the kernels run under Triton's interpreter (`triton_runtime.py`), which is how
CI tests them.
"""

from __future__ import annotations

import torch

from inflight.attention.backend import SCALE_BYTES, is_scaled
from inflight.attention.triton_kv_rows import load_kv_rows
from inflight.attention.triton_prefill import soft_capped
from inflight.attention.triton_runtime import tl, triton

# Positions scored per loop iteration (at least one block): bounds the [group, positions, dim]
# products a program holds at once.
MIN_TOKENS = 32
MIN_PARTITION = 128  # positions per program, unless the context would need over MAX_PARTITIONS
MAX_PARTITIONS = 64  # bounds the merge kernel's [partitions, dim] tile


def partition_size(max_context: int) -> int:
    """MIN_PARTITION, doubled until MAX_PARTITIONS partitions cover `max_context` positions."""
    size = MIN_PARTITION
    while size * MAX_PARTITIONS < max_context:
        size *= 2
    return size


@triton.jit
def _window_start(seq_len, window):
    """The first position a query at `seq_len - 1` attends to (0 when `window` is 0)."""
    return tl.where(window > 0, tl.maximum(seq_len - window, 0), 0)


# Lengths and widths vary from step to step: specializing on their values (Triton's default for
# integers) would compile a new variant, seconds each, in the middle of serving.
@triton.jit(do_not_specialize=["window", "softcap", "max_blocks", "num_partitions"])
def _partition_kernel(
    q_ptr,  # [R, H, D]
    k_cache_ptr,  # [NB, BS, KVH, D (+ 4 scale bytes: SCALED)]
    v_cache_ptr,
    block_tables_ptr,  # [R, MB] int
    seq_lens_ptr,  # [R] int
    max_ptr,  # [R, H, P] float32: running max of the partition's scores, per head
    sum_ptr,  # [R, H, P] float32: sum of exp(score - max)
    acc_ptr,  # [R, H, P, D] float32: sum of exp(score - max) * value
    scale,
    window,  # 0: none
    softcap,  # 0: none (SOFTCAP)
    max_blocks,
    num_partitions,
    num_kv_heads: tl.constexpr,
    group: tl.constexpr,  # query heads per KV head
    head_dim: tl.constexpr,
    block_size: tl.constexpr,
    GROUP_PAD: tl.constexpr,
    DIM_PAD: tl.constexpr,
    TOKENS: tl.constexpr,
    PARTITION: tl.constexpr,
    SCALED: tl.constexpr,  # an 8-bit cache (`load_kv_rows`)
    SOFTCAP: tl.constexpr,
):
    r = tl.program_id(0)
    kv_head = tl.program_id(1)
    part = tl.program_id(2)
    seq_len = tl.load(seq_lens_ptr + r)
    first = _window_start(seq_len, window)
    lo = part * PARTITION
    hi = tl.minimum(lo + PARTITION, seq_len)
    if (lo < seq_len) & (lo + PARTITION > first):
        g = tl.arange(0, GROUP_PAD)
        d = tl.arange(0, DIM_PAD)
        g_ok = g < group
        d_ok = d < head_dim
        heads = kv_head * group + g
        q = tl.load(
            q_ptr + (r * num_kv_heads * group + heads)[:, None] * head_dim + d[None, :],
            mask=g_ok[:, None] & d_ok[None, :],
            other=0.0,
        ).to(tl.float32)

        running_max = tl.full((GROUP_PAD,), -1.0e30, tl.float32)  # finite: no inf - inf
        running_sum = tl.zeros((GROUP_PAD,), tl.float32)
        acc = tl.zeros((GROUP_PAD, DIM_PAD), tl.float32)
        row_len = head_dim + 4 * SCALED  # a position's elements for one head
        kv_stride = num_kv_heads * row_len  # between positions of a block
        start = tl.maximum(lo, (first // TOKENS) * TOKENS)
        for n0 in range(start, hi, TOKENS):
            n = n0 + tl.arange(0, TOKENS)
            live = (n >= first) & (n < hi)
            block = tl.load(
                block_tables_ptr + r * max_blocks + n // block_size, mask=live, other=0
            ).to(tl.int64)
            row = (block * block_size + n % block_size) * kv_stride + kv_head * row_len
            k = load_kv_rows(k_cache_ptr, row, d, live, head_dim, SCALED)
            v = load_kv_rows(v_cache_ptr, row, d, live, head_dim, SCALED)
            # [GROUP_PAD, TOKENS]: every head of the group against every position
            scores = tl.sum(q[:, None, :] * k.to(tl.float32)[None, :, :], axis=2) * scale
            if SOFTCAP:
                scores = soft_capped(scores, softcap)
            scores = tl.where(live[None, :], scores, float("-inf"))
            new_max = tl.maximum(running_max, tl.max(scores, axis=1))
            rescale = tl.exp(running_max - new_max)
            p = tl.exp(scores - new_max[:, None])
            running_sum = running_sum * rescale + tl.sum(p, axis=1)
            acc = acc * rescale[:, None] + tl.sum(
                p[:, :, None] * v.to(tl.float32)[None, :, :], axis=1
            )
            running_max = new_max

        at = (r * num_kv_heads * group + heads) * num_partitions + part  # [GROUP_PAD]
        tl.store(max_ptr + at, running_max, mask=g_ok)
        tl.store(sum_ptr + at, running_sum, mask=g_ok)
        tl.store(
            acc_ptr + at[:, None] * head_dim + d[None, :], acc, mask=g_ok[:, None] & d_ok[None, :]
        )


@triton.jit(do_not_specialize=["window", "num_partitions"])
def _merge_kernel(
    max_ptr,  # [R, H, P]
    sum_ptr,
    acc_ptr,  # [R, H, P, D]
    seq_lens_ptr,
    sinks_ptr,  # [H] float32 (read where SINKS)
    out_ptr,  # [R, H, D]
    window,
    num_partitions,
    head_dim: tl.constexpr,
    PARTITION: tl.constexpr,
    PARTS_PAD: tl.constexpr,
    DIM_PAD: tl.constexpr,
    SINKS: tl.constexpr,
):
    """One program per (request, query head): rescales each partition's sums to the global max;
    a head's sink logit joins the denominator only (it has no value)."""
    r = tl.program_id(0)
    h = tl.program_id(1)
    num_heads = tl.num_programs(1)
    seq_len = tl.load(seq_lens_ptr + r)
    first = _window_start(seq_len, window)
    parts = tl.arange(0, PARTS_PAD)
    live = (parts >= first // PARTITION) & (parts * PARTITION < seq_len)
    live &= parts < num_partitions
    d = tl.arange(0, DIM_PAD)
    d_ok = d < head_dim
    at = (r * num_heads + h) * num_partitions + parts
    part_max = tl.load(max_ptr + at, mask=live, other=-1.0e30)
    part_sum = tl.load(sum_ptr + at, mask=live, other=0.0)
    part_acc = tl.load(
        acc_ptr + at[:, None] * head_dim + d[None, :], mask=live[:, None] & d_ok[None, :], other=0.0
    )
    top = tl.max(part_max, axis=0)
    if SINKS:
        sink = tl.load(sinks_ptr + h)
        top = tl.maximum(top, sink)
    weight = tl.where(live, tl.exp(part_max - top), 0.0)
    total = tl.sum(weight * part_sum, axis=0)
    if SINKS:
        total += tl.exp(sink - top)
    out = tl.sum(weight[:, None] * part_acc, axis=0) / total
    tl.store(
        out_ptr + (r * num_heads + h) * head_dim + d, out.to(out_ptr.dtype.element_ty), mask=d_ok
    )


def check_block_size(block_size: int) -> None:
    """A loop iteration covers whole blocks, and Triton tiles come in powers of two."""
    if block_size < 1 or block_size & (block_size - 1):
        raise ValueError(
            f"the Triton decode kernel needs a power-of-two block_size, got {block_size}"
        )


def paged_decode_attention(
    q: torch.Tensor,  # [R, H, D]
    k_cache: torch.Tensor,  # [NB, BS, KVH, D (+ 4 in an 8-bit cache)]
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,  # [R, MB]
    seq_lens: torch.Tensor,  # [R], each >= 1 and <= MB * BS
    scale: float,
    window: int = 0,
    softcap: float = 0.0,
    sinks: torch.Tensor | None = None,  # [H] float32
) -> torch.Tensor:
    """softmax(q k^T * scale) v for one query per request over its cached positions
    [max(0, seq_len - window), seq_len) (all of them when `window` is 0; scores soft-capped
    where `softcap` is not 0; each head's `sinks` logit in its softmax's denominator)."""
    num_reqs, num_heads, head_dim = q.shape
    _, block_size, num_kv_heads, cache_dim = k_cache.shape
    scaled = is_scaled(k_cache.dtype)
    if cache_dim != head_dim + (SCALE_BYTES if scaled else 0) or num_heads % num_kv_heads:
        raise ValueError(
            f"query heads {num_heads}x{head_dim} do not fit KV heads {num_kv_heads}x{cache_dim}"
        )
    check_block_size(block_size)
    out = torch.empty_like(q)
    if num_reqs == 0:
        return out
    seq_lens = seq_lens.contiguous()
    group = num_heads // num_kv_heads
    max_blocks = block_tables.shape[1]
    tokens = max(MIN_TOKENS, block_size)
    partition = max(partition_size(max_blocks * block_size), tokens)
    num_partitions = -(-max_blocks * block_size // partition)
    part_max = torch.empty(num_reqs, num_heads, num_partitions, device=q.device)
    part_sum = torch.empty_like(part_max)
    part_acc = torch.empty(num_reqs, num_heads, num_partitions, head_dim, device=q.device)
    dim_pad = triton.next_power_of_2(head_dim)
    _partition_kernel[(num_reqs, num_kv_heads, num_partitions)](
        q.contiguous(), k_cache, v_cache, block_tables.contiguous(), seq_lens,
        part_max, part_sum, part_acc, scale, window, float(softcap), max_blocks, num_partitions,
        num_kv_heads=num_kv_heads, group=group, head_dim=head_dim, block_size=block_size,
        GROUP_PAD=triton.next_power_of_2(group), DIM_PAD=dim_pad, TOKENS=tokens,
        PARTITION=partition, SCALED=scaled, SOFTCAP=softcap > 0,
    )  # fmt: skip
    _merge_kernel[(num_reqs, num_heads)](
        part_max, part_sum, part_acc, seq_lens, part_max if sinks is None else sinks, out,
        window, num_partitions, head_dim=head_dim, PARTITION=partition,
        PARTS_PAD=MAX_PARTITIONS, DIM_PAD=dim_pad, SINKS=sinks is not None,
    )  # fmt: skip
    return out
