"""Every prompt chunk of a step in one attention call per layer, for GPUs.

The reference backend attends prompt chunks one at a time: on a CPU, padding them into one batch
costs more FLOPs than it saves. On a GPU the FLOPs are cheap and the launches are not: each
chunk is ~8 kernels a layer at ~10-30 us of host time each, so a step of 30 prompt chunks spent
~50 ms queueing kernels for 30 layers (H100, measured in the first GPU session). Here the
queries of all chunks attend, in one SDPA call, to all their keys, gathered from the cache
(where the new tokens were written just before); a mask keeps each query to its own request's
positions up to its own (and inside its sliding window). The mask is quadratic in the step's
query and key counts, so steps over `FLAT_MASK_LIMIT` elements (long cached contexts) keep the
chunk-by-chunk path.

    queries  | r0: 5 new | r3: 3 new |       keys | r0: 0..4 | r3: 0..10 (8 cached) |
    mask     r0's rows see r0's keys up to their position; r3's rows see r3's keys likewise
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

# Mask elements: a full default step of fresh prompts (2,048 queries x 2,048 keys) fits; where
# SDPA falls back to its math kernel, the float32 scores are heads x this x 4 bytes (512 MiB
# for 32 heads). Beyond it, chunk by chunk.
FLAT_MASK_LIMIT = 1 << 22


@dataclass
class FlatPrefill:
    query_rows: torch.Tensor  # [Q] flat token index of each prompt query
    key_slots: torch.Tensor  # [K] cache slot of each key (every position of every chunk's request)
    mask: torch.Tensor  # [Q, K] bool, True where the query may attend


def build_flat_prefill(
    rows: list[int],
    query_start_loc: list[int],
    start_pos: list[int],
    block_tables: torch.Tensor,  # [R, MB], on the CPU
    block_size: int,
    sliding_window: int | None,
    device: torch.device,
) -> FlatPrefill | None:
    """The step's prompt chunks (`rows`) as one attention, or None when the mask would be too
    large. Built on the CPU once per step, shared by every layer."""
    q_lens = torch.tensor([query_start_loc[r + 1] - query_start_loc[r] for r in rows])
    cached = torch.tensor([start_pos[r] for r in rows])
    seq_lens = cached + q_lens
    num_queries, num_keys = int(q_lens.sum()), int(seq_lens.sum())
    if num_queries * num_keys > FLAT_MASK_LIMIT:
        return None
    chunks = torch.arange(len(rows))

    def ranges(lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(owner chunk, offset in its range) of every element of ranges 0..length-1."""
        owner = torch.repeat_interleave(chunks, lengths)
        first = torch.cumsum(lengths, 0) - lengths  # where each chunk's range begins
        return owner, torch.arange(int(lengths.sum())) - first[owner]

    query_owner, offset = ranges(q_lens)
    query_rows = torch.tensor([query_start_loc[r] for r in rows])[query_owner] + offset
    query_pos = cached[query_owner] + offset
    key_owner, key_pos = ranges(seq_lens)
    tables = block_tables[torch.tensor(rows)]
    key_slots = tables[key_owner, key_pos // block_size] * block_size + key_pos % block_size
    mask = (query_owner[:, None] == key_owner[None, :]) & (key_pos[None, :] <= query_pos[:, None])
    if sliding_window is not None:
        mask &= key_pos[None, :] > query_pos[:, None] - sliding_window
    return FlatPrefill(query_rows.to(device), key_slots.to(device), mask.to(device))


def attend_flat_prefill(
    query: torch.Tensor,  # [T, H, D]
    k_cache: torch.Tensor,  # [NB, BS, KVH, D], the step's new keys already written
    v_cache: torch.Tensor,
    flat: FlatPrefill,
    out: torch.Tensor,  # [T, H, D]: the prompt rows are written
) -> None:
    num_kv_heads, head_dim = k_cache.shape[2], k_cache.shape[3]
    q = query[flat.query_rows].transpose(0, 1)[None]  # [1, H, Q, D]
    k = k_cache.view(-1, num_kv_heads, head_dim)[flat.key_slots].transpose(0, 1)[None]
    v = v_cache.view(-1, num_kv_heads, head_dim)[flat.key_slots].transpose(0, 1)[None]
    o = F.scaled_dot_product_attention(q, k, v, attn_mask=flat.mask, enable_gqa=True)
    out[flat.query_rows] = o[0].transpose(0, 1)
