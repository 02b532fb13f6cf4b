"""DeepSeek-V2 and -V3 (Kimi K2, Moonlight; GLM-4.7-Flash is V3's layers): multi-head latent
attention (MLA) beside DeepSeek's experts (`moe.py`'s router with DeepSeek's settings,
`arch._deepseek_routing`).

A token's keys and values are projections of one small latent: `kv_a_proj_with_mqa` makes a
`kv_lora_rank` latent (RMS-normalized) and `qk_rope_head_dim` rotated dimensions that every head
shares; `kv_b_proj` would expand the latent into each head's key part and value. Expanded, the
cache would hold every head's key and value; here the expansion is absorbed instead, as
DeepSeek's own inference and llama.cpp do: each head's query part is multiplied into the latent's
space once (q W_UK), so that the scores are taken against the latent itself, and the attention's
output, a mix of latents, is expanded by W_UV after. The cache then holds one KV head of
`kv_lora_rank + qk_rope_head_dim` per token (576 for every published model, against 40,960 for
DeepSeek-V3's 128 expanded heads), and the paged attention kernels run it as multi-query
attention whose values are the keys themselves (held once, where the kernels read values out
of the keys: `runner/kv_cache.py`): the rotated dimensions come first in every query and key,
and the output's latent part is what is kept.

The checkpoints rotate interleaved pairs: the rotated rows of the query and latent projections
are reordered to halves at load (`rotary_pairs`), which leaves every score as it was.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any, ClassVar

import torch
from torch import nn

from inflight.attention import AttentionBackend
from inflight.kernels import load_extension
from inflight.model.arch import LlamaArchConfig
from inflight.model.layer_ops import TorchLayerOps
from inflight.model.llama import RMSNorm
from inflight.model.moe import MoEDecoderLayer, MoEModel
from inflight.model.packed_linear import Decodes, apply_linear, integer_block_packings
from inflight.model.rotary_pairs import latent_rotary_order

# the RMSNorms of the query and key-value latents (transformers' default; the published
# models' rms_norm_eps too)
LATENT_NORM_EPS = 1e-6


class LatentProjection(nn.Module):
    """`kv_b_proj`'s weight [heads * (qk_nope + v), kv_lora_rank], held as floats (no linear:
    it is read per head, as W_UK and W_UV, never applied to the latent whole)."""

    def __init__(self, rows: int, kv_lora_rank: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(rows, kv_lora_rank), requires_grad=False)


class DeepseekDecoderLayer(MoEDecoderLayer):
    """DeepSeek's layer: latent attention, then a dense MLP (the first layers) or experts."""

    def __init__(
        self, cfg: LlamaArchConfig, attn: AttentionBackend, ops: TorchLayerOps, index: int
    ) -> None:
        super().__init__(cfg, attn, ops, index)
        del self.qkv_proj, self.o_proj  # (Llama's shapes)
        heads, hidden = cfg.num_heads, cfg.hidden_size
        self.nope, self.rope = cfg.qk_nope_head_dim, cfg.rope_dim
        self.latent, self.value = cfg.kv_lora_rank, cfg.v_head_dim
        query_rows = heads * (self.nope + self.rope)
        self.query_latent = bool(cfg.q_lora_rank)  # queries through a latent of their own
        if self.query_latent:
            self.q_a_proj = nn.Linear(hidden, cfg.q_lora_rank, bias=False)
            self.q_a_layernorm = RMSNorm(cfg.q_lora_rank, LATENT_NORM_EPS)
            self.q_b_proj = nn.Linear(cfg.q_lora_rank, query_rows, bias=False)
        else:
            self.q_proj = nn.Linear(hidden, query_rows, bias=False)
        self.kv_a_proj_with_mqa = nn.Linear(hidden, self.latent + self.rope, bias=False)
        self.kv_a_layernorm = RMSNorm(self.latent, LATENT_NORM_EPS)
        self.per_head = cfg.latent_expansion_per_head
        if self.per_head:  # each head's W_UK transposed and W_UV, from their blocks (under
            # tensor parallelism every head's, of which a rank multiplies its own)
            every = cfg.latent_expansion_heads or heads
            self.k_b_proj = nn.ModuleList(
                nn.Linear(self.nope, self.latent, bias=False) for _ in range(every)
            )
            self.v_b_proj = nn.ModuleList(
                nn.Linear(self.latent, self.value, bias=False) for _ in range(every)
            )
        else:
            self.kv_b_proj = LatentProjection(heads * (self.nope + self.value), self.latent)
        self.o_proj = nn.Linear(heads * self.value, hidden, bias=False)
        # this rank's heads' W_UK and W_UV packings for one C++ call each, where they have them
        # (`integer_block_packings`; looked at once the loader has packed them)
        self.head_packings: tuple[HeadPackings, HeadPackings] | None = None

    def attention(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        kv_cache: tuple[torch.Tensor, torch.Tensor],
        meta: Any,
        query_scale: torch.Tensor | None,
        decodes: Decodes,
    ) -> torch.Tensor:
        t, heads, ops = x.shape[0], self.num_heads, self.ops
        if self.query_latent:
            q = apply_linear(self.q_a_proj, x, decodes)
            q = ops.rms_norm(q, self.q_a_layernorm.weight, self.q_a_layernorm.eps)
            q = apply_linear(self.q_b_proj, q, decodes)
        else:
            q = apply_linear(self.q_proj, x, decodes)
        q = q.view(t, heads, self.nope + self.rope)
        kv = apply_linear(self.kv_a_proj_with_mqa, x, decodes)  # [T, latent + rope]
        latent = ops.rms_norm(kv[:, : self.latent].contiguous(), self.kv_a_layernorm.weight,
                              self.kv_a_layernorm.eps)  # fmt: skip
        # every head's rotated query part and the shared rotated key part, rotated as one
        rotated = torch.cat([q[..., self.nope :], kv[:, None, self.latent :]], dim=1)
        ops.rope_(rotated.view(t, -1), cos, sin, heads + 1, self.rope)
        # each head's query part in the latent's space: q W_UK, [T, H, latent]
        if self.per_head:
            absorbed = head_linears(self._own(self.k_b_proj), self._packings()[0],
                                    q[..., : self.nope], decodes)  # fmt: skip
        else:
            up = self.kv_b_proj.weight.view(heads, self.nope + self.value, self.latent)
            absorbed = rows_bmm(q[..., : self.nope].transpose(0, 1), up[:, : self.nope])
            absorbed = absorbed.transpose(0, 1)
        query = torch.cat([rotated[:, :heads], absorbed], dim=-1)
        key = torch.cat([rotated[:, heads:], latent[:, None]], dim=-1)  # [T, 1, rope + latent]
        out = self.attn.forward(query, key, key, kv_cache[0], kv_cache[1], meta, self.window,
                                self.scale, self.softcap, self.sinks)  # fmt: skip
        # the mix of latents each head attended to, expanded by W_UV: [T, H, v]
        if self.per_head:
            values = head_linears(self._own(self.v_b_proj), self._packings()[1],
                                  out[..., self.rope :], decodes)  # fmt: skip
        else:
            values = rows_bmm(
                out[..., self.rope :].transpose(0, 1), up[:, self.nope :].transpose(1, 2)
            ).transpose(0, 1)
        return apply_linear(self.o_proj, values.reshape(t, -1), decodes)

    def _packings(self) -> tuple[HeadPackings, HeadPackings]:
        """This rank's heads' W_UK and W_UV packings (`head_packings`), looked at once."""
        if self.head_packings is None:
            self.head_packings = (integer_block_packings(self._own(self.k_b_proj)),
                                  integer_block_packings(self._own(self.v_b_proj)))  # fmt: skip
        return self.head_packings

    def _own(self, linears: nn.ModuleList) -> nn.ModuleList:
        """This rank's heads' linears of every head's (all of them, unsplit)."""
        if self.tp is None:
            return linears
        first = self.tp.rank * self.num_heads
        return linears[first : first + self.num_heads]


