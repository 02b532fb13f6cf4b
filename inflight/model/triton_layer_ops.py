"""The element-wise parts of a decoder layer as Triton kernels, for GPUs: one kernel each where
PyTorch runs 3-8 (RMSNorm with its residual add, RoPE, SiLU-and-mul).

Why: a decode step of a small model is mostly tiny kernels (~33 a layer in PyTorch's op
sequence), far more time than its weights take to read, and each costs host time when eager. These
kernels round where `TorchLayerOps` (Hugging Face's op sequence) rounds: to the storage dtype
after every op, float32 in between, so results match it up to float32 summation order.

Triton may not compile on every GPU it imports on: `checked_layer_ops` runs each kernel once
against `TorchLayerOps` on the target device and falls back to it, with a warning, if a kernel
fails or disagrees.
"""

from __future__ import annotations

import logging

import torch

from inflight.attention.triton_runtime import tl, triton
from inflight.model.layer_ops import TorchLayerOps

logger = logging.getLogger(__name__)


@triton.jit
def _round(x, dtype: tl.constexpr):
    """float32 x rounded to `dtype` (to nearest, ties to even, as PyTorch rounds), back in
    float32. bfloat16 by bit arithmetic: Triton's interpreter truncates in `.to(bfloat16)`, so
    the tests on CPUs would see another rounding than the GPU's. (NaN is not preserved.)"""
    if dtype == tl.bfloat16:
        bits = x.to(tl.uint32, bitcast=True)
        bits = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16  # no 32-bit literal
        return bits.to(tl.float32, bitcast=True)
    elif dtype == tl.float16:
        return x.to(tl.float16).to(tl.float32)
    else:
        return x


