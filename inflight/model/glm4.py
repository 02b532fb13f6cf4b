"""GLM-4 (`Glm4ForCausalLM`, GGUF `glm4`): the Llama decoder with Gemma's four norms a layer
(before and after attention and the MLP; plain `w`, SiLU), q/k/v biases, gate and up fused in
the checkpoint (as Phi-3's), and RoPE over the first half of each head in interleaved pairs
(dimensions 2i and 2i + 1 rotate together, GPT-J's way). The engine's RoPE rotates halves (i
with i + r/2), so each query and key head's rotary rows are reordered at load, pairs to halves
(`pairs_to_halves`): the same permutation of a head's dimensions in queries and keys leaves
every score as it was. A GGUF's blocks never pass `load_weights`; the loader reorders their
rows itself."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import ClassVar

import numpy as np
import torch

from inflight.attention import AttentionBackend
from inflight.model.arch import LlamaArchConfig
from inflight.model.layer_ops import TorchLayerOps
from inflight.model.llama import DecoderLayer, LlamaModel, RMSNorm


def pairs_to_halves(num_heads: int, head_dim: int, rotary_dim: int) -> np.ndarray:
    """The row order that turns a projection's interleaved rotary pairs into halves: per head,
    its even rotary rows, its odd ones, then the rows RoPE leaves alone."""
    within = np.concatenate([np.arange(0, rotary_dim, 2), np.arange(1, rotary_dim, 2),
                             np.arange(rotary_dim, head_dim)])  # fmt: skip
    return (np.arange(num_heads)[:, None] * head_dim + within).reshape(-1)


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


class Glm4Model(LlamaModel):
    layer_class: ClassVar[type[DecoderLayer]] = Glm4DecoderLayer
    _PROJECTIONS: ClassVar[dict[str, tuple[str, tuple[str, ...]]]] = {
        **LlamaModel._PROJECTIONS,
        "gate_up_proj": ("mlp", ("gate_up_proj",)),
    }
    _FUSED: ClassVar[dict[str, tuple[str, tuple[str, ...]]]] = {
        part: fused for part, fused in LlamaModel._FUSED.items() if fused[0] == "qkv_proj"
    }

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        super().load_weights(self._halves(weights))

    def _halves(
        self, weights: Iterable[tuple[str, torch.Tensor]]
    ) -> Iterator[tuple[str, torch.Tensor]]:
        cfg = self.cfg
        order = {
            f"{p}_proj": torch.from_numpy(pairs_to_halves(heads, cfg.head_dim, cfg.rope_dim))
            for p, heads in (("q", cfg.num_heads), ("k", cfg.num_kv_heads))
        }
        for name, tensor in weights:
            projection = name.rpartition(".")[0].rpartition(".")[2]  # q_proj of ...q_proj.bias
            if projection in order and ".self_attn." in name:
                tensor = tensor[order[projection]]
            yield name, tensor
