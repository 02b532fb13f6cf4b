"""Checkpoints whose RoPE rotates interleaved pairs (dimensions 2i and 2i + 1 together, GPT-J's
way: GLM-4's over half of each head, ERNIE 4.5's over all of it). The engine's RoPE rotates
halves (i with i + r/2), so each query and key head's rotary rows are reordered at load, pairs
to halves: the same permutation of a head's dimensions in queries and keys leaves every score
as it was. Floats are reordered in `load_weights`; a GGUF's blocks never pass there, so the
loader reorders their rows itself (`gguf_loader`, with `pairs_to_halves`)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import numpy as np
import torch

from inflight.model.llama import LlamaModel

# the architectures whose checkpoints rotate interleaved pairs
PAIR_ROTARY = ("glm4", "ernie4_5", "ernie4_5_moe")


def pairs_to_halves(num_heads: int, head_dim: int, rotary_dim: int) -> np.ndarray:
    """The row order that turns a projection's interleaved rotary pairs into halves: per head,
    its even rotary rows, its odd ones, then the rows RoPE leaves alone."""
    within = np.concatenate([np.arange(0, rotary_dim, 2), np.arange(1, rotary_dim, 2),
                             np.arange(rotary_dim, head_dim)])  # fmt: skip
    return (np.arange(num_heads)[:, None] * head_dim + within).reshape(-1)


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
