"""The token-major cache's rows in Triton: read back (`load_kv_rows`, for the decode and prompt
kernels) and, for an 8-bit cache, written (`write_scaled_rows`): each row of D keys or values
scaled by its largest |x|, rounded to int8 or float8 e4m3, its float32 scale in the 4 bytes
after it. The write rounds exactly as `backend.quantize_rows` does (IEEE division, ties to
even), in one launch per layer instead of that function's chain of PyTorch ops.
"""

from __future__ import annotations

import torch

from inflight.attention.triton_runtime import tl, triton

# 1.5 * 2^23: adding it and taking it away again rounds a float32 of magnitude < 2^22 to an
# integer, ties to even (the rounding mode of IEEE addition)
_ROUND = tl.constexpr(12582912.0)


@triton.jit
def load_kv_rows(
    cache_ptr,
    slot,  # [N] first element of each position's row for the head
    d,  # [DIM_PAD]
    row_ok,  # [N]
    head_dim: tl.constexpr,
    SCALED: tl.constexpr,  # an 8-bit cache: each row's float32 scale in the 4 bytes after it
):
    """Rows of keys or values from the token-major cache: as stored, or for an 8-bit cache
    widened to float32 and scaled (int8 or float8 e4m3, as the cache tensor's dtype says)."""
    x = tl.load(
        cache_ptr + slot[:, None] + d[None, :],
        mask=row_ok[:, None] & (d < head_dim)[None, :],
        other=0.0,
    )
    if SCALED:
        b = tl.arange(0, 4)
        raw = tl.load(cache_ptr + slot[:, None] + head_dim + b[None, :], mask=row_ok[:, None],
                      other=0.0)  # fmt: skip
        raw = raw.to(tl.uint8, bitcast=True).to(tl.uint32)
        scale = tl.sum(raw << (8 * b)[None, :].to(tl.uint32), axis=1).to(tl.float32, bitcast=True)
        x = x.to(tl.float32) * scale[:, None]
    return x


@triton.jit
def _to_e4m3_bits(y):
    """float32 (|y| <= 448) -> float8 e4m3 bits, rounded to nearest even, by integer arithmetic:
    the interpreter's own conversion drops a mantissa's carry into the exponent (31.9 -> 16)."""
    a = tl.abs(y)
    sign = (y.to(tl.uint32, bitcast=True) >> 24) & 0x80
    bits = a.to(tl.uint32, bitcast=True)
    # normals: float32's exponent and top 3 mantissa bits, rounded (a carry moves the exponent)
    normal = ((bits + 0x7FFFF + ((bits >> 20) & 1)) >> 20) - (120 << 3)
    subnormal = ((a * 512.0 + _ROUND) - _ROUND).to(tl.uint32)  # steps of 2^-9; 8 is 2^-6
    return (tl.where(a < 0.015625, subnormal, normal) | sign).to(tl.uint8)


@triton.jit
def _write_scaled_kernel(
    key_ptr,  # [T, KVH, D], rows `key_stride` apart, heads contiguous
    value_ptr,
    k_cache_ptr,  # [NB, BS, KVH, D + 4], int8 or float8 e4m3
    v_cache_ptr,
    slots_ptr,  # [T]
    key_stride,
    value_stride,
    num_kv_heads: tl.constexpr,
    head_dim: tl.constexpr,
    DIM_PAD: tl.constexpr,
    INT8: tl.constexpr,
):
    t = tl.program_id(0)
    h = tl.program_id(1)
    d = tl.arange(0, DIM_PAD)
    ok = d < head_dim
    b = tl.arange(0, 4)
    slot = tl.load(slots_ptr + t).to(tl.int64)
    offset = (slot * num_kv_heads + h) * (head_dim + 4)
    for which in tl.static_range(2):
        if which == 0:
            src, stride, cache = key_ptr, key_stride, k_cache_ptr
        else:
            src, stride, cache = value_ptr, value_stride, v_cache_ptr
        x = tl.load(src + t * stride + h * head_dim + d, mask=ok, other=0.0).to(tl.float32)
        scale = tl.math.div_rn(tl.max(tl.abs(x), axis=0), 127.0 if INT8 else 448.0)
        y = tl.where(scale > 0, tl.math.div_rn(x, scale), 0.0)  # a row of zeros: 0, not NaN
        scale_bytes = (scale.to(tl.uint32, bitcast=True) >> (8 * b).to(tl.uint32)) & 0xFF
        if INT8:
            y = tl.minimum(tl.maximum((y + _ROUND) - _ROUND, -127.0), 127.0)
            stored = y.to(tl.int8)
            scale_bytes = scale_bytes.to(tl.uint8).to(tl.int8, bitcast=True)
        else:
            stored = _to_e4m3_bits(y).to(tl.float8e4nv, bitcast=True)
            scale_bytes = scale_bytes.to(tl.uint8).to(tl.float8e4nv, bitcast=True)
        tl.store(cache + offset + d, stored, mask=ok)
        tl.store(cache + offset + head_dim + b, scale_bytes)


def write_scaled_rows(
    k_cache: torch.Tensor,  # [NB, BS, KVH, D + 4], int8 or float8 e4m3
    v_cache: torch.Tensor,
    key: torch.Tensor,  # [T, KVH, D], heads contiguous
    value: torch.Tensor,
    slot_mapping: torch.Tensor,  # [T]
) -> None:
    """`backend.write_token_major` for an 8-bit cache, in one launch."""
    num_tokens, num_kv_heads, head_dim = key.shape
    if num_tokens == 0:
        return
    for rows in (key, value):
        if rows.stride(2) != 1 or rows.stride(1) != head_dim:
            raise ValueError("the cache write needs [T, KVH, D] rows with contiguous heads")
    _write_scaled_kernel[(num_tokens, num_kv_heads)](
        key, value, k_cache, v_cache, slot_mapping, key.stride(0), value.stride(0),
        num_kv_heads=num_kv_heads, head_dim=head_dim,
        DIM_PAD=triton.next_power_of_2(head_dim), INT8=k_cache.dtype == torch.int8,
    )  # fmt: skip
