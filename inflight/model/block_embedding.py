"""A token embedding kept as a GGUF file's Q4_0, Q4_1 or Q8_0 blocks: the rows a step looks up
are dequantized as they are read. A model whose linears multiply from their blocks then holds
no float copy of its vocabulary either (SmolLM2's: 113 MB in float32; a 3B model's with the
same vocabulary: 0.56 GiB), for a few microseconds a step. The values are the `gguf` package's
dequantization, bit for bit (the same float32 operations in the same order)."""

from __future__ import annotations

import torch
from torch import nn

# a block's bytes -> its format: fp16 d (and fp16 m for Q4_1), then 16 bytes of nibbles or 32
# int8 quants, 32 weights each
BLOCK_FORMATS = {18: "Q4_0", 20: "Q4_1", 34: "Q8_0"}


def dequantize_rows(rows: torch.Tensor) -> torch.Tensor:
    """uint8 blocks [..., blocks per row, block bytes] -> float32 [..., blocks per row, 32]."""
    fmt = BLOCK_FORMATS[rows.shape[-1]]
    d = rows[..., :2].contiguous().view(torch.float16).float()
    if fmt == "Q8_0":
        return d * rows[..., 2:].contiguous().view(torch.int8).float()
    quants = rows[..., 4:] if fmt == "Q4_1" else rows[..., 2:]
    # byte i holds weight i in its low nibble and weight i + 16 in its high one
    q = torch.cat([quants & 15, quants >> 4], dim=-1)
    if fmt == "Q4_0":
        return d * (q.to(torch.int8) - 8).float()
    return d * q.float() + rows[..., 2:4].contiguous().view(torch.float16).float()


class BlockEmbedding(nn.Module):
    """`nn.Embedding`'s lookup over GGUF blocks [vocab, hidden / 32, block bytes]."""

    def __init__(self, blocks: torch.Tensor, dtype: torch.dtype) -> None:
        super().__init__()
        if blocks.dim() != 3 or blocks.dtype != torch.uint8 or blocks.shape[2] not in BLOCK_FORMATS:
            raise ValueError(f"GGUF blocks of a kernel format expected, got {tuple(blocks.shape)} "
                             f"{blocks.dtype}")  # fmt: skip
        self.register_buffer("blocks", blocks)
        self.dtype = dtype
        self.num_embeddings, self.embedding_dim = blocks.shape[0], blocks.shape[1] * 32

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        rows = dequantize_rows(self.blocks[ids])
        return rows.reshape(*ids.shape, self.embedding_dim).to(self.dtype)

    def extra_repr(self) -> str:
        fmt = BLOCK_FORMATS[self.blocks.shape[2]]
        return f"{self.num_embeddings}, {self.embedding_dim}, {fmt} blocks, {self.dtype}"
