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
        if self.norm_heads[0]:  # (a rank's share of norms over the whole model's heads)
            return self._normalize_whole(qkv)
        for start, size, norm in ((0, q_size, self.q_norm), (q_size, kv_size, self.k_norm)):
            width = norm.weight.shape[0]  # a head's (Qwen3), or all heads' (OLMo 2)
            rows = qkv[:, start : start + size].reshape(-1, width)  # [T * heads, D] or [T, size]
            normed = self.ops.rms_norm(rows, norm.weight, norm.eps)
            qkv[:, start : start + size] = normed.view(t, size)
        return qkv

    def _normalize_whole(self, qkv: torch.Tensor) -> torch.Tensor:
        """This rank's queries and keys normalized as one rank normalizes the model's: each
        rank writes its heads' rows into zeros as wide as every rank's queries and keys, one
        all-reduce sums them (adding zeros, exactly), and the whole rows are normalized. Where
        ranks share a KV head, its first rank alone writes it."""
        assert self.tp is not None
        (heads, kv_heads), d = self.norm_heads, self.head_dim
        rank, ranks = self.tp.rank, self.tp.size
        q_size, kv_size = self.split[:2]
        if kv_heads >= ranks:
            first_kv, writes_kv = rank * kv_size // d, True
        else:  # ranks outnumber KV heads: `Shard.kv_heads`
            first_kv, writes_kv = rank * kv_heads // ranks, rank * kv_heads % ranks < kv_heads
        q_cols = slice(rank * q_size, (rank + 1) * q_size)
        k_cols = slice(first_kv * d, first_kv * d + kv_size)  # (among the keys)
        whole = qkv.new_zeros(qkv.shape[0], (heads + kv_heads) * d)
        whole[:, q_cols] = qkv[:, :q_size]
        if writes_kv:
            whole[:, heads * d :][:, k_cols] = qkv[:, q_size : q_size + kv_size]
        whole = self.tp.all_reduce(whole)
        q = self.ops.rms_norm(whole[:, : heads * d], self.q_norm.weight, self.q_norm.eps)
        k = self.ops.rms_norm(whole[:, heads * d :], self.k_norm.weight, self.k_norm.eps)
        qkv[:, :q_size] = q[:, q_cols]
        qkv[:, q_size : q_size + kv_size] = k[:, k_cols]
        return qkv


class Qwen3Model(LlamaModel):
    layer_class = Qwen3DecoderLayer
