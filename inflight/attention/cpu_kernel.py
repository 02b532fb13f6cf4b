"""CPU paged-attention backend: decodes and prompt chunks computed by C++ kernels
(`inflight/kernels/csrc/paged_attention.cpp`, `prefill_attention.cpp`) that read K/V in place
through the block tables, in a cache layout of their own: no gathered copy of the cache, no
padding, no masks, GQA without repeating heads, one call per layer for all decodes and one for
all prompt chunks.

The kernels are compiled on first use (`inflight.kernels`); `auto` falls back to the pure
PyTorch backend, with a warning, when no compiler is available (`selector.py`).
"""

from __future__ import annotations

import torch

from inflight.attention.backend import SCALE_BYTES
from inflight.attention.paged_kernels import PagedKernelBackend
from inflight.kernels import load_extension


class CpuKernelBackend(PagedKernelBackend):
    name = "cpu"
    cpu_kernels = True
    graph_capturable = False  # no CUDA graphs on a CPU
    takes_sinks = True

    def __init__(self, block_size: int) -> None:
        super().__init__(block_size)
        self._ext = load_extension()

    def decode_kernel(
        self, q, k_cache, v_cache, block_tables, seq_lens, scale, window, softcap, sinks=None
    ) -> torch.Tensor:
        return self._ext.paged_decode_attention(
            q, k_cache, v_cache, block_tables, seq_lens, scale, window, softcap, sinks
        )

    def prefill_kernel(
        self, query, k_cache, v_cache, chunks, block_tables, out, scale, window, softcap,
        max_query_len, sinks=None,
    ) -> None:  # fmt: skip
        self._ext.paged_prefill_attention(
            query, k_cache, v_cache, chunks, block_tables, out, scale, window, softcap, sinks
        )

    def cache_shapes(
        self, num_blocks: int, num_kv_heads: int, head_dim: int, scaled: bool = False
    ) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """Keys [NB, KVH, D/2, BS, 2] (each block's keys transposed, in pairs of dims), values
        [NB, KVH, BS, D]: every (block, head) one contiguous run (`csrc/kv_layout.h` says why).
        An 8-bit cache's scales take two more rows of keys and 4 more bytes per value row."""
        if head_dim % 2:
            raise ValueError(f"the CPU attention kernels need an even head_dim, got {head_dim}")
        block_size, extra = self.block_size, SCALE_BYTES if scaled else 0
        keys = (num_blocks, num_kv_heads, (head_dim + extra) // 2, block_size, 2)
        return keys, (num_blocks, num_kv_heads, block_size, head_dim + extra)

    def values_from_keys(self, head_dim: int, dtype: torch.dtype) -> bool:
        """The AVX2 items read values out of the keys' pairs of dims (`csrc/kv_layout.h`), in
        the shapes the extension names."""
        return self._ext.values_from_keys(self.block_size, head_dim, dtype)

    def write_cache(self, k_cache, v_cache, key, value, slot_mapping) -> None:
        self._ext.write_kv_cache(k_cache, v_cache, key, value, slot_mapping)


def to_kernel_layout(
    k_cache: torch.Tensor, v_cache: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Token-major caches [NB, BS, KVH, D] (the reference backend's) in `CpuKernelBackend`'s
    layout: copies, for tests and for comparing the two backends on the same contents."""
    nb, block_size, kvh, d = k_cache.shape
    keys = k_cache.view(nb, block_size, kvh, d // 2, 2).permute(0, 2, 3, 1, 4).contiguous()
    return keys, v_cache.permute(0, 2, 1, 3).contiguous()
