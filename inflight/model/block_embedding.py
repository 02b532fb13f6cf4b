"""A token embedding kept as a GGUF file's blocks (any format of `gguf_blocks.FORMATS`): the rows
a step looks up are dequantized as they are read. A model whose linears multiply from their
blocks then holds no float copy of its vocabulary either (SmolLM2's: 113 MB in float32; a 3B
model's with the same vocabulary: 0.56 GiB), for a few microseconds a step. The values are the
`gguf` package's dequantization, bit for bit (`gguf_blocks.dequantize`)."""

from __future__ import annotations

import torch
from torch import nn

from inflight.model.gguf_blocks import dequantize, format_of


class BlockEmbedding(nn.Module):
    """`nn.Embedding`'s lookup over GGUF blocks [vocab, hidden / block weights, block bytes]."""

    def __init__(self, blocks: torch.Tensor, dtype: torch.dtype) -> None:
        super().__init__()
        if blocks.dim() != 3:
            raise ValueError(f"GGUF blocks [vocab, blocks, bytes] expected, got "
                             f"{tuple(blocks.shape)}")  # fmt: skip
        self.format = format_of(blocks)
        self.register_buffer("blocks", blocks)
        self.dtype = dtype
        self.num_embeddings = blocks.shape[0]
        self.embedding_dim = blocks.shape[1] * self.format.weights

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        rows = dequantize(self.blocks[ids])
        return rows.reshape(*ids.shape, self.embedding_dim).to(self.dtype)

    def extra_repr(self) -> str:
        return (f"{self.num_embeddings}, {self.embedding_dim}, {self.format.name} blocks, "
                f"{self.dtype}")  # fmt: skip
