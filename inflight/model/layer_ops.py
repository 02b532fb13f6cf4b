"""The element-wise parts of a decoder layer: RMSNorm (with the residual add fused in), RoPE,
SiLU-and-mul (and gpt-oss's clamped SwiGLU) and the short causal convolution of state-carrying
layers (LFM2's, Qwen3.5's), as one interface with two implementations (tanh-GELU-and-mul,
Gemma's, is PyTorch's in both).

`TorchLayerOps` is Hugging Face's op sequence in PyTorch (any device) and the oracle;
`CpuLayerOps` runs the fused C++ kernels of `inflight.kernels`, which round where PyTorch rounds:
one pass over memory instead of 5-8 ops and their temporaries, which at decode batch sizes cost
more in dispatch than in arithmetic (~45 ops per layer, 30 layers, every step).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from inflight.kernels import load_extension


class TorchLayerOps:
    name = "torch"

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        # NOTE: normalise in float32 and multiply by the weight after casting back, as HF does.
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
        return weight * x.to(dtype)

    def add_rms_norm(
        self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
    ) -> torch.Tensor:
        """`residual += x` in place (the residual stream), then the RMSNorm of the sum."""
        residual.add_(x)
        return self.rms_norm(residual, weight, eps)

    def silu_and_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        """[T, 2I] rows laid out [gate | up] -> silu(gate) * up, [T, I]."""
        gate, up = gate_up.chunk(2, dim=-1)
        return F.silu(gate) * up

    def gelu_tanh_and_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        """[T, 2I] rows laid out [gate | up] -> gelu(gate) (tanh approximation) * up, [T, I]."""
        gate, up = gate_up.chunk(2, dim=-1)
        return F.gelu(gate, approximate="tanh") * up

    def clamped_swiglu(self, gate_up: torch.Tensor, limit: float, alpha: float) -> torch.Tensor:
        """gpt-oss's expert activation: [T, 2I] rows [gate | up] -> (clamp(up, +-limit) + 1) *
        g * sigmoid(alpha g), g = min(gate, limit), [T, I]."""
        gate, up = gate_up.chunk(2, dim=-1)
        gate, up = gate.clamp(max=limit), up.clamp(-limit, limit)
        return (up + 1) * (gate * torch.sigmoid(gate * alpha))

    def rope_(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, num_heads: int, head_dim: int
    ) -> None:
        """Rotates, in place, the first `num_heads` heads of each row of x [T, >= heads * D]
        (HF's rotate-half layout); cos/sin [T, R/2] in x's dtype: the first R <= D dimensions
        of each head rotate (R < D: partial rotary embeddings), the rest pass through."""
        heads = x[:, : num_heads * head_dim].view(x.shape[0], num_heads, head_dim)
        rotated = heads[..., : 2 * cos.shape[-1]]
        x1, x2 = rotated.chunk(2, dim=-1)
        cos, sin = cos[:, None, :], sin[:, None, :]
        rotated.copy_(torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1))

    def short_convolution(
        self, x: torch.Tensor, weight: torch.Tensor, state: torch.Tensor, step: Any
    ) -> torch.Tensor:
        """A causal depthwise convolution [T, H] of each request's rows of `x` [T, H] with
        `weight` [H, kernel], the request's inputs before this step read from `state` (one of
        `step.states`, rows chosen by `step`, a `runner.conv_state.ConvStep`); the step's last
        inputs are written back for the next. The taps are summed oldest first, as
        transformers' `conv1d` sums them (LFM2's convolutions, Qwen3.5's DeltaNet inputs)."""
        back = weight.shape[1] - 1
        prev = state[step.read_rows].reshape(-1, x.shape[1]).to(x.dtype)  # [R * back, H]
        table = torch.cat([x, prev])
        out = table[step.taps[0]] * weight[:, 0]
        for k in range(1, back + 1):
            out += table[step.taps[k]] * weight[:, k]
        state[step.write_rows] = table[step.keep].view(-1, back, x.shape[1]).to(state.dtype)
        if step.snapshot_rows.numel():  # the state after a speculating request's tokens
            tokens = (step.snapshot_rows >= 0).nonzero().squeeze(1)
            after = step.taps[1:, tokens].T  # [n, back]: each one's last inputs, oldest first
            state[step.snapshot_rows[tokens]] = table[after].to(state.dtype)
        return out


class CpuLayerOps(TorchLayerOps):
    name = "cpu"

    def __init__(self) -> None:
        self.ext = load_extension()

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        return self.ext.rms_norm(x, weight, eps)

    def add_rms_norm(
        self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
    ) -> torch.Tensor:
        return self.ext.add_rms_norm(x, residual, weight, eps)

    def silu_and_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        return self.ext.silu_and_mul(gate_up)

    def clamped_swiglu(self, gate_up: torch.Tensor, limit: float, alpha: float) -> torch.Tensor:
        # (each row alone: ATen's sigmoid over [T, I] rounds an element by whether it falls
        # in a vector lane or the scalar tail, which moves with T when I is not a multiple of 32)
        return self.ext.clamped_swiglu(gate_up, limit, alpha)

    def rope_(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, num_heads: int, head_dim: int
    ) -> None:
        self.ext.rope_(x, cos, sin, num_heads, head_dim)

    def short_convolution(
        self, x: torch.Tensor, weight: torch.Tensor, state: torch.Tensor, step: Any
    ) -> torch.Tensor:
        if x.dtype != weight.dtype or x.dtype not in (torch.float32, torch.bfloat16):
            return super().short_convolution(x, weight, state, step)  # PyTorch's promotions
        return self.ext.short_convolution(x, weight, state, step.taps, step.keep, step.read_rows,
                                          step.write_rows, step.snapshot_rows)  # fmt: skip
