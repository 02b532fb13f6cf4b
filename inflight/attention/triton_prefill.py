"""Paged prompt attention as a Triton kernel, for CUDA GPUs: every prompt chunk of a step in one
launch per layer, keys and values read in place through the block tables.

One program per (chunk, tile of `BLOCK_M` queries, query head) walks the chunk's positions from
its window's start to its last query's, `BLOCK_N` at a time, with two matrix products per
iteration (scores, then probabilities times values) and an online softmax in float32 (flash
attention over a paged cache). No masks, no gathered copies of the cache, no padding of chunks
to a common length, and no per-shape set-up: PyTorch's masked SDPA goes to cuDNN on Hopper,
which builds an attention plan on the host for every new shape, so the first steps of every new
shape cost seconds (`scripts/gpu/cold_steps.py` measures it).

The grid is sized by the step's longest chunk; tiles past a shorter chunk's end exit at once.
Inputs are the C++ prompt kernel's (`PrefillBatch`), so both backends share their metadata.
"""

from __future__ import annotations

import torch

from inflight.attention.backend import is_scaled
from inflight.attention.triton_kv_rows import load_kv_rows
from inflight.attention.triton_runtime import tl, triton

BLOCK_M = 64  # queries per program
BLOCK_N = 64  # positions per loop iteration


@triton.jit
def soft_capped(scores, softcap):
    """softcap * tanh(scores / softcap) (Gemma 2's), tanh as 1 - 2 / (exp(2x) + 1): exact at
    both ends (exp's overflow to inf gives 1), and Triton has no tanh of its own everywhere."""
    x = scores / softcap
    return softcap * (1.0 - 2.0 / (tl.exp(2.0 * x) + 1.0))


