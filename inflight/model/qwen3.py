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
    family's are (`cfg.qk_norms_span_heads`: OLMo 2's, MiniMax-M2's). Split over ranks, such a
    norm spans the whole model's heads (`cfg.qk_norm_heads`): each rank's rows are gathered
    with the others' and normalized whole, as one rank would, and the rank keeps its own."""

    def __init__(
        self, cfg: LlamaArchConfig, attn: AttentionBackend, ops: TorchLayerOps, index: int
    ) -> None:
        super().__init__(cfg, attn, ops, index)
        heads, kv_heads = 1, 1  # (a head's norm)
        if cfg.qk_norms_span_heads:
            heads, kv_heads = cfg.qk_norm_heads if cfg.qk_norm_heads[0] else (
                cfg.num_heads, cfg.num_kv_heads)  # fmt: skip
        self.q_norm = RMSNorm(heads * cfg.head_dim, cfg.rms_norm_eps)
        self.k_norm = RMSNorm(kv_heads * cfg.head_dim, cfg.rms_norm_eps)
        self.norm_heads = cfg.qk_norm_heads

    def normalize_qk(self, qkv: torch.Tensor) -> torch.Tensor:
        t = qkv.shape[0]
        q_size, kv_size = self.split[:2]
        for start, size, norm in ((0, q_size, self.q_norm), (q_size, kv_size, self.k_norm)):
            width = norm.weight.shape[0]  # a head's (Qwen3), all heads' (OLMo 2), the model's
            own = qkv[:, start : start + size]
            if width > size:  # (a rank's share of a norm over the whole model's heads)
                qkv[:, start : start + size] = self._normalize_whole(own, norm, start == 0)
                continue
            rows = own.reshape(-1, width)  # [T * heads, D] or [T, size]
            normed = self.ops.rms_norm(rows, norm.weight, norm.eps)
            qkv[:, start : start + size] = normed.view(t, size)
        return qkv

    def _normalize_whole(self, own: torch.Tensor, norm: RMSNorm, queries: bool) -> torch.Tensor:
        """This rank's columns of the norm of every rank's rows side by side: each writes its
        own into zeros, one all-reduce sums them (adding zeros, exactly), and the whole rows
        are normalized as on one rank. Where ranks share a KV head, its first rank alone
        writes it."""
        assert self.tp is not None
        size, ranks = own.shape[1], self.tp.size
        heads, per_head = self.norm_heads[0 if queries else 1], self.head_dim
        if queries or heads >= ranks:
            first, writes = self.tp.rank * size // per_head, True
        else:  # ranks outnumber KV heads: `Shard.kv_heads`
            first = self.tp.rank * heads // ranks
            writes = self.tp.rank * heads % ranks < heads
        whole = own.new_zeros(own.shape[0], heads * per_head)
        columns = slice(first * per_head, first * per_head + size)
        if writes:
            whole[:, columns] = own
        whole = self.tp.all_reduce(whole)
        return self.ops.rms_norm(whole, norm.weight, norm.eps)[:, columns]


class Qwen3Model(LlamaModel):
    layer_class = Qwen3DecoderLayer
