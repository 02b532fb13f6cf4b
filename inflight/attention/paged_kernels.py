"""Plumbing for kernel backends that read the paged cache in place (the C++ and the Triton one):
all decodes of a step go to one kernel call per layer and all prompt chunks to another, with no
gathered copy of the cache, no padding and no masks.

A subclass says which kernels and which cache layout:
`decode_kernel(q [R, H, D], k_cache, v_cache, block_tables [R, MB], seq_lens [R], scale,
window, softcap[, sinks]) -> [R, H, D]` and `prefill_kernel(query, k_cache, v_cache,
chunks [C, 3], block_tables [C, MB], out, scale, window, softcap, max_query_len[, sinks])`;
`takes_sinks` says whether they take attention sinks (float32 [H]) as their last argument.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from itertools import pairwise

import torch

from inflight.attention.backend import (
    decode_counts,
    token_major_shapes,
    write_token_major,
)


@dataclass
class DecodeBatch:
    """Every decode of the step, for the kernel: no grouping, no masks. A request verifying
    drafts, or recomputing outputs after a preemption, gives one row per such token, each over
    the cache up to its own position: so each token rounds exactly as it would decoded alone
    (the prefill kernel's online softmax sums in another order), greedy speculation keeps plain
    decoding's tokens in bf16 too, and a preempted request its own."""

    rows: torch.Tensor  # [R] flat token index of each decoded token
    block_tables: torch.Tensor  # [R, MB] int64
    seq_lens: torch.Tensor  # [R] int64
    all_rows: bool = False  # every token of the step is a decode (rows == 0..T-1)


@dataclass
class PrefillBatch:
    """Every prompt chunk of the step, for the kernel: no masks, no gathered keys."""

    chunks: torch.Tensor  # [C, 3] int64: first flat row, query tokens, tokens cached before
    block_tables: torch.Tensor  # [C, MB] int64
    max_query_len: int  # the longest chunk's query tokens


@dataclass
class KernelMetadata:
    slot_mapping: torch.Tensor  # [T] cache slot written by each new token
    decode_batch: DecodeBatch | None = None
    prefill_batch: PrefillBatch | None = None


class PagedKernelBackend:
    name: str
    cpu_kernels = triton_kernels = interpreted = False
    graph_capturable = True
    takes_sinks = False
    decode_kernel: Callable[..., torch.Tensor]
    prefill_kernel: Callable[..., None]

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size

    def cache_shapes(
        self, num_blocks: int, num_kv_heads: int, head_dim: int, scaled: bool = False
    ) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """Token-major, unless a subclass lays blocks out for its kernels."""
        return token_major_shapes(num_blocks, self.block_size, num_kv_heads, head_dim, scaled)

    def values_from_keys(self, head_dim: int, dtype: torch.dtype) -> bool:
        """Token-major: the values' layout is the keys', so the same tensor serves as both."""
        return True

    def write_cache(self, k_cache, v_cache, key, value, slot_mapping) -> None:
        write_token_major(k_cache, v_cache, key, value, slot_mapping)

    def build_metadata(
        self,
        query_start_loc: list[int],
        start_pos: list[int],
        block_tables: torch.Tensor,
        slot_mapping: torch.Tensor,
        device: torch.device,
        decodes: list[int] | None = None,
    ) -> KernelMetadata:
        counts = decode_counts(query_start_loc, decodes)
        q_lens = [b - a for a, b in pairwise(query_start_loc)]
        meta = KernelMetadata(slot_mapping=slot_mapping)
        # (request, i): its i-th query token, at position start_pos + i, one decode row each
        tokens = [(r, i) for r, n in enumerate(counts) for i in range(q_lens[r] - n, q_lens[r])]
        if tokens:
            meta.decode_batch = DecodeBatch(
                rows=torch.tensor([query_start_loc[r] + i for r, i in tokens]).to(device),
                block_tables=block_tables[torch.tensor([r for r, _ in tokens])].to(device),
                seq_lens=torch.tensor([start_pos[r] + i + 1 for r, i in tokens]).to(device),
                all_rows=len(tokens) == query_start_loc[-1],
            )
        # the tokens before a request's decodes: one prompt chunk
        prefill_rows = [r for r, n in enumerate(counts) if n < q_lens[r]]
        if prefill_rows:
            chunks = [(query_start_loc[r], q_lens[r] - counts[r], start_pos[r])
                      for r in prefill_rows]  # fmt: skip
            meta.prefill_batch = PrefillBatch(
                chunks=torch.tensor(chunks, dtype=torch.long).to(device),
                block_tables=block_tables[torch.tensor(prefill_rows)].to(device),
                max_query_len=max(n for _, n, _ in chunks),
            )
        return meta

    def decode_metadata(
        self,
        slot_mapping: torch.Tensor,
        rows: torch.Tensor,
        block_tables: torch.Tensor,
        seq_lens: torch.Tensor,
    ) -> KernelMetadata:
        batch = DecodeBatch(rows=rows, block_tables=block_tables, seq_lens=seq_lens, all_rows=True)
        return KernelMetadata(slot_mapping=slot_mapping, decode_batch=batch)

    def forward(
        self, query, key, value, k_cache, v_cache, meta: KernelMetadata,
        window: int | None = None, scale: float | None = None, softcap: float | None = None,
        sinks: torch.Tensor | None = None,
    ) -> torch.Tensor:  # fmt: skip
        sink_args: tuple[torch.Tensor, ...] = ()
        if sinks is not None:
            if not self.takes_sinks:  # the loader gives such models the reference
                raise NotImplementedError(f"the {self.name} kernels take no attention sinks")
            sink_args = (sinks.float(),)
        self.write_cache(k_cache, v_cache, key, value, meta.slot_mapping)
        scale = query.shape[-1] ** -0.5 if scale is None else scale
        window, softcap = window or 0, softcap or 0.0
        batch = meta.decode_batch
        if batch is not None and batch.all_rows:  # the kernel's rows are the step's, in order
            return self.decode_kernel(
                query.contiguous(), k_cache, v_cache, batch.block_tables, batch.seq_lens,
                scale, window, softcap, *sink_args,
            )  # fmt: skip
        out = torch.empty(query.shape, dtype=query.dtype, device=query.device)
        if batch is not None:
            out[batch.rows] = self.decode_kernel(
                query[batch.rows], k_cache, v_cache, batch.block_tables, batch.seq_lens,
                scale, window, softcap, *sink_args,
            )  # fmt: skip
        if (chunks := meta.prefill_batch) is not None:
            self.prefill_kernel(
                query, k_cache, v_cache, chunks.chunks, chunks.block_tables, out, scale, window,
                softcap, chunks.max_query_len, *sink_args,
            )  # fmt: skip
        return out
