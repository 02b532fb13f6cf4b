"""OLMo 2 (`Olmo2ForCausalLM`, GGUF `olmo2`): EXAONE 4's layer (norms of the sublayers' outputs
alone) with its query and key norms each as wide as all their heads, not one head: each token's
queries are normalized together, then its keys. A norm over every head cannot be split between
tensor-parallel ranks that each hold some of them, so such a model runs on one
(`parallel/shard.py`). OLMo 3 (`Olmo3ForCausalLM`, an `olmo2` file with a window) has the same
layers, three windowed with an unscaled RoPE of their own to each global one: config fields."""

from __future__ import annotations

from typing import ClassVar

from inflight.attention import AttentionBackend
from inflight.model.arch import LlamaArchConfig
from inflight.model.exaone4 import Exaone4DecoderLayer, Exaone4Model
from inflight.model.layer_ops import TorchLayerOps
from inflight.model.llama import DecoderLayer, RMSNorm


class Olmo2DecoderLayer(Exaone4DecoderLayer):
    def __init__(
        self, cfg: LlamaArchConfig, attn: AttentionBackend, ops: TorchLayerOps, index: int
    ) -> None:
        super().__init__(cfg, attn, ops, index)
        q_size, kv_size, _ = self.split
        self.q_norm = RMSNorm(q_size, cfg.rms_norm_eps)
        self.k_norm = RMSNorm(kv_size, cfg.rms_norm_eps)


class Olmo2Model(Exaone4Model):
    layer_class: ClassVar[type[DecoderLayer]] = Olmo2DecoderLayer
