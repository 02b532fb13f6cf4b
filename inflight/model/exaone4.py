"""EXAONE 4 (`Exaone4ForCausalLM`, GGUF `exaone4`): Qwen3's layer (per-head q/k RMSNorm) with its
norms moved to the outputs: nothing normalizes what attention and the MLP read; each one's output
is normalized (`post_attention_layernorm`, `post_feedforward_layernorm`) before it joins the
residual stream (`DecoderLayer.pre_norms`, `output_norms`). Where the model has a sliding window
(the 32B), three windowed layers with RoPE to each global one without (NoPE: `arch.nope_layers`).
The C++ layer loop runs the same, tested bit for bit against this."""

from __future__ import annotations

from typing import ClassVar

from inflight.attention import AttentionBackend
from inflight.model.arch import LlamaArchConfig
from inflight.model.layer_ops import TorchLayerOps
from inflight.model.llama import DecoderLayer, RMSNorm
from inflight.model.qwen3 import Qwen3DecoderLayer, Qwen3Model


class Exaone4DecoderLayer(Qwen3DecoderLayer):
    pre_norms = False

    def __init__(
        self, cfg: LlamaArchConfig, attn: AttentionBackend, ops: TorchLayerOps, index: int
    ) -> None:
        super().__init__(cfg, attn, ops, index)
        del self.input_layernorm  # (the checkpoint has none)
        self.post_feedforward_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    @property
    def output_norms(self) -> tuple[RMSNorm, RMSNorm]:
        return self.post_attention_layernorm, self.post_feedforward_layernorm


class Exaone4Model(Qwen3Model):
    layer_class: ClassVar[type[DecoderLayer]] = Exaone4DecoderLayer
