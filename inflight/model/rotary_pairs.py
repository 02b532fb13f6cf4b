"""Checkpoints whose RoPE rotates interleaved pairs (dimensions 2i and 2i + 1 together, GPT-J's
way: GLM-4's over half of each head, ERNIE 4.5's over all of it, DeepSeek's over the rotated
part after each head's others: `latent_rotary_order`). The engine's RoPE rotates
halves (i with i + r/2), so each query and key head's rotary rows are reordered at load, pairs
to halves: the same permutation of a head's dimensions in queries and keys leaves every score
as it was. Floats are reordered in `load_weights`; a GGUF's blocks never pass there, so the
loader reorders their rows itself (`gguf_loader`, with `pairs_to_halves`)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import numpy as np
import torch

from inflight.model.arch import LlamaArchConfig
from inflight.model.llama import LlamaModel

# the architectures whose checkpoints rotate interleaved pairs
PAIR_ROTARY = ("glm4", "ernie4_5", "ernie4_5_moe")


def pairs_to_halves(num_heads: int, head_dim: int, rotary_dim: int, first: int = 0) -> np.ndarray:
    """The row order that turns a projection's interleaved rotary pairs into halves: per head,
    the rows before its rotary ones (`first` of them: DeepSeek's), its even rotary rows, its odd
    ones, then the other rows RoPE leaves alone."""
    rotary = first + np.arange(rotary_dim)
    within = np.concatenate([np.arange(first), rotary[0::2], rotary[1::2],
                             np.arange(first + rotary_dim, head_dim)])  # fmt: skip
    return (np.arange(num_heads)[:, None] * head_dim + within).reshape(-1)


def latent_rotary_order(cfg: LlamaArchConfig) -> dict[str, np.ndarray]:
    """The row order (pairs to halves) of each projection that holds rotated rows: the query's
    (`q_b_proj`, or `q_proj`), each head's after its `qk_nope_head_dim` others, and the latent
    projection's, after the latent."""
    query = pairs_to_halves(cfg.num_heads, cfg.qk_nope_head_dim + cfg.rope_dim, cfg.rope_dim,
                            first=cfg.qk_nope_head_dim)  # fmt: skip
    latent = pairs_to_halves(1, cfg.kv_lora_rank + cfg.rope_dim, cfg.rope_dim,
                             first=cfg.kv_lora_rank)  # fmt: skip
    return {"q_b_proj": query, "q_proj": query, "kv_a_proj_with_mqa": latent}


class PairRotaryModel(LlamaModel):
    """A Llama-family model whose checkpoint's q/k rows come in RoPE pairs."""

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
