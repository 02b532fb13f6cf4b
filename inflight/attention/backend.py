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
    cpu_kernels: bool  # the C++ kernel build comes with it (a CPU): the loader fuses and packs
    triton_kernels: bool  # Triton's layer ops come with it (a GPU, or the interpreter in tests)
    graph_capturable: bool  # decodes read lengths from tensors: one CUDA graph serves any lengths
    interpreted: bool  # its kernels run under an interpreter here: warm-ups stay tiny
    takes_sinks: bool  # `forward` takes gpt-oss's attention sinks (else the loader picks torch)

    def cache_shapes(
        self, num_blocks: int, num_kv_heads: int, head_dim: int, scaled: bool = False
    ) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """Shapes of one layer's key and value caches; block `b` is index `b` of dim 0.
        `scaled`: an 8-bit cache, room for a float32 scale per (position, head) included."""
        ...

    def values_from_keys(self, head_dim: int, dtype: torch.dtype) -> bool:
        """Whether its kernels read a layer's values out of its key cache (given as the value
        cache too, a view of the same memory) for layers whose values are their keys."""
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
        window: int | None = None,
        scale: float | None = None,
        softcap: float | None = None,
        sinks: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Writes the new keys and values to the cache, then attends: [T, H, D]. A layer's own:
        `window`, each query sees only its last `window` positions (None: all of them);
        `scale`, of the scores (None: head_dim ** -0.5); `softcap` c, each scaled score s
        becomes c tanh(s / c) before the softmax (Gemma 2's; None: none); `sinks` [H], a logit
        per head that joins each softmax's denominator (gpt-oss's; None: none; a backend that
        does not take it says so with `takes_sinks`)."""
        ...


SCALED_DTYPES = (torch.int8, torch.float8_e4m3fn)
SCALE_BYTES = 4  # a float32 scale per (position, head) of an 8-bit cache, keys and values apart
_SCALED_MAX = {torch.int8: 127.0, torch.float8_e4m3fn: 448.0}


def is_scaled(dtype: torch.dtype) -> bool:
    """An 8-bit cache: each row of D keys or values is stored with its scale."""
    return dtype in SCALED_DTYPES


def quantize_rows(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """[..., D] rows as [..., D + 4] bytes: each row scaled so that its largest |x| is the 8-bit
    type's largest value (127, or 448 for float8 e4m3), rounded to nearest even, then the scale
    in float32 (0 for a row of zeros). The C++ kernels' write rounds the same way."""
    x = x.float()
    amax = x.abs().amax(-1, keepdim=True)
    # NOTE: a tensor divisor: PyTorch's CUDA division by a Python number multiplies by its
    # reciprocal, which rounds differently from the division every kernel does
    scale = amax / torch.full_like(amax, _SCALED_MAX[dtype])
    y = torch.where(scale > 0, x / scale, 0.0)
    stored = y.round().clamp(-127, 127).to(dtype) if dtype == torch.int8 else y.to(dtype)
    return torch.cat([stored.view(torch.uint8), scale.view(torch.uint8)], dim=-1)


def dequantize_rows(rows: torch.Tensor) -> torch.Tensor:
    """An 8-bit cache's rows [..., D + 4] (`quantize_rows`' bytes, in the cache's dtype) back to
    float32 [..., D]."""
    raw = rows.view(torch.uint8)
    scale = raw[..., -SCALE_BYTES:].contiguous().view(torch.float32)
    return raw[..., :-SCALE_BYTES].view(rows.dtype).float() * scale


def to_cache_rows(rows: torch.Tensor, cache_dtype: torch.dtype) -> torch.Tensor:
    """Keys or values [..., D] as a cache of `cache_dtype` stores them ([..., D + 4] when
    8-bit); `read_token_major` reads them back."""
    if is_scaled(cache_dtype):
        return quantize_rows(rows, cache_dtype).view(cache_dtype)
    return rows.to(cache_dtype)


def token_major_shapes(
    num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int, scaled: bool = False
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Keys and values both [num_blocks, block_size, KVH, D] (the reference's and Triton's
    layout), each row followed by its 4 scale bytes in an 8-bit cache."""
    shape = (num_blocks, block_size, num_kv_heads, head_dim + (SCALE_BYTES if scaled else 0))
    return shape, shape


def write_token_major(
    k_cache: torch.Tensor,  # [NB, BS, KVH, D (+ 4)]
    v_cache: torch.Tensor,
    key: torch.Tensor,  # [T, KVH, D]
    value: torch.Tensor,
    slot_mapping: torch.Tensor,  # [T] block * block_size + offset
) -> None:
    """The cache write of the token-major layout (the reference's and Triton's), converted to
    the cache's dtype."""
    num_kv_heads, row = k_cache.shape[2], k_cache.shape[3]
    for cache, rows in ((k_cache, key), (v_cache, value)):
        stored = to_cache_rows(rows, cache.dtype)
        if is_scaled(cache.dtype):  # as bytes: index_copy_ has no float8 kernel
            cache, stored = cache.view(torch.uint8), stored.view(torch.uint8)
        cache.view(-1, num_kv_heads, row).index_copy_(0, slot_mapping, stored)


def read_token_major(rows: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Gathered cache rows [..., D (+ 4)] as values of `dtype` (the queries')."""
    if is_scaled(rows.dtype):
        return dequantize_rows(rows).to(dtype)
    return rows.to(dtype)


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
