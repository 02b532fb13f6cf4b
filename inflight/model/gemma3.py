"""Gemma 3 text (`Gemma3ForCausalLM`; GGUF `gemma3`): the Qwen3 layer (per-head q/k RMSNorm)
with Gemma's own parts:

- every RMSNorm multiplies by `1 + w` (checkpoints hold w; `load_weights` adds the 1, in float32
  as transformers does, so the layer ops stay the plain RMSNorm);
- norms after attention and after the MLP as well as before each (four per layer), the residual
  added after the post-norms;
- a tanh-GELU gated MLP;
- embeddings scaled by sqrt(hidden_size) (rounded to the model's dtype first, as transformers
  does), the tied LM head reading them unscaled;
- windowed layers with their own RoPE base, every sixth layer global, and the scores scaled by
  `query_pre_attn_scalar ** -0.5`: config fields (`arch.py`) the Llama layer already honours.

Soft-capping (Gemma 2) is refused by `arch.py`. The C++ layer loop does not run these layers.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import torch

from inflight.attention import AttentionBackend
from inflight.model.arch import LlamaArchConfig
from inflight.model.layer_ops import TorchLayerOps
from inflight.model.llama import RMSNorm, decode_rows
from inflight.model.packed_linear import apply_linear
from inflight.model.qwen3 import Qwen3DecoderLayer, Qwen3Model


class Gemma3DecoderLayer(Qwen3DecoderLayer):
    def __init__(
        self, cfg: LlamaArchConfig, attn: AttentionBackend, ops: TorchLayerOps, index: int
    ) -> None:
        super().__init__(cfg, attn, ops, index)
        self.pre_feedforward_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_feedforward_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(
        self,
        hidden: torch.Tensor,
        residual: torch.Tensor | None,
        cos: torch.Tensor,
        sin: torch.Tensor,
        kv_cache: tuple[torch.Tensor, torch.Tensor],
        meta: Any,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """As the Llama layer's: (post-normed MLP output, the residual it is to be added to)."""
        t, ops = hidden.shape[0], self.ops
        decodes = decode_rows(meta)
        norm = self.input_layernorm
        if residual is None:
            residual = hidden
            x = ops.rms_norm(hidden, norm.weight, norm.eps)
        else:
            x = ops.add_rms_norm(hidden, residual, norm.weight, norm.eps)
        qkv = self.normalize_qk(apply_linear(self.qkv_proj, x, decodes))
        ops.rope_(qkv, cos, sin, self.num_heads + self.num_kv_heads, self.head_dim)
        q, k, v = qkv.split(self.split, dim=-1)
        attn = self.attn.forward(
            q.view(t, self.num_heads, self.head_dim),
            k.view(t, self.num_kv_heads, self.head_dim),
            v.view(t, self.num_kv_heads, self.head_dim),
            kv_cache[0],
            kv_cache[1],
            meta,
            self.window,
            self.scale,
        )
        x = apply_linear(self.o_proj, attn.reshape(t, -1), decodes)
        norm = self.post_attention_layernorm
        x = ops.rms_norm(x, norm.weight, norm.eps)
        norm = self.pre_feedforward_layernorm
        x = ops.add_rms_norm(x, residual, norm.weight, norm.eps)
        x = ops.gelu_tanh_and_mul(apply_linear(self.gate_up_proj, x, decodes))
        x = apply_linear(self.down_proj, x, decodes)
        norm = self.post_feedforward_layernorm
        return ops.rms_norm(x, norm.weight, norm.eps), residual


class Gemma3Model(Qwen3Model):
    layer_class = Gemma3DecoderLayer
    fusable = False

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        hidden = self.embed_tokens(input_ids)
        # a Python number of the dtype's value: no host-to-device copy (CUDA graphs capture this)
        return hidden * float(torch.tensor(self.cfg.hidden_size**0.5).to(hidden.dtype))

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        super().load_weights(_offset_norms(weights))


def _offset_norms(
    weights: Iterable[tuple[str, torch.Tensor]],
) -> Iterator[tuple[str, torch.Tensor]]:
    """Each RMSNorm's w as the 1 + w it multiplies by."""
    for name, tensor in weights:
        yield name, (1.0 + tensor.float()) if name.endswith("norm.weight") else tensor
