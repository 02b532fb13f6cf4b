"""A token embedding kept as a GGUF file's blocks (any format of `gguf_blocks.FORMATS`): the rows
a step looks up are dequantized as they are read. A model whose linears multiply from their
blocks then holds no float copy of its vocabulary either (SmolLM2's: 113 MB in float32; a 3B
model's with the same vocabulary: 0.56 GiB), for a few microseconds a step (the 5-bit,
K-quant and MXFP4 formats' rows in C++, `gguf_dequantize_rows`: 9 µs a row of 2,048 Q6_K weights
where PyTorch's ops took 127). The values are the `gguf` package's dequantization, bit for bit
(`gguf_blocks.dequantize`). A tied embedding reads its rows from its LM head's 8-column layout
instead (`over_layout`; 16 columns in a bf16 engine), so the vocabulary is held once (Gemma
3's Q8_0 262k x 640: 0.17 GiB; Qwen3.5-0.8B's Q6_K 248k x 1,024: 0.19 GiB, 40% of its file)."""

from __future__ import annotations

import torch
from torch import nn

from inflight.kernels import load_extension
from inflight.model.gguf_blocks import (
    GROUP,
    WIDE,
    BlockFormat,
    dequantize,
    format_of,
    regrouped_rows,
)


class BlockEmbedding(nn.Module):
    """`nn.Embedding`'s lookup over GGUF blocks [vocab, hidden / block weights, block bytes]."""

    def __init__(
        self,
        blocks: torch.Tensor,
        dtype: torch.dtype,
        regrouped: tuple[BlockFormat, int] | None = None,
    ) -> None:
        """`regrouped`: (format, vocabulary) where `blocks` is their 8-column layout
        (`over_layout`)."""
        super().__init__()
        if blocks.dim() != 3:
            raise ValueError(f"GGUF blocks [vocab, blocks, bytes] expected, got "
                             f"{tuple(blocks.shape)}")  # fmt: skip
        self.regrouped = regrouped is not None
        self.num_embeddings: int
        self.format, self.num_embeddings = regrouped or (format_of(blocks), blocks.shape[0])
        self.register_buffer("blocks", blocks)
        self.dtype = dtype
        self.embedding_dim = blocks.shape[1] * self.format.weights

    @classmethod
    def over_layout(
        cls, layout: torch.Tensor, fmt: BlockFormat, vocab: int, dtype: torch.dtype
    ) -> BlockEmbedding:
        """Looked up in `regroup_blocks`' layout of the blocks (a tied LM head's weight)."""
        if not cls.layout_columns(layout, fmt, vocab):
            raise ValueError(f"{tuple(layout.shape)} is not the 8- or 16-column layout of {vocab} "
                             f"rows of {fmt.name} blocks")  # fmt: skip
        return cls(layout, dtype, regrouped=(fmt, vocab))

    @staticmethod
    def layout_columns(layout: torch.Tensor, fmt: BlockFormat, vocab: int) -> int:
        """The columns c of `layout` where it is `regroup_blocks`' layout of `vocab` rows of
        `fmt` blocks, [ceil(vocab / c), blocks, c x bytes]: 8, or 16 for a legacy format (a
        bf16 engine's); 0 where it is not."""
        columns = layout.shape[2] // fmt.file_bytes if layout.dim() == 3 else 0
        fits = columns in ((GROUP, WIDE) if fmt.legacy else (GROUP,)) and (
            layout.shape[2] == columns * fmt.file_bytes and layout.shape[0] == -(-vocab // columns)
        )  # fmt: skip
        return columns if fits else 0

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if self.regrouped and self.format.legacy:
            columns = self.layout_columns(self.blocks, self.format, self.num_embeddings)
            rows = dequantize(
                regrouped_rows(self.blocks, ids.reshape(-1), self.format.file_bytes, columns)
            )
        elif self.regrouped:
            rows = load_extension().gguf_dequantize_layout_rows(
                self.blocks, ids.reshape(-1), self.num_embeddings
            )
        elif not self.format.legacy and self.blocks.device.type == "cpu":
            # (in C++: the same values, without ~25 PyTorch ops a step)
            rows = load_extension().gguf_dequantize_rows(self.blocks, ids.reshape(-1))
        else:
            rows = dequantize(self.blocks[ids])
        return rows.reshape(*ids.shape, self.embedding_dim).to(self.dtype)

    def extra_repr(self) -> str:
        shared = ", its LM head's layout" if self.regrouped else ""
        return (f"{self.num_embeddings}, {self.embedding_dim}, {self.format.name} blocks"
                f"{shared}, {self.dtype}")  # fmt: skip
