"""Arcee (AFM, `ArceeForCausalLM`, GGUF `arcee`): the Llama decoder whose MLP has no gate: up,
ReLU squared, down (`DecoderLayer.squared_relu`; its `gate_up_proj` holds up's rows alone).
The C++ layer loop runs the same activation."""

from __future__ import annotations

from typing import ClassVar

from torch import nn

from inflight.attention import AttentionBackend
from inflight.model.arch import LlamaArchConfig
from inflight.model.layer_ops import TorchLayerOps
from inflight.model.llama import DecoderLayer, LlamaModel


class ArceeDecoderLayer(DecoderLayer):
    squared_relu = True

    def __init__(
        self, cfg: LlamaArchConfig, attn: AttentionBackend, ops: TorchLayerOps, index: int
    ) -> None:
        super().__init__(cfg, attn, ops, index)
        self.gate_up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)


class ArceeModel(LlamaModel):
    layer_class: ClassVar[type[DecoderLayer]] = ArceeDecoderLayer
    _PROJECTIONS: ClassVar[dict[str, tuple[str, tuple[str, ...]]]] = {
        **LlamaModel._PROJECTIONS,
        "gate_up_proj": ("mlp", ("up_proj",)),
    }
