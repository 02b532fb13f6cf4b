"""CUDA graphs for decode-only steps: one captured forward per padded batch size, replayed.

Why: a decode step of a small model is ~35 kernels per layer, each a few microseconds of GPU
work but several times that in Python and launch on the host, so an eager step is bound by the
CPU (docs/benchmarks.md has the figures). A graph replays every launch at once.

A graph fixes its tensors' addresses and shapes, so the forward reads its inputs from static
buffers sized for the largest batch: token ids, positions, cache slots, context lengths and
block tables. A step of `n` decodes runs the graph captured for the smallest size >= n; the
padding rows point at a scratch KV block that no request owns (the cache has one block more
than the pool hands out), so they write and read only there. Steps with prompt tokens run
eagerly. Every size is captured when the engine starts (a few seconds), not when first needed.
Only decode kernels that take their lengths from tensors can be captured: backends that say
`graph_capturable` (on a GPU, the Triton backend), which build the step's metadata over the
static buffers (`decode_metadata`). With several KV groups (core/kv_groups.py) each group has
its own table and cache slots in the buffers, and each layer reads its group's metadata; a
windowed group's null blocks name the scratch block, as in eager steps.

On a CPU nothing is captured: the same buffers feed an eager forward, which is how the tests
check the buffer filling and padding on machines without a GPU.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

import torch

from inflight.attention import AttentionBackend
from inflight.core.kv_groups import KVLayout
from inflight.core.outputs import ScheduledRequest
from inflight.model.llama import LlamaModel
from inflight.runner.kv_cache import KVCache

logger = logging.getLogger(__name__)


def graph_batch_sizes(max_num_seqs: int) -> list[int]:
    """1, 2, 4, then every multiple of 8 up to `max_num_seqs` (and `max_num_seqs` itself): at
    most 7 padding rows per step, one graph per size."""
    sizes = [n for n in (1, 2, 4) if n < max_num_seqs] + list(range(8, max_num_seqs, 8))
    return [*sizes, max_num_seqs]


def supports_graphs(attn: AttentionBackend, device: torch.device) -> bool:
    """A GPU, and a decode kernel that reads lengths from tensors (no per-step Python shapes)."""
    return device.type == "cuda" and attn.graph_capturable


class DecodeGraphs:
    def __init__(
        self,
        model: LlamaModel,
        kv_cache: KVCache,
        max_num_seqs: int,
        max_model_len: int,
        device: torch.device,
        layout: KVLayout | None = None,
    ) -> None:
        if kv_cache.scratch_block is None:
            raise ValueError("decode graphs need a KV cache with a scratch block for padding")
        self.model = model
        self.attn: AttentionBackend = model.layers[0].attn
        self.kv_cache = kv_cache
        self.device = device
        self.capture = device.type == "cuda"
        self.sizes = graph_batch_sizes(max_num_seqs)
        self.block_size = kv_cache.block_size
        self.scratch = kv_cache.scratch_block
        # each layer's KV group, where there are several (group 0: the requests' `block_table`)
        self.layer_groups = layout.layer_group if layout and layout.num_groups > 1 else ()
        self.num_groups = layout.num_groups if self.layer_groups and layout else 1
        largest = self.sizes[-1]
        max_blocks = -(-max_model_len // self.block_size)
        # Rows: token id, position, context length, then each group's cache slot (one copy from
        # the host per step).
        self.scalars = torch.zeros(3 + self.num_groups, largest, dtype=torch.long, device=device)
        self.block_tables = torch.full(
            (self.num_groups, largest, max_blocks), self.scratch, dtype=torch.long, device=device
        )
        self.rows = torch.arange(largest, device=device)
        self.graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self.pool = None

    def fits(self, scheduled: Sequence[ScheduledRequest]) -> bool:
        """Whether the step is decodes only (one new token each, each sampled) and not larger
        than the largest graph."""
        return len(scheduled) <= self.sizes[-1] and all(
            s.num_tokens == 1 and s.sample for s in scheduled
        )

    def capture_all(self) -> None:
        """Captures a graph for every size now, largest first (the smaller ones reuse its memory
        pool), so that serving never pauses to capture. The buffers hold padding rows only, so
        the warm-up and captured forwards write nothing but the scratch block."""
        if not self.capture:
            return
        start = time.perf_counter()
        self.scalars[3:].fill_(self.scratch * self.block_size)  # slots; ids, positions stay 0
        self.scalars[2].fill_(1)  # context lengths
        for size in reversed(self.sizes):
            self.graphs[size] = self._capture(size)
        logger.info(
            "captured %d decode graphs (1 to %d sequences) in %.1f s",
            len(self.sizes), self.sizes[-1], time.perf_counter() - start,
        )  # fmt: skip

    def load(self, scheduled: Sequence[ScheduledRequest]) -> int:
        """Writes the step's inputs into the static buffers and returns the padded batch size;
        padding rows sit at position 0 of the scratch block, with a context of 1."""
        block_size, size = self.block_size, next(n for n in self.sizes if n >= len(scheduled))
        pad = size - len(scheduled)
        positions = [s.start_pos for s in scheduled]
        pad_slot = self.scratch * block_size
        rows = [[s.token_ids[0] for s in scheduled] + [0] * pad, positions + [0] * pad,
                [pos + 1 for pos in positions] + [1] * pad]  # fmt: skip
        width = max(len(s.block_table) for s in scheduled)
        tables = []
        for g in range(self.num_groups):
            group = [self._table(s, g) for s in scheduled]
            slots = [t[p // block_size] * block_size + p % block_size
                     for t, p in zip(group, positions, strict=True)]  # fmt: skip
            rows.append(slots + [pad_slot] * pad)
            tables.append([t + [self.scratch] * (width - len(t)) for t in group]
                          + [[self.scratch] * width] * pad)  # fmt: skip
        # Columns past `width` keep older entries: the kernel never reads past a context.
        self.scalars[:, :size].copy_(torch.tensor(rows, dtype=torch.long))
        self.block_tables[:, :size, :width].copy_(torch.tensor(tables, dtype=torch.long))
        return size

    def _table(self, scheduled: ScheduledRequest, group: int) -> list[int]:
        """The request's table of `group`, null blocks (pages a window gave back) as the
        scratch block, which its window never reads."""
        table = scheduled.block_table if group == 0 else scheduled.group_tables[group - 1]
        return [self.scratch if b < 0 else b for b in table] if group else list(table)

    def forward(self, size: int, num: int) -> torch.Tensor:
        """Logits [num, vocab] of the loaded step: the graph of `size` replayed (a view of its
        output, valid until the next step), or on a CPU an eager forward on the buffers."""
        if size in self.graphs:
            graph, logits = self.graphs[size]
            graph.replay()
        else:
            logits = self._eager_forward(size)
        return logits[:num]

    def _metadata(self, size: int, group: int) -> Any:
        return self.attn.decode_metadata(
            self.scalars[3 + group, :size], self.rows[:size], self.block_tables[group, :size],
            self.scalars[2, :size],
        )  # fmt: skip

    def _eager_forward(self, size: int) -> torch.Tensor:
        metas = [self._metadata(size, g) for g in range(self.num_groups)]
        return self.model(
            self.scalars[0, :size],
            self.scalars[1, :size],
            self.kv_cache.layers,
            metas[0],
            self.rows[:size],
            [metas[g] for g in self.layer_groups] if self.layer_groups else None,
        )

    def _capture(self, size: int) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
        """Warms up on a side stream (as PyTorch requires, and to compile the Triton kernels),
        then records one forward."""
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            self._eager_forward(size)
        torch.cuda.current_stream(self.device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            logits = self._eager_forward(size)
        self.pool = graph.pool()
        return graph, logits
