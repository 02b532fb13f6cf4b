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
        decodes: list[int] | None = None,
    ) -> Any:
        """Index tensors shared by every layer of one step (CPU lists in, device tensors out).
        `decodes[r]`: how many of request r's last query tokens attend as decodes, each over the
        cache up to its own position (default: the one-token queries); see `decode_counts`."""
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


def decode_counts(query_start_loc: list[int], decodes: list[int] | None = None) -> list[int]:
    """How many of each request's last query tokens are decodes: `decodes` as given (the runner
    names every token at or past its request's prompt: the newest token, drafts, and outputs
    recomputed after a preemption), by default the one-token queries."""
    if decodes is None:
        return [int(b - a == 1) for a, b in pairwise(query_start_loc)]
    q_lens = [b - a for a, b in pairwise(query_start_loc)]
    if len(decodes) != len(q_lens) or any(
        not 0 <= n <= q for n, q in zip(decodes, q_lens, strict=True)
    ):  # fmt: skip
        raise ValueError(f"decodes {decodes} do not fit the queries {query_start_loc}")
    return decodes


def prompt_and_decode_rows(query_start_loc: list[int]) -> tuple[list[int], list[int]]:
    """The step's requests with a prompt chunk and those with a one-token decode."""
    counts = decode_counts(query_start_loc)
    return [r for r, n in enumerate(counts) if not n], [r for r, n in enumerate(counts) if n]
