"""The attention backend protocol: everything the model, the runner, the KV cache, the loader
and CUDA graphs may ask of a backend, so none of them needs to know which one it holds.

A backend owns the layout of one layer's K/V cache (`cache_shapes`), the per-step index tensors
every layer shares (`build_metadata`, opaque to everyone else), and attention itself
(`forward`: write the step's new keys and values, then attend). It also says what comes with
it: the C++ kernel build (fused layer ops, packed small-batch matmuls, greedy argmax), the Triton
layer ops, or CUDA-graph capture of decodes.
"""

from __future__ import annotations

from itertools import pairwise
from typing import Any, Protocol

import torch


class AttentionBackend(Protocol):
    name: str
    block_size: int
    sliding_window: int | None
    cpu_kernels: bool  # the C++ kernel build comes with it (a CPU): the loader fuses and packs
    triton_kernels: bool  # Triton's layer ops come with it (a GPU, or the interpreter in tests)
    graph_capturable: bool  # decodes read lengths from tensors: one CUDA graph serves any lengths
    interpreted: bool  # its kernels run under an interpreter here: warm-ups stay tiny

    def cache_shapes(
        self, num_blocks: int, num_kv_heads: int, head_dim: int
    ) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """Shapes of one layer's key and value caches; block `b` is index `b` of dim 0."""
        ...

    def build_metadata(
        self,
        query_start_loc: list[int],
        start_pos: list[int],
        block_tables: torch.Tensor,
        slot_mapping: torch.Tensor,
        device: torch.device,
        decodes: list[bool] | None = None,
    ) -> Any:
        """Index tensors shared by every layer of one step (CPU lists in, device tensors out).
        `decodes[r]`: request r's query is its newest token and the drafts after it (default:
        the one-token queries); see `prompt_and_decode_rows`."""
        ...

    def decode_metadata(
        self,
        slot_mapping: torch.Tensor,
        rows: torch.Tensor,
        block_tables: torch.Tensor,
        seq_lens: torch.Tensor,
    ) -> Any:
        """Metadata of a step of decodes only, over static buffers (graph-capturable backends)."""
        ...

    def forward(
        self,
        query: torch.Tensor,  # [T, H, D]
        key: torch.Tensor,  # [T, KVH, D]
        value: torch.Tensor,
        k_cache: torch.Tensor,  # laid out as `cache_shapes` says
        v_cache: torch.Tensor,
        meta: Any,
    ) -> torch.Tensor:
        """Writes the new keys and values to the cache, then attends: [T, H, D]."""
        ...


def token_major_shapes(
    num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Keys and values both [num_blocks, block_size, KVH, D]: the reference's and Triton's
    layout."""
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    return shape, shape


def write_token_major(
    k_cache: torch.Tensor,  # [NB, BS, KVH, D]
    v_cache: torch.Tensor,
    key: torch.Tensor,  # [T, KVH, D]
    value: torch.Tensor,
    slot_mapping: torch.Tensor,  # [T] block * block_size + offset
) -> None:
    """The cache write of the token-major layout (the reference's and Triton's)."""
    num_kv_heads, head_dim = key.shape[1], key.shape[2]
    k_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, slot_mapping, key)
    v_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, slot_mapping, value)


def prompt_and_decode_rows(
    query_start_loc: list[int], decodes: list[bool] | None = None
) -> tuple[list[int], list[int]]:
    """The step's requests with a prompt chunk and with a decode: by default a decode is one
    query token; `decodes` also names those verifying drafts (their newest token, then drafts)."""
    if decodes is None:
        decodes = [b - a == 1 for a, b in pairwise(query_start_loc)]
    return [r for r, d in enumerate(decodes) if not d], [r for r, d in enumerate(decodes) if d]
