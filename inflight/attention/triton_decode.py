"""Paged decode attention as a Triton kernel, for CUDA GPUs.

One program per (request, KV head): it walks the request's block table `TOKENS` positions at a
time, reads keys and values in place from the reference backend's token-major cache
([num_blocks, block_size, KVH, D]), scores all query heads of its group at once and keeps an
online softmax (running max and sum, float32), so neither a gathered copy of the cache nor the
scores of a whole sequence are ever materialised. A sliding window starts the walk at the
window's first position.

Without a GPU, importing this module turns on Triton's interpreter (`TRITON_INTERPRET=1`,
unless set otherwise) so the same kernel runs on CPU tensors, slowly: that is how the tests check
it against the PyTorch reference on machines without CUDA.
"""

from __future__ import annotations

import logging
import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # read when a kernel is decorated below

import triton
import triton.language as tl

from inflight.attention.cpu_kernel import DecodeKernelBackend

logger = logging.getLogger(__name__)

# Positions scored per loop iteration (at least one block): bounds the [group, positions, dim]
# products a program holds at once.
MIN_TOKENS = 32


@triton.jit
def _paged_decode_kernel(
    q_ptr,  # [R, H, D]
    k_cache_ptr,  # [NB, BS, KVH, D]
    v_cache_ptr,
    block_tables_ptr,  # [R, MB] int
    seq_lens_ptr,  # [R] int
    out_ptr,  # [R, H, D]
    scale,
    window,  # 0: none
    max_blocks,
    num_kv_heads: tl.constexpr,
    group: tl.constexpr,  # query heads per KV head
    head_dim: tl.constexpr,
    block_size: tl.constexpr,
    GROUP_PAD: tl.constexpr,
    DIM_PAD: tl.constexpr,
    TOKENS: tl.constexpr,
):
    r = tl.program_id(0)
    kv_head = tl.program_id(1)
    seq_len = tl.load(seq_lens_ptr + r)
    first = tl.where(window > 0, tl.maximum(seq_len - window, 0), 0)

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
    kv_stride = num_kv_heads * head_dim  # between positions of a block
    start = (first // TOKENS) * TOKENS
    for n0 in range(start, seq_len, TOKENS):
        n = n0 + tl.arange(0, TOKENS)
        live = (n >= first) & (n < seq_len)
        block = tl.load(block_tables_ptr + r * max_blocks + n // block_size, mask=live, other=0).to(
            tl.int64
        )
        row = (block * block_size + n % block_size) * kv_stride + kv_head * head_dim
        kv_mask = live[:, None] & d_ok[None, :]
        k = tl.load(k_cache_ptr + row[:, None] + d[None, :], mask=kv_mask, other=0.0)
        v = tl.load(v_cache_ptr + row[:, None] + d[None, :], mask=kv_mask, other=0.0)
        # [GROUP_PAD, TOKENS]: every head of the group against every position
        scores = tl.sum(q[:, None, :] * k.to(tl.float32)[None, :, :], axis=2) * scale
        scores = tl.where(live[None, :], scores, float("-inf"))
        new_max = tl.maximum(running_max, tl.max(scores, axis=1))
        rescale = tl.exp(running_max - new_max)
        p = tl.exp(scores - new_max[:, None])
        running_sum = running_sum * rescale + tl.sum(p, axis=1)
        acc = acc * rescale[:, None] + tl.sum(p[:, :, None] * v.to(tl.float32)[None, :, :], axis=1)
        running_max = new_max

    out = acc / running_sum[:, None]
    tl.store(
        out_ptr + (r * num_kv_heads * group + heads)[:, None] * head_dim + d[None, :],
        out.to(out_ptr.dtype.element_ty),
        mask=g_ok[:, None] & d_ok[None, :],
    )


def check_block_size(block_size: int) -> None:
    """A loop iteration covers whole blocks, and Triton tiles come in powers of two."""
    if block_size < 1 or block_size & (block_size - 1):
        raise ValueError(
            f"the Triton decode kernel needs a power-of-two block_size, got {block_size}"
        )


def paged_decode_attention(
    q: torch.Tensor,  # [R, H, D]
    k_cache: torch.Tensor,  # [NB, BS, KVH, D]
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,  # [R, MB]
    seq_lens: torch.Tensor,  # [R], each >= 1
    scale: float,
    window: int = 0,
) -> torch.Tensor:
    """softmax(q k^T * scale) v for one query per request over its cached positions
    [max(0, seq_len - window), seq_len) (all of them when `window` is 0)."""
    num_reqs, num_heads, head_dim = q.shape
    _, block_size, num_kv_heads, cache_dim = k_cache.shape
    if cache_dim != head_dim or num_heads % num_kv_heads:
        raise ValueError(
            f"query heads {num_heads}x{head_dim} do not fit KV heads {num_kv_heads}x{cache_dim}"
        )
    check_block_size(block_size)
    out = torch.empty_like(q)
    if num_reqs == 0:
        return out
    group = num_heads // num_kv_heads
    _paged_decode_kernel[(num_reqs, num_kv_heads)](
        q.contiguous(), k_cache, v_cache, block_tables.contiguous(), seq_lens.contiguous(), out,
        scale, window, block_tables.shape[1],
        num_kv_heads=num_kv_heads, group=group, head_dim=head_dim, block_size=block_size,
        GROUP_PAD=triton.next_power_of_2(group), DIM_PAD=triton.next_power_of_2(head_dim),
        TOKENS=max(MIN_TOKENS, block_size),
    )  # fmt: skip
    return out


def runs_here() -> bool:
    """Whether the kernel can run in this process: on a GPU, or under the interpreter, which
    works only if Triton was first imported with `TRITON_INTERPRET=1` (its own library functions
    are wrapped for the interpreter at import)."""
    return torch.cuda.is_available() or not isinstance(tl.sum, triton.JITFunction)


class TritonBackend(DecodeKernelBackend):
    """The reference backend's cache layout and prompt path, with decodes by the Triton kernel."""

    name = "triton"

    def __init__(self, block_size: int, sliding_window: int | None = None) -> None:
        super().__init__(block_size, sliding_window)
        if not runs_here():
            raise RuntimeError(
                "no GPU, and Triton was imported before its interpreter was turned on: set "
                "TRITON_INTERPRET=1 before the process starts to run the Triton kernel on a CPU"
            )
        check_block_size(block_size)
        if not torch.cuda.is_available():
            logger.warning(
                "no GPU: the Triton decode kernel runs under Triton's interpreter (slow)"
            )
        self.decode_kernel = paged_decode_attention
