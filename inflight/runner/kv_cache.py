"""Per-layer paged K/V tensors `[num_blocks, block_size, kv_heads, head_dim]`, and their sizing.

The number of blocks comes from a memory budget in bytes (or is given directly), capped at what
`max_num_seqs` sequences of `max_model_len` tokens could ever hold, so a small model does not
reserve memory it can never use.
"""

from __future__ import annotations

import torch

from inflight.core.kv_cache_manager import cdiv
from inflight.model.arch import LlamaArchConfig


def kv_bytes_per_token(arch: LlamaArchConfig, dtype: torch.dtype) -> int:
    element = torch.empty((), dtype=dtype).element_size()
    return 2 * arch.num_layers * arch.num_kv_heads * arch.head_dim * element


def num_blocks_for_budget(
    arch: LlamaArchConfig,
    dtype: torch.dtype,
    block_size: int,
    memory_bytes: int,
    max_num_seqs: int,
    max_model_len: int,
) -> int:
    per_block = kv_bytes_per_token(arch, dtype) * block_size
    useful = max_num_seqs * cdiv(max_model_len, block_size)
    return max(1, min(memory_bytes // per_block, useful))


class KVCache:
    def __init__(
        self,
        arch: LlamaArchConfig,
        num_blocks: int,
        block_size: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        shape = (num_blocks, block_size, arch.num_kv_heads, arch.head_dim)
        self.num_blocks = num_blocks
        self.block_size = block_size
        # NOTE: zeroed, not left uninitialised: attention gathers whole blocks, so it reads
        # slots past a sequence's end, masked out; masked garbage could still be NaN, and
        # 0 * NaN = NaN. (The zeroing is mostly first-touch page faults paid here, not later.)
        self.layers: list[tuple[torch.Tensor, torch.Tensor]] = [
            (
                torch.zeros(shape, dtype=dtype, device=device),
                torch.zeros(shape, dtype=dtype, device=device),
            )
            for _ in range(arch.num_layers)
        ]
        self.num_bytes = kv_bytes_per_token(arch, dtype) * block_size * num_blocks