# Lengths vary from step to step: specializing on their values (Triton's default for integers)
# would compile a new variant, seconds each, in the middle of serving.
@triton.jit(do_not_specialize=["window", "softcap", "max_blocks", "q_row_stride"])
def _prefill_kernel(
    q_ptr,  # [T, H, D], rows `q_row_stride` apart, heads `head_dim` apart
    k_cache_ptr,  # [NB, BS, KVH, D (+ 4 scale bytes: SCALED)]
    v_cache_ptr,
    out_ptr,  # [T, H, D] contiguous
    chunks_ptr,  # [C, 3]: first flat row, query tokens, tokens cached before
    block_tables_ptr,  # [C, MB]
    sinks_ptr,  # [H] float32 (read where SINKS)
    scale,
    window,  # 0: none
    softcap,  # 0: none (SOFTCAP)
    max_blocks,
    q_row_stride,
    num_heads: tl.constexpr,
    num_kv_heads: tl.constexpr,
    head_dim: tl.constexpr,
    block_size: tl.constexpr,
    DIM_PAD: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PRECISION: tl.constexpr,  # of the matrix products: "ieee" for float32 inputs (no TF32)
    UPCAST: tl.constexpr,  # float32 products: the interpreter's products of 16-bit floats fail
    SCALED: tl.constexpr,  # an 8-bit cache (`load_kv_rows`)
    SOFTCAP: tl.constexpr,
    SINKS: tl.constexpr,  # a logit per head in each softmax's denominator (gpt-oss's)
):
    c = tl.program_id(0)
    m0 = tl.program_id(1) * BLOCK_M
    h = tl.program_id(2)
    q_len = tl.load(chunks_ptr + 3 * c + 1)
    if m0 < q_len:
        first_row = tl.load(chunks_ptr + 3 * c)
        cached = tl.load(chunks_ptr + 3 * c + 2)
        i = tl.arange(0, BLOCK_M)
        d = tl.arange(0, DIM_PAD)
        q_ok = m0 + i < q_len
        d_ok = d < head_dim
        pos = cached + m0 + i  # each query's position in its sequence
        rows = (first_row + m0 + i).to(tl.int64)
        q = tl.load(
            q_ptr + rows[:, None] * q_row_stride + h * head_dim + d[None, :],
            mask=q_ok[:, None] & d_ok[None, :],
            other=0.0,
        )
        if UPCAST:
            q = q.to(tl.float32)
        kv_head = h // (num_heads // num_kv_heads)
        end = cached + tl.minimum(m0 + BLOCK_M, q_len)  # one past the tile's last position
        start = tl.where(window > 0, tl.maximum(cached + m0 - window + 1, 0), 0)
        running_max = tl.full((BLOCK_M,), -1.0e30, tl.float32)  # finite: no inf - inf
        running_sum = tl.zeros((BLOCK_M,), tl.float32)
        acc = tl.zeros((BLOCK_M, DIM_PAD), tl.float32)
        row = head_dim + 4 * SCALED  # a position's elements for one head
        kv_stride = num_kv_heads * row  # between positions of a block
        for n0 in range((start // BLOCK_N) * BLOCK_N, end, BLOCK_N):
            n = n0 + tl.arange(0, BLOCK_N)
            n_ok = n < end
            block = tl.load(
                block_tables_ptr + c * max_blocks + n // block_size, mask=n_ok, other=0
            ).to(tl.int64)
            slot = (block * block_size + n % block_size) * kv_stride + kv_head * row
            # in the queries' dtype, whatever the cache holds
            k = load_kv_rows(k_cache_ptr, slot, d, n_ok, head_dim, SCALED).to(q.dtype)
            v = load_kv_rows(v_cache_ptr, slot, d, n_ok, head_dim, SCALED).to(q.dtype)
            scores = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale  # [M, N]
            if SOFTCAP:
                scores = soft_capped(scores, softcap)
            seen = (n[None, :] <= pos[:, None]) & n_ok[None, :]
            seen &= (window == 0) | (n[None, :] > pos[:, None] - window)
            scores = tl.where(seen, scores, float("-inf"))
            new_max = tl.maximum(running_max, tl.max(scores, axis=1))
            rescale = tl.exp(running_max - new_max)
            p = tl.exp(scores - new_max[:, None])
            running_sum = running_sum * rescale + tl.sum(p, axis=1)
            pv = tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
            acc = acc * rescale[:, None] + pv
            running_max = new_max
        if SINKS:  # the sink joins the denominator only: it has no value
            sink = tl.load(sinks_ptr + h)
            top = tl.maximum(running_max, sink)
            rescale = tl.exp(running_max - top)
            acc = acc * rescale[:, None]
            running_sum = running_sum * rescale + tl.exp(sink - top)
        out = acc / running_sum[:, None]
        tl.store(
            out_ptr + (rows[:, None] * num_heads + h) * head_dim + d[None, :],
            out.to(out_ptr.dtype.element_ty),
            mask=q_ok[:, None] & d_ok[None, :],
        )


def paged_prefill_attention(
    query: torch.Tensor,  # [T, H, D], the last dim contiguous
    k_cache: torch.Tensor,  # [NB, BS, KVH, D (+ 4)], the chunks' new keys already written
    v_cache: torch.Tensor,
    chunks: torch.Tensor,  # [C, 3]: first flat row, query tokens, tokens cached before
    block_tables: torch.Tensor,  # [C, MB], covering each chunk's cached + new positions
    out: torch.Tensor,  # [T, H, D] contiguous: the chunks' rows are written
    scale: float,
    window: int,  # 0: none
    softcap: float,  # 0: none
    max_query_len: int,  # the longest chunk's query tokens (sizes the grid)
    sinks: torch.Tensor | None = None,  # [H] float32
) -> None:
    """Causal softmax(q k^T * scale) v for each chunk's queries over its positions (within
    `window` of each query when it is not 0; scores soft-capped where `softcap` is not 0; each
    head's `sinks` logit in its softmax's denominator), as the C++ prompt kernel computes it."""
    num_heads, head_dim = query.shape[1], query.shape[2]
    block_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    if query.stride(2) != 1 or query.stride(1) != head_dim or not out.is_contiguous():
        raise ValueError("the prompt kernel needs [T, H, D] queries with contiguous heads")
    num_chunks = chunks.shape[0]
    if num_chunks == 0 or max_query_len == 0:
        return
    interpreted = query.device.type == "cpu"
    precision = "ieee" if query.dtype == torch.float32 or interpreted else "tf32"
    grid = (num_chunks, triton.cdiv(max_query_len, BLOCK_M), num_heads)
    _prefill_kernel[grid](
        query, k_cache, v_cache, out, chunks.contiguous(), block_tables.contiguous(),
        out if sinks is None else sinks, scale, window, float(softcap), block_tables.shape[1],
        query.stride(0),
        num_heads=num_heads, num_kv_heads=num_kv_heads, head_dim=head_dim,
        block_size=block_size, DIM_PAD=max(16, triton.next_power_of_2(head_dim)),
        BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, PRECISION=precision, UPCAST=interpreted,
        SCALED=is_scaled(k_cache.dtype), SOFTCAP=softcap > 0, SINKS=sinks is not None,
    )  # fmt: skip