class DeepseekModel(MoEModel):
    layer_class = DeepseekDecoderLayer
    fusable = False
    unfused_because = "latent attention"
    # (the attention's projections are the layer's own: none is fused)
    _PROJECTIONS: ClassVar[dict[str, tuple[str, tuple[str, ...]]]] = {
        "o_proj": ("self_attn", ("o_proj",)),
        "gate_up_proj": ("mlp", ("gate_proj", "up_proj")),
        "down_proj": ("mlp", ("down_proj",)),
    }

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        super().load_weights(self._rotary_halves(weights))

    def _rotary_halves(
        self, weights: Iterable[tuple[str, torch.Tensor]]
    ) -> Iterator[tuple[str, torch.Tensor]]:
        """The query and latent projections' rotated rows, pairs to halves."""
        order = latent_rotary_order(self.cfg)
        for name, tensor in weights:
            projection = name.rpartition(".")[0].rpartition(".")[2]
            if projection in order and ".self_attn." in name:
                tensor = tensor[torch.from_numpy(order[projection])]
            yield name, tensor

    def linear_sources(self) -> dict[str, list[str]]:
        sources = super().linear_sources()
        for i in range(len(self.layers)):
            attention = f"model.layers.{i}.self_attn"
            parts = ("q_a_proj", "q_b_proj") if self.cfg.q_lora_rank else ("q_proj",)
            for part in (*parts, "kv_a_proj_with_mqa"):
                sources[f"layers.{i}.{part}"] = [f"{attention}.{part}.weight"]
            every = self.cfg.latent_expansion_heads or self.cfg.num_heads
            for h in range(every if self.cfg.latent_expansion_per_head else 0):
                for part in ("k_b_proj", "v_b_proj"):
                    sources[f"layers.{i}.{part}.{h}"] = [f"{attention}.{part}.{h}.weight"]
        return sources


