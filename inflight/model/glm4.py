"""GLM-4 (`Glm4ForCausalLM`, GGUF `glm4`): the Llama decoder with Gemma's four norms a layer
(before and after attention and the MLP; plain `w`, SiLU), q/k/v biases, gate and up fused in
the checkpoint (as Phi-3's), and RoPE in interleaved pairs over half of each head, reordered at
load into the halves the engine rotates (`rotary_pairs.py`)."""

from __future__ import annotations

from typing import ClassVar

from inflight.attention import AttentionBackend
from inflight.model.arch import LlamaArchConfig
from inflight.model.layer_ops import TorchLayerOps
from inflight.model.llama import DecoderLayer, LlamaModel, RMSNorm
from inflight.model.rotary_pairs import PairRotaryModel


class Glm4DecoderLayer(DecoderLayer):
    def __init__(
        self, cfg: LlamaArchConfig, attn: AttentionBackend, ops: TorchLayerOps, index: int
    ) -> None:
        super().__init__(cfg, attn, ops, index)  # (its post_attention_layernorm: the pre-MLP)
        self.post_self_attn_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_mlp_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    @property
    def output_norms(self) -> tuple[RMSNorm, RMSNorm]:
        return self.post_self_attn_layernorm, self.post_mlp_layernorm


class Glm4Model(PairRotaryModel):
    layer_class: ClassVar[type[DecoderLayer]] = Glm4DecoderLayer
    _PROJECTIONS: ClassVar[dict[str, tuple[str, tuple[str, ...]]]] = {
        **LlamaModel._PROJECTIONS,
        "gate_up_proj": ("mlp", ("gate_up_proj",)),
    }