@triton.jit(do_not_specialize=["eps"])
def _rms_norm_kernel(
    x_ptr, x_stride, residual_ptr, weight_ptr, out_ptr, size, eps,
    ADD_RESIDUAL: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    """One row: optionally residual += x (in place, rounded), then the RMSNorm of the result."""
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    ok = cols < size
    dtype = out_ptr.dtype.element_ty
    x = tl.load(x_ptr + row * x_stride + cols, mask=ok, other=0.0).to(tl.float32)
    if ADD_RESIDUAL:
        x = _round(x + tl.load(residual_ptr + row * size + cols, mask=ok).to(tl.float32), dtype)
        tl.store(residual_ptr + row * size + cols, x.to(dtype), mask=ok)
    inv_rms = tl.rsqrt(tl.sum(x * x, axis=0) / size + eps)
    normed = _round(x * inv_rms, dtype)
    weight = tl.load(weight_ptr + cols, mask=ok).to(tl.float32)
    tl.store(out_ptr + row * size + cols, _round(weight * normed, dtype).to(dtype), mask=ok)


@triton.jit
def _silu_and_mul_kernel(gate_up_ptr, out_ptr, size, BLOCK: tl.constexpr):
    """[T, 2I] rows [gate | up] -> silu(gate) * up, [T, I]; program (row, column block)."""
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = cols < size
    dtype = out_ptr.dtype.element_ty
    gate = tl.load(gate_up_ptr + row * 2 * size + cols, mask=ok).to(tl.float32)
    up = tl.load(gate_up_ptr + row * 2 * size + size + cols, mask=ok).to(tl.float32)
    silu = _round(gate / (1.0 + tl.exp(-gate)), dtype)
    tl.store(out_ptr + row * size + cols, _round(silu * up, dtype).to(dtype), mask=ok)


@triton.jit
def _rope_kernel(
    x_ptr, x_stride, cos_ptr, sin_ptr, num_heads,
    HEAD_DIM: tl.constexpr, HALF: tl.constexpr, HALF_PAD: tl.constexpr, HEADS_PAD: tl.constexpr,
):  # fmt: skip
    """Rotates the first 2 HALF dimensions of every head of one token in place (rotate-half
    layout); one program per token."""
    token = tl.program_id(0)
    h = tl.arange(0, HEADS_PAD)[:, None]
    d = tl.arange(0, HALF_PAD)[None, :]
    ok = (h < num_heads) & (d < HALF)
    dtype = x_ptr.dtype.element_ty
    first_half = x_ptr + token * x_stride + h * HEAD_DIM + d  # [heads, half]
    x1 = tl.load(first_half, mask=ok).to(tl.float32)
    x2 = tl.load(first_half + HALF, mask=ok).to(tl.float32)
    cos = tl.load(cos_ptr + token * HALF + d, mask=d < HALF).to(tl.float32)
    sin = tl.load(sin_ptr + token * HALF + d, mask=d < HALF).to(tl.float32)
    first = _round(x1 * cos, dtype) - _round(x2 * sin, dtype)
    second = _round(x2 * cos, dtype) + _round(x1 * sin, dtype)
    tl.store(first_half, _round(first, dtype).to(dtype), mask=ok)
    tl.store(first_half + HALF, _round(second, dtype).to(dtype), mask=ok)


class TritonLayerOps(TorchLayerOps):
    name = "triton"

    def _norm(self, x, residual, weight, eps) -> torch.Tensor:
        rows, size = x.shape
        if weight.shape != (size,) or weight.dtype != x.dtype:
            raise ValueError(f"weight {tuple(weight.shape)} {weight.dtype} for rows of {size}")
        if residual is not None and (residual.shape != x.shape or residual.dtype != x.dtype):
            raise ValueError(f"residual {tuple(residual.shape)} for x {tuple(x.shape)}")
        if x.stride(1) != 1:
            x = x.contiguous()
        out = torch.empty((rows, size), dtype=x.dtype, device=x.device)
        if rows:
            _rms_norm_kernel[(rows,)](
                x, x.stride(0), x if residual is None else residual, weight, out, size, eps,
                ADD_RESIDUAL=residual is not None, BLOCK=triton.next_power_of_2(size),
            )  # fmt: skip
        return out

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        return self._norm(x, None, weight, eps)

    def add_rms_norm(
        self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
    ) -> torch.Tensor:
        if not residual.is_contiguous():
            raise ValueError("the residual stream must be contiguous (it is updated in place)")
        return self._norm(x, residual, weight, eps)

    def silu_and_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        if gate_up.shape[-1] % 2:
            raise ValueError(f"gate_up rows must hold [gate | up], got {gate_up.shape[-1]} wide")
        gate_up = gate_up.contiguous()
        rows, size = gate_up.shape[0], gate_up.shape[1] // 2
        out = torch.empty((rows, size), dtype=gate_up.dtype, device=gate_up.device)
        block = min(1024, triton.next_power_of_2(size))
        if rows:
            _silu_and_mul_kernel[(rows, triton.cdiv(size, block))](gate_up, out, size, BLOCK=block)
        return out

    def rope_(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, num_heads: int, head_dim: int
    ) -> None:
        if x.stride(1) != 1:
            raise ValueError("rope_ rotates rows in place: their elements must be contiguous")
        half = cos.shape[-1]  # of the rotated dimensions (fewer than head_dim: partial)
        shapes_agree = cos.shape == (x.shape[0], half) and sin.shape == cos.shape
        if not shapes_agree or not 0 < 2 * half <= head_dim:
            raise ValueError(f"cos/sin {tuple(cos.shape)} for {x.shape[0]} rows of heads of "
                             f"{head_dim}")  # fmt: skip
        if x.shape[1] < num_heads * head_dim:
            raise ValueError(f"rows of {x.shape[1]} hold fewer than {num_heads} heads")
        if x.shape[0]:
            _rope_kernel[(x.shape[0],)](
                x, x.stride(0), cos.contiguous(), sin.contiguous(), num_heads,
                HEAD_DIM=head_dim, HALF=half, HALF_PAD=triton.next_power_of_2(half),
                HEADS_PAD=triton.next_power_of_2(num_heads),
            )  # fmt: skip


def checked_layer_ops(device: torch.device, dtype: torch.dtype) -> TorchLayerOps:
    """`TritonLayerOps` if its kernels run on `device` and agree with `TorchLayerOps` on a small
    random layer's worth of inputs, else `TorchLayerOps` with a warning."""
    ref, fast = TorchLayerOps(), TritonLayerOps()
    gen = torch.Generator().manual_seed(0)

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen).to(device=device, dtype=dtype)

    try:
        x, residual, weight = rand(3, 64), rand(3, 64), rand(64)
        cos, sin, qkv = rand(3, 8), rand(3, 8), rand(3, 4 * 16)
        gate_up = rand(3, 2 * 32)
        checks = [
            (fast.rms_norm(x, weight, 1e-5), ref.rms_norm(x, weight, 1e-5)),
            (fast.add_rms_norm(x, residual.clone(), weight, 1e-5),
             ref.add_rms_norm(x, residual.clone(), weight, 1e-5)),
            (fast.silu_and_mul(gate_up), ref.silu_and_mul(gate_up)),
        ]  # fmt: skip
        rotated, want = qkv.clone(), qkv.clone()
        fast.rope_(rotated, cos, sin, 3, 16)
        ref.rope_(want, cos, sin, 3, 16)
        checks.append((rotated, want))
        tol = 1e-5 if dtype == torch.float32 else 2e-2
        for got, expected in checks:
            torch.testing.assert_close(got, expected, rtol=tol, atol=tol)
    except Exception as e:  # a compiler or driver refusing the kernels, or a wrong result
        logger.warning("Triton layer ops unavailable (%s); using PyTorch's", e)
        return ref
    return fast
