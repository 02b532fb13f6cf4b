"""Pure-PyTorch paged attention: gathers K/V through block tables, one SDPA call per group.

Requests are split into two groups so padding stays small: decodes (1 query token each) and
prefills (many). Each group is padded to its longest member and runs as one batched
`scaled_dot_product_attention` with a boolean mask, so there is no per-request Python loop
inside a layer. All index tensors are built once per step in `build_metadata`.

    flat tokens  | r0 prompt chunk (5) | r1 decode | r2 decode | r3 prompt chunk (3) |
    prefill group  query rows [r0: 5 real][r3: 3 real + 2 pad]   keys padded to max seq_len
    decode group   query rows [r1][r2]                           keys padded to max seq_len
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass
class AttentionGroup:
    token_index: torch.Tensor  # [R, Q] flat token index of each (padded) query row
    query_valid: torch.Tensor  # [R, Q] bool, False for padding rows
    kv_slots: torch.Tensor  # [R, L] cache slot of each key position (0 where padded)
    mask: torch.Tensor  # [R, 1, Q, L] bool, True where the query may attend the key


@dataclass
class AttentionMetadata:
    slot_mapping: torch.Tensor  # [T] cache slot written by each new token
    decode: AttentionGroup | None
    prefill: AttentionGroup | None


def _build_group(
    rows: list[int],
    query_start_loc: list[int],
    start_pos: list[int],
    block_tables: torch.Tensor,
    block_size: int,
    sliding_window: int | None,
    device: torch.device,
) -> AttentionGroup:
    q_lens = torch.tensor([query_start_loc[r + 1] - query_start_loc[r] for r in rows])
    q_start = torch.tensor([query_start_loc[r] for r in rows])
    first_pos = torch.tensor([start_pos[r] for r in rows])
    seq_lens = first_pos + q_lens
    max_q, max_len = int(q_lens.max()), int(seq_lens.max())

    q_offsets = torch.arange(max_q)
    query_valid = q_offsets[None, :] < q_lens[:, None]  # [R, Q]
    token_index = torch.where(query_valid, q_start[:, None] + q_offsets[None, :], 0)
    # Padding rows pretend to be at position 0 so they see one key and never make NaNs.
    query_pos = torch.where(query_valid, first_pos[:, None] + q_offsets[None, :], 0)

    key_pos = torch.arange(max_len)  # [L]
    tables = block_tables[torch.tensor(rows)]  # [R, max_blocks]
    block_index = (key_pos // block_size).clamp(max=tables.shape[1] - 1)
    kv_slots = tables[:, block_index] * block_size + key_pos % block_size  # [R, L]
    key_valid = key_pos[None, :] < seq_lens[:, None]
    kv_slots = torch.where(key_valid, kv_slots, 0)

    mask = key_pos[None, None, :] <= query_pos[:, :, None]  # [R, Q, L] causal
    if sliding_window is not None:
        mask &= key_pos[None, None, :] > query_pos[:, :, None] - sliding_window
    return AttentionGroup(
        token_index=token_index.to(device),
        query_valid=query_valid.to(device),
        kv_slots=kv_slots.to(device),
        mask=mask.unsqueeze(1).to(device),
    )


class TorchReferenceBackend:
    name = "torch"

    def __init__(self, block_size: int, sliding_window: int | None = None) -> None:
        self.block_size = block_size
        self.sliding_window = sliding_window

    def build_metadata(
        self,
        query_start_loc: list[int],
        start_pos: list[int],
        block_tables: torch.Tensor,
        slot_mapping: torch.Tensor,
        device: torch.device,
    ) -> AttentionMetadata:
        """Index tensors shared by every layer of one step (CPU lists in, device tensors out)."""
        num_reqs = len(start_pos)
        decode_rows = [
            r for r in range(num_reqs) if query_start_loc[r + 1] - query_start_loc[r] == 1
        ]
        prefill_rows = [
            r for r in range(num_reqs) if query_start_loc[r + 1] - query_start_loc[r] > 1
        ]

        def group(rows: list[int]) -> AttentionGroup | None:
            if not rows:
                return None
            return _build_group(
                rows,
                query_start_loc,
                start_pos,
                block_tables,
                self.block_size,
                self.sliding_window,
                device,
            )

        return AttentionMetadata(
            slot_mapping=slot_mapping, decode=group(decode_rows), prefill=group(prefill_rows)
        )

    def forward(
        self,
        query: torch.Tensor,  # [T, H, D]
        key: torch.Tensor,  # [T, KVH, D]
        value: torch.Tensor,  # [T, KVH, D]
        k_cache: torch.Tensor,  # [num_blocks, block_size, KVH, D]
        v_cache: torch.Tensor,
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        num_kv_heads, head_dim = k_cache.shape[2], k_cache.shape[3]
        k_flat = k_cache.view(-1, num_kv_heads, head_dim)  # [slots, KVH, D]
        v_flat = v_cache.view(-1, num_kv_heads, head_dim)
        k_flat.index_copy_(0, meta.slot_mapping, key)
        v_flat.index_copy_(0, meta.slot_mapping, value)

        out = torch.empty_like(query)
        for group in (meta.decode, meta.prefill):
            if group is None:
                continue
            q = query[group.token_index].transpose(1, 2)  # [R, H, Q, D]
            k = k_flat[group.kv_slots].transpose(1, 2)  # [R, KVH, L, D]
            v = v_flat[group.kv_slots].transpose(1, 2)
            o = F.scaled_dot_product_attention(q, k, v, attn_mask=group.mask, enable_gqa=True)
            o = o.transpose(1, 2)  # [R, Q, H, D]
            out[group.token_index[group.query_valid]] = o[group.query_valid]
        return out
