"""CPU paged-attention backend: the reference backend's metadata and cache writes, with decodes
and prompt chunks computed by C++ kernels (`inflight/kernels/csrc/paged_attention.cpp`,
`prefill_attention.cpp`) that read K/V in place through the block tables: no gathered copy of
the cache, no padding, no masks, GQA without repeating heads, one call per layer for all
decodes and one for all prompt chunks.

The kernels are compiled on first use (`inflight.kernels`); `auto` falls back to the pure
PyTorch backend, with a warning, when no compiler is available. `PagedKernelBackend`, the
plumbing for kernels that read the cache in place, is shared with the Triton backend.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import torch

from inflight.attention.torch_ref import AttentionMetadata, TorchReferenceBackend
from inflight.errors import ConfigError
from inflight.kernels import load_extension

logger = logging.getLogger(__name__)


@dataclass
class DecodeBatch:
    """Every decode of the step, for the kernel: no grouping, no masks."""

    rows: torch.Tensor  # [R] flat token index of each decode (its only query token)
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
class KernelMetadata(AttentionMetadata):
    decode_batch: DecodeBatch | None = None
    prefill_batch: PrefillBatch | None = None


class PagedKernelBackend(TorchReferenceBackend):
    """The reference backend with every decode of a step computed by one kernel call per layer,
    `decode_kernel(q [R, H, D], k_cache, v_cache, block_tables [R, MB], seq_lens [R], scale,
    window) -> [R, H, D]`, and every prompt chunk by another, `prefill_kernel(query, k_cache,
    v_cache, chunks [C, 3], block_tables [C, MB], out, scale, window)`, both reading the cache
    in place. Subclasses say which kernels."""

    decode_kernel: Callable[..., torch.Tensor]
    prefill_kernel: Callable[..., None]

    def _with_decodes(
        self, meta, rows, query_start_loc, seq_lens, block_tables, group, device
    ) -> KernelMetadata:
        if not isinstance(meta, KernelMetadata):
            meta = KernelMetadata(**vars(meta))
        if rows:
            index = torch.tensor(rows)
            meta.decode_batch = DecodeBatch(
                rows=torch.tensor([query_start_loc[r] for r in rows]).to(device),
                block_tables=block_tables[index].to(device),
                seq_lens=torch.tensor([seq_lens[r] for r in rows]).to(device),
                all_rows=len(rows) == query_start_loc[-1],
            )
        return meta

    def _attend_decodes(self, query, k_cache, v_cache, meta, out) -> None:
        batch = meta.decode_batch
        if batch is None:
            return
        head_dim = query.shape[-1]
        out[batch.rows] = self.decode_kernel(
            query[batch.rows], k_cache, v_cache, batch.block_tables, batch.seq_lens,
            head_dim**-0.5, self.sliding_window or 0,
        )  # fmt: skip

    def _with_prefills(
        self, meta, rows, query_start_loc, start_pos, block_tables, device
    ) -> KernelMetadata:
        batch = None
        if rows:
            chunks = [
                (query_start_loc[r], query_start_loc[r + 1] - query_start_loc[r], start_pos[r])
                for r in rows
            ]
            batch = PrefillBatch(
                chunks=torch.tensor(chunks, dtype=torch.long).to(device),
                block_tables=block_tables[torch.tensor(rows)].to(device),
                max_query_len=max(n for _, n, _ in chunks),
            )
        if not isinstance(meta, KernelMetadata):
            meta = KernelMetadata(**vars(meta))
        meta.prefill_batch = batch
        return meta

    def _attend_prefills(self, query, key, value, k_cache, v_cache, meta, out) -> None:
        batch = meta.prefill_batch
        if batch is not None:
            self.prefill_kernel(
                query, k_cache, v_cache, batch.chunks, batch.block_tables, out,
                query.shape[-1] ** -0.5, self.sliding_window or 0,
            )  # fmt: skip


class CpuKernelBackend(PagedKernelBackend):
    name = "cpu"

    def __init__(self, block_size: int, sliding_window: int | None = None) -> None:
        super().__init__(block_size, sliding_window)
        ext = load_extension()
        self.decode_kernel = ext.paged_decode_attention
        self.prefill_kernel = ext.paged_prefill_attention
        self._write_kv = ext.write_kv_cache

    def cache_shapes(
        self, num_blocks: int, num_kv_heads: int, head_dim: int
    ) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """Keys [NB, KVH, D/2, BS, 2] (each block's keys transposed, in pairs of dims), values
        [NB, KVH, BS, D]: every (block, head) one contiguous run (`csrc/kv_layout.h` says why)."""
        if head_dim % 2:
            raise ValueError(f"the CPU attention kernels need an even head_dim, got {head_dim}")
        bs = self.block_size
        return (num_blocks, num_kv_heads, head_dim // 2, bs, 2), (
            num_blocks,
            num_kv_heads,
            bs,
            head_dim,
        )

    def write_cache(self, k_cache, v_cache, key, value, slot_mapping) -> None:
        self._write_kv(k_cache, v_cache, key, value, slot_mapping)


def to_kernel_layout(
    k_cache: torch.Tensor, v_cache: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Token-major caches [NB, BS, KVH, D] (the reference backend's) in `CpuKernelBackend`'s
    layout: copies, for tests and for comparing the two backends on the same contents."""
    nb, bs, kvh, d = k_cache.shape
    keys = k_cache.view(nb, bs, kvh, d // 2, 2).permute(0, 2, 3, 1, 4).contiguous()
    return keys, v_cache.permute(0, 2, 1, 3).contiguous()


def make_backend(
    name: str, block_size: int, sliding_window: int | None, device: torch.device
) -> TorchReferenceBackend:
    """`torch` (the reference), `cpu` (the C++ kernels), `triton` (the Triton decode kernel) or
    `auto` (the C++ kernels on a CPU, Triton on a GPU, each when it can run, else the reference
    with a warning). A kernel named outright that cannot run is an error."""
    if name == "torch":
        return TorchReferenceBackend(block_size, sliding_window)
    if name == "cpu" and device.type != "cpu":
        raise ConfigError(
            f"the cpu attention backend (C++ kernels) reads host memory; the model is on "
            f"{device.type}: use triton or torch there"
        )
    if name == "auto":
        name = "cpu" if device.type == "cpu" else "triton"
        strict = False
    else:
        strict = True
    try:
        if name == "triton":
            from inflight.attention.triton_decode import TritonBackend

            return TritonBackend(block_size, sliding_window)
        return CpuKernelBackend(block_size, sliding_window)
    except Exception as e:
        if strict:
            raise
        logger.warning("%s attention kernel unavailable (%s); using the PyTorch reference", name, e)
        return TorchReferenceBackend(block_size, sliding_window)
