"""Pure-PyTorch paged attention: gathers K/V block by block through block tables.

Decodes (1 query token each) go in up to `MAX_DECODE_GROUPS` groups of similar context length,
as one long context would otherwise pad every short one to its length. Each group gathers its
requests' blocks in one indexing op (whole 16-token blocks, not single slots) and is padded to
its longest member; a boolean mask hides padding and the future.

Prefill chunks (many query tokens) are attended one request at a time, because causal SDPA
skips the masked half of the scores only for a plain causal shape: padding prompts of very
different lengths into one masked batch multiplies the work by far more than the batch saves.
A chunk with nothing cached
before it attends to its own new keys (no cache read); a continuation gathers its blocks.
Index tensors are built once per step in `build_metadata`.

    flat tokens  | r0 prompt chunk (5) | r1 decode | r2 decode | r3 prompt chunk (3) |
    prefills       r0: keys = its 5 new tokens, causal; r3: keys = its blocks (earlier + new)
    decode group   query rows [r1][r2]                           keys: blocks of r1, r2
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from inflight.attention.backend import (
    prompt_and_decode_rows,
    read_token_major,
    to_cache_rows,
    token_major_shapes,
    write_token_major,
)


@dataclass
class AttentionGroup:
    token_index: torch.Tensor  # [R, Q] flat token index of each (padded) query row
    query_valid: torch.Tensor  # [R, Q] bool, False for padding rows
    block_tables: torch.Tensor  # [R, MB] blocks to gather (block 0 pads short tables)
    query_pos: torch.Tensor  # [R, Q] each query's position (padding rows at 0)
    num_keys: int  # MB * block_size
    masks: dict[int | None, torch.Tensor] = field(default_factory=dict)  # by window: `mask`

    def mask(self, window: int | None) -> torch.Tensor:
        """[R, 1, Q, MB * block_size] bool, True where the query may attend: causal, and
        within its last `window` positions where given (made once per step and window)."""
        if window not in self.masks:
            key_pos = torch.arange(self.num_keys, device=self.query_pos.device)
            mask = key_pos[None, None, :] <= self.query_pos[:, :, None]  # [R, Q, L]
            if window is not None:
                mask &= key_pos[None, None, :] > self.query_pos[:, :, None] - window
            self.masks[window] = mask.unsqueeze(1)
        return self.masks[window]


@dataclass
class PrefillChunk:
    tokens: slice  # its query rows in the flat batch
    block_table: torch.Tensor | None  # [MB] blocks holding earlier tokens; None: nothing cached
    seq_len: int  # keys to attend: cached + new
    device: torch.device
    masks: dict[int | None, torch.Tensor | None] = field(default_factory=dict)  # by window

    def mask(self, window: int | None) -> torch.Tensor | None:
        """[Q, seq_len] bool where not plainly causal (a window, a continuation), else None."""
        if window not in self.masks:
            cached = self.seq_len - (self.tokens.stop - self.tokens.start)
            mask = None
            if cached or window is not None:
                query_pos = torch.arange(cached, self.seq_len)[:, None]
                key_pos = torch.arange(self.seq_len)[None, :]
                mask = key_pos <= query_pos  # causal, aligned to the chunk's real positions
                if window is not None:
                    mask &= key_pos > query_pos - window
                mask = mask.to(self.device)
            self.masks[window] = mask
        return self.masks[window]


@dataclass
class AttentionMetadata:
    slot_mapping: torch.Tensor  # [T] cache slot written by each new token
    decode: list[AttentionGroup]  # by context length, shortest first
    prefills: list[PrefillChunk]


def _build_group(
    rows: list[int],
    query_start_loc: list[int],
    start_pos: list[int],
    block_tables: torch.Tensor,
    block_size: int,
    device: torch.device,
) -> AttentionGroup:
    q_lens = torch.tensor([query_start_loc[r + 1] - query_start_loc[r] for r in rows])
    q_start = torch.tensor([query_start_loc[r] for r in rows])
    first_pos = torch.tensor([start_pos[r] for r in rows])
    seq_lens = first_pos + q_lens
    max_q = int(q_lens.max())
    num_blocks = -(-int(seq_lens.max()) // block_size)

    q_offsets = torch.arange(max_q)
    query_valid = q_offsets[None, :] < q_lens[:, None]  # [R, Q]
    token_index = torch.where(query_valid, q_start[:, None] + q_offsets[None, :], 0)
    # Padding rows pretend to be at position 0 so they see one real key and never make NaNs.
    query_pos = torch.where(query_valid, first_pos[:, None] + q_offsets[None, :], 0)

    return AttentionGroup(
        token_index=token_index.to(device),
        query_valid=query_valid.to(device),
        block_tables=block_tables[torch.tensor(rows), :num_blocks].to(device),
        query_pos=query_pos.to(device),
        num_keys=num_blocks * block_size,
    )


def _gather(cache: torch.Tensor, block_tables: torch.Tensor) -> torch.Tensor:
    """[num_blocks, BS, KVH, D] cache, [R, MB] tables -> [R, MB * BS, KVH, D].

    NOTE: `index_select` on a 2-D view copies whole blocks as rows; advanced indexing
    (`cache[block_tables]`) makes the same copy an order of magnitude slower on the CPU."""
    r, mb = block_tables.shape
    rows = cache.view(cache.shape[0], -1).index_select(0, block_tables.flatten())
    return rows.view(r, mb * cache.shape[1], cache.shape[2], cache.shape[3])


MAX_DECODE_GROUPS = 4
MIN_DECODE_GROUP = 8  # smaller groups cost more in per-op overhead than padding saves


def split_by_length(rows: list[int], seq_lens: list[int]) -> list[list[int]]:
    """Rows sorted by context length, cut into up to MAX_DECODE_GROUPS groups of equal size."""
    if not rows:
        return []
    rows = sorted(rows, key=lambda r: seq_lens[r])
    num_groups = max(1, min(MAX_DECODE_GROUPS, len(rows) // MIN_DECODE_GROUP))
    size = -(-len(rows) // num_groups)
    return [rows[i : i + size] for i in range(0, len(rows), size)]


class TorchReferenceBackend:
    """The oracle every kernel backend is tested against; runs anywhere PyTorch does."""

    name = "torch"
    cpu_kernels = triton_kernels = graph_capturable = interpreted = False
    takes_sinks = True

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size

    def cache_shapes(
        self, num_blocks: int, num_kv_heads: int, head_dim: int, scaled: bool = False
    ) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """Token-major: blocks gathered whole, as rows of a 2-D view."""
        return token_major_shapes(num_blocks, self.block_size, num_kv_heads, head_dim, scaled)

    def values_from_keys(self, head_dim: int, dtype: torch.dtype) -> bool:
        """Token-major: the values' layout is the keys', so the same tensor serves as both."""
        return True

    def build_metadata(
        self,
        query_start_loc: list[int],
        start_pos: list[int],
        block_tables: torch.Tensor,
        slot_mapping: torch.Tensor,
        device: torch.device,
        decodes: list[int] | None = None,
    ) -> AttentionMetadata:
        # Drafts to verify (and outputs recomputed after a preemption) are attended as a prompt
        # chunk: the reference's batched decode groups round by their padding anyway, so it
        # makes no promise of matching a lone decode.
        prefill_rows, decode_rows = prompt_and_decode_rows(query_start_loc)
        prefills = [
            self._prefill_chunk(
                query_start_loc[r],
                query_start_loc[r + 1] - query_start_loc[r],
                start_pos[r],
                block_tables[r],
                device,
            )
            for r in prefill_rows
        ]
        seq_lens = [start_pos[r] + query_start_loc[r + 1] - query_start_loc[r]
                    for r in range(len(start_pos))]  # fmt: skip
        decode = [
            _build_group(
                g,
                query_start_loc,
                start_pos,
                block_tables,
                self.block_size,
                device,
            )
            for g in split_by_length(decode_rows, seq_lens)
        ]
        return AttentionMetadata(slot_mapping=slot_mapping, decode=decode, prefills=prefills)

    def decode_metadata(self, slot_mapping, rows, block_tables, seq_lens) -> AttentionMetadata:
        raise NotImplementedError("the reference backend builds no graph-capturable metadata")

    def _prefill_chunk(
        self, start: int, q_len: int, cached: int, block_table: torch.Tensor, device: torch.device
    ) -> PrefillChunk:
        seq_len = cached + q_len
        table = None
        if cached:
            table = block_table[: -(-seq_len // self.block_size)].to(device)
        return PrefillChunk(slice(start, start + q_len), table, seq_len, device)

    def forward(
        self,
        query: torch.Tensor,  # [T, H, D]
        key: torch.Tensor,  # [T, KVH, D]
        value: torch.Tensor,  # [T, KVH, D]
        k_cache: torch.Tensor,  # laid out as `cache_shapes` says
        v_cache: torch.Tensor,
        meta: AttentionMetadata,
        window: int | None = None,
        scale: float | None = None,
        softcap: float | None = None,
        sinks: torch.Tensor | None = None,
    ) -> torch.Tensor:
        write_token_major(k_cache, v_cache, key, value, meta.slot_mapping)
        out = torch.empty(query.shape, dtype=query.dtype, device=query.device)
        for g in meta.decode:
            rows = g.token_index[:, 0]
            out[rows] = self._decode(query[rows], k_cache, v_cache, g.block_tables,
                                     g.mask(window), scale, softcap, sinks)  # fmt: skip
        for chunk in meta.prefills:
            if chunk.block_table is None:  # as the cache holds them (rounded to its dtype)
                k = read_token_major(to_cache_rows(key[chunk.tokens], k_cache.dtype), query.dtype)
                v = read_token_major(to_cache_rows(value[chunk.tokens], v_cache.dtype), query.dtype)
            else:
                table = chunk.block_table[None]
                k = read_token_major(_gather(k_cache, table)[0, : chunk.seq_len], query.dtype)
                v = read_token_major(_gather(v_cache, table)[0, : chunk.seq_len], query.dtype)
            q = query[chunk.tokens].transpose(0, 1)[None]  # [1, H, Q, D]
            k, v = k.transpose(0, 1)[None], v.transpose(0, 1)[None]  # [1, KVH, L, D]
            if softcap or sinks is not None:  # scores or a softmax SDPA cannot reach
                o = _explicit_attention(q, k, v, chunk.mask(window), scale, softcap, sinks)
            else:
                o = F.scaled_dot_product_attention(
                    q, k, v, attn_mask=chunk.mask(window), is_causal=chunk.mask(window) is None,
                    scale=scale, enable_gqa=True,
                )  # fmt: skip
            out[chunk.tokens] = o[0].transpose(0, 1)
        return out

    @staticmethod
    def _decode(
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        block_tables: torch.Tensor,
        mask: torch.Tensor,
        scale: float | None,
        softcap: float | None = None,
        sinks: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """One query per request, as two batched matmuls over all KV heads at once.

        NOTE: each query head is placed in its KV head's slice of a zero [KVH * D] vector, so the
        gathered keys [R, L, KVH * D] are used as they lie in memory: GQA's head grouping would
        otherwise need a permuted copy of every gathered key and value (slower than the extra
        KVH-fold multiply-adds at q_len 1).
        """
        num_reqs, num_heads, head_dim = q.shape
        num_kv_heads = k_cache.shape[2]
        group_size = num_heads // num_kv_heads
        # [R, L, KVH * D]
        k = read_token_major(_gather(k_cache, block_tables), q.dtype).flatten(2)
        v = read_token_major(_gather(v_cache, block_tables), q.dtype).flatten(2)
        q_spread = q.new_zeros(num_reqs, num_heads, num_kv_heads, head_dim)
        kv_of_head = torch.arange(num_heads, device=q.device) // group_size
        q_spread[:, torch.arange(num_heads), kv_of_head] = q
        scores = torch.bmm(q_spread.flatten(2), k.transpose(1, 2))  # [R, H, L]
        scores = scores.float().mul_(head_dim**-0.5 if scale is None else scale)
        if softcap:
            scores = torch.tanh(scores / softcap) * softcap
        scores = scores.masked_fill_(~mask[:, :, 0, :], float("-inf"))
        probs = _softmax_with_sinks(scores, sinks).to(v.dtype)
        out = torch.bmm(probs, v).view(num_reqs, num_heads, num_kv_heads, head_dim)
        return out[:, torch.arange(num_heads), kv_of_head]  # [R, H, D]


def _softmax_with_sinks(scores: torch.Tensor, sinks: torch.Tensor | None) -> torch.Tensor:
    """Softmax over the keys of scores [R, H, (Q,) L] (heads second), each head's sink logit
    (where given) in its denominator: as transformers' gpt-oss concatenates the sink as one more
    key and drops its column after (the max subtracted first, with the sink among it)."""
    if sinks is None:
        return torch.softmax(scores, dim=-1)
    head_view = (1, -1, *([1] * (scores.dim() - 2)))
    sink = sinks.float().view(head_view).expand(*scores.shape[:-1], 1)
    combined = torch.cat([scores, sink], dim=-1)
    combined = combined - combined.max(dim=-1, keepdim=True).values
    return torch.softmax(combined, dim=-1)[..., :-1]


def _explicit_attention(
    q: torch.Tensor,  # [1, H, Q, D]
    k: torch.Tensor,  # [1, KVH, L, D]
    v: torch.Tensor,
    mask: torch.Tensor | None,  # [1, 1, Q, L] bool, True where seen; None: causal
    scale: float | None,
    softcap: float | None,
    sinks: torch.Tensor | None,
) -> torch.Tensor:
    """Attention with its scores written out, in float32, as transformers' eager attention
    computes it: each scaled score s made softcap * tanh(s / softcap) before the softmax
    (Gemma 2's), and each head's sink in the softmax's denominator (gpt-oss's)."""
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    scores = (q.float() @ k.float().transpose(-1, -2)) * (q.shape[-1] ** -0.5 if scale is None
                                                          else scale)  # fmt: skip
    if softcap:
        scores = torch.tanh(scores / softcap) * softcap
    if mask is None:
        num_q, num_k = scores.shape[-2:]
        mask = torch.ones(num_q, num_k, dtype=torch.bool, device=q.device).tril(num_k - num_q)
    scores = scores.masked_fill(~mask, float("-inf"))
    return (_softmax_with_sinks(scores, sinks).to(v.dtype) @ v).to(q.dtype)
