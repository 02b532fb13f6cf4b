"""Gemma (`GemmaForCausalLM`, GGUF `gemma`), Gemma 2 (`Gemma2ForCausalLM`, GGUF `gemma2`) and
Gemma 3 text (`Gemma3ForCausalLM`, or the language model of a `Gemma3ForConditionalGeneration`
folder; GGUF `gemma3`): the Llama layer (Gemma 3's with Qwen3's per-head q/k RMSNorm) with
Gemma's own parts (Gemma's: the `1 + w` norms, the tanh-GELU MLP and the scaled embeddings):

- every RMSNorm multiplies by `1 + w` (checkpoints hold w; `load_weights` adds the 1, in float32
  as transformers does, so the layer ops stay the plain RMSNorm);
- norms of the attention's and the MLP's outputs as well as of their inputs (four per layer),
  the residual added after the output norms;
- a tanh-GELU gated MLP;
- embeddings scaled by sqrt(hidden_size) (rounded to the model's dtype first, as transformers
  does), the tied LM head reading them unscaled;
- windowed and global layers (Gemma 2's every other one global, Gemma 3's every sixth, with
  their own RoPE base), the scores scaled by `query_pre_attn_scalar ** -0.5`, and Gemma 2's
  soft caps of attention scores and of logits: config fields (`arch.py`) the Llama layer and
  the attention backends honour.

Each of these is a hook of the Llama layer (`gelu`, `mlp_norm`, `output_norms`) that the C++
layer loop runs too.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import ClassVar

import torch

from inflight.attention import AttentionBackend
from inflight.model.arch import LlamaArchConfig
from inflight.model.layer_ops import TorchLayerOps
from inflight.model.llama import DecoderLayer, LlamaModel, RMSNorm
from inflight.model.qwen3 import Qwen3DecoderLayer, Qwen3Model


class Gemma2DecoderLayer(DecoderLayer):
    gelu = True

    def __init__(
        self, cfg: LlamaArchConfig, attn: AttentionBackend, ops: TorchLayerOps, index: int
    ) -> None:
        super().__init__(cfg, attn, ops, index)
        self.pre_feedforward_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_feedforward_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    @property
    def mlp_norm(self) -> RMSNorm:
        return self.pre_feedforward_layernorm

    @property
    def output_norms(self) -> tuple[RMSNorm, RMSNorm]:
        return self.post_attention_layernorm, self.post_feedforward_layernorm


class GemmaDecoderLayer(DecoderLayer):
    """Gemma's layer: Llama's, its norms before the sublayers alone, with a tanh-GELU MLP."""

    gelu = True


class Gemma3DecoderLayer(Gemma2DecoderLayer, Qwen3DecoderLayer):
    """Gemma 2's layer with Qwen3's per-head q/k norms."""


class Gemma2Model(LlamaModel):
    layer_class: ClassVar[type[DecoderLayer]] = Gemma2DecoderLayer

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        hidden = self.lookup(input_ids)
        # a Python number of the dtype's value: no host-to-device copy (CUDA graphs capture this)
        return hidden * float(torch.tensor(self.cfg.hidden_size**0.5).to(hidden.dtype))

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        super().load_weights(offset_norms(weights))


class GemmaModel(Gemma2Model):
    layer_class = GemmaDecoderLayer


class Gemma3Model(Gemma2Model, Qwen3Model):
    layer_class = Gemma3DecoderLayer


def offset_norms(
    weights: Iterable[tuple[str, torch.Tensor]], unless: str | None = None
) -> Iterator[tuple[str, torch.Tensor]]:
    """Each RMSNorm's w as the 1 + w it multiplies by (but those named `unless`, a suffix)."""
    for name, tensor in weights:
        offset = name.endswith("norm.weight") and not (unless and name.endswith(unless))
        yield name, (1.0 + tensor.float()) if offset else tensor
