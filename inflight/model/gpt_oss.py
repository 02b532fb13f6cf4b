"""gpt-oss (`GptOssForCausalLM`), from HF folders: the Llama layer with three differences.

- **Attention**: q/k/v and output projections with biases, every other layer banded to
  `sliding_window` positions (`layer_types`), YaRN RoPE, and a learned sink logit per head in
  each softmax's denominator (`DecoderLayer.sinks`; every attention backend's kernels take it).
- **Router**: a biased linear whose best `experts_per_token` logits are softmaxed among
  themselves (the others' softmax weight is 0, not renormalized from a softmax over all); in a
  float32 model over blocks, the float32 router's `softmax_of_chosen` (`route_experts`).
- **Experts**: biased, each gate a clamped SwiGLU, `(clamp(up, +-limit) + 1) * g * sigmoid(alpha
  g)` with `g = min(gate, limit)`.

Checkpoints stack the experts: `mlp.experts.gate_up_proj` [E, hidden, 2I] with gate and up
columns interleaved, `down_proj` [E, I, hidden], each with a bias per expert; they load as one
`gate_up_proj` linear per expert, gate rows first, as the other expert families' do.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator

import torch
from torch import nn

from inflight.attention import AttentionBackend
from inflight.model.arch import LlamaArchConfig
from inflight.model.layer_ops import TorchLayerOps
from inflight.model.moe import MoEDecoderLayer, MoEModel


class GptOssDecoderLayer(MoEDecoderLayer):
    gate_scoring = "softmax_of_chosen"  # (`route_tokens`, as the float32 router names it)
    gate_bias = True

    def __init__(
        self, cfg: LlamaArchConfig, attn: AttentionBackend, ops: TorchLayerOps, index: int
    ) -> None:
        super().__init__(cfg, attn, ops, index)
        assert cfg.swiglu_limit is not None, "gpt-oss's experts clamp their gates"
        self.limit, self.alpha = cfg.swiglu_limit, cfg.swiglu_alpha
        self._kernel_extras: tuple[list[torch.Tensor], list[torch.Tensor], float, float] | None = (
            None
        )
        if not self.float32_router:
            self.gate = nn.Linear(cfg.hidden_size, cfg.num_experts, bias=True)
        for expert in self.experts:
            hidden, inter = cfg.hidden_size, cfg.expert_intermediate_size
            expert.gate_up_proj = nn.Linear(hidden, 2 * inter, bias=True)
            expert.down_proj = nn.Linear(inter, hidden, bias=True)

    def route_tokens(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        best, chosen = torch.topk(logits, self.top_k, dim=-1)  # [T, k]
        return torch.softmax(best, dim=-1, dtype=best.dtype), chosen

    def activation(self, gate_up: torch.Tensor) -> torch.Tensor:
        return self.ops.clamped_swiglu(gate_up, self.limit, self.alpha)

    def expert_kernel_extras(
        self,
    ) -> tuple[list[torch.Tensor], list[torch.Tensor], float, float]:
        """Its experts' biases (float32, as the kernel adds them) and the clamped SwiGLU's limit
        and alpha: from a file's blocks, a layer's experts in one C++ call. Listed once, after
        loading (the biases never change)."""
        if self._kernel_extras is not None:
            return self._kernel_extras
        gate_up = [e.gate_up_proj.bias.float() for e in self.experts]
        down = [e.down_proj.bias.float() for e in self.experts]
        extras = (gate_up, down, float(self.limit), float(self.alpha))
        if not any(b.is_meta for b in gate_up + down):  # (asked before loading: not kept)
            self._kernel_extras = extras
        return extras


class GptOssModel(MoEModel):
    layer_class = GptOssDecoderLayer

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        super().load_weights(_per_expert(weights))


_STACKED = re.compile(r"(.*\.mlp\.experts)\.(gate_up_proj|down_proj)(_bias)?")


def _per_expert(weights: Iterable[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
    """gpt-oss's names and stacked experts as the expert families load them: the router as
    `mlp.gate`, and each expert's `gate_up_proj` (gate rows, then up rows, de-interleaved and
    transposed to [out, in]) and `down_proj`, weight and bias."""
    for name, tensor in weights:
        name = name.replace(".mlp.router.", ".mlp.gate.")
        match = _STACKED.fullmatch(name)
        if match is None:
            yield name, tensor
            continue
        prefix, projection, bias = match.groups()
        for e, stacked in enumerate(tensor):
            part = stacked if bias else stacked.t()  # [out] or [out, in]
            if projection == "gate_up_proj":  # columns interleaved: gate, up, gate, up, ...
                part = torch.cat([part[0::2], part[1::2]])
            kind = "bias" if bias else "weight"
            yield f"{prefix}.{e}.{projection}.{kind}", part.contiguous()
