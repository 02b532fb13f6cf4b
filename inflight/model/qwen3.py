"""Qwen3: the Llama decoder with an RMSNorm over each query and key head, between the q/k/v
projection and RoPE (no q/k/v bias); a norm as wide as all heads (OLMo 2's) runs the same way.
HF names `self_attn.q_norm` / `k_norm`, GGUF `attn_q_norm` / `attn_k_norm`. The C++ layer loop
runs the same norms (`fused_layers.qk_norms`), tested bit for bit against this."""

from __future__ import annotations

import torch

from inflight.attention import AttentionBackend
from inflight.model.arch import LlamaArchConfig
from inflight.model.layer_ops import TorchLayerOps
from inflight.model.llama import DecoderLayer, LlamaModel, RMSNorm


class Qwen3DecoderLayer(DecoderLayer):
    """Llama's layer with q/k RMSNorms: one head wide, or as wide as all their heads where the
    family's are (`cfg.qk_norms_span_heads`: OLMo 2's, MiniMax-M2's)."""

    def __init__(
        self, cfg: LlamaArchConfig, attn: AttentionBackend, ops: TorchLayerOps, index: int
    ) -> None:
        super().__init__(cfg, attn, ops, index)
        q_size, kv_size = self.split[:2]
        wide = cfg.qk_norms_span_heads
        self.q_norm = RMSNorm(q_size if wide else cfg.head_dim, cfg.rms_norm_eps)
        self.k_norm = RMSNorm(kv_size if wide else cfg.head_dim, cfg.rms_norm_eps)

    def normalize_qk(self, qkv: torch.Tensor) -> torch.Tensor:
        t = qkv.shape[0]
        q_size, kv_size = self.split[:2]
        for start, size, norm in ((0, q_size, self.q_norm), (q_size, kv_size, self.k_norm)):
            width = norm.weight.shape[0]  # a head's (Qwen3), or all heads' (OLMo 2)
            rows = qkv[:, start : start + size].reshape(-1, width)  # [T * heads, D] or [T, size]
            normed = self.ops.rms_norm(rows, norm.weight, norm.eps)
            qkv[:, start : start + size] = normed.view(t, size)
        return qkv


class Qwen3Model(LlamaModel):
    layer_class = Qwen3DecoderLayer