# MKL's batched products take fewer rows than this by other kernels, which sum otherwise: a
# token's row would round by its step's size (measured on a Zen 4 with torch 2.13's MKL: 1-3
# rows apart, 4-600 alike; the batch-invariance tests hold it on each CPU CI runs on)
BMM_MIN_ROWS = 4


def rows_bmm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """`torch.bmm` [B, T, k] @ [B, k, n] -> [B, T, n], each row's sums the same whatever T: on
    a CPU fewer than `BMM_MIN_ROWS` rows are computed among zero rows."""
    t = a.shape[1]
    if t >= BMM_MIN_ROWS or a.device.type != "cpu":
        return torch.bmm(a, b)
    padded = a.new_zeros(a.shape[0], BMM_MIN_ROWS, a.shape[2])
    padded[:, :t] = a
    return torch.bmm(padded, b)[:, :t]


# every head's `gguf_int_linear` packing and their activation bits, or None
HeadPackings = tuple[list[torch.Tensor], int] | None


def head_linears(
    linears: nn.ModuleList, packings: HeadPackings, x: torch.Tensor, decodes: Decodes
) -> torch.Tensor:
    """Each head's rows of x [T, H, in] through its own linear -> [T, H, out]: in one C++ call
    where every head multiplies from its blocks with the integer kernel (`packings`; a Python
    call per head costs more than its multiply), else head by head."""
    if packings is not None:
        weights, bits = packings
        out = load_extension().gguf_int_linear_heads(x, weights, linears[0].out_features, bits)
        return out.transpose(0, 1)
    return torch.stack([apply_linear(linear, x[:, h], decodes)
                        for h, linear in enumerate(linears)], dim=1)  # fmt: skip
