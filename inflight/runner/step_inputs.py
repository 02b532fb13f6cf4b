"""The flat batch of one forward pass, built on the CPU and then copied once each to the device:

input_ids        [T]    every scheduled token of every request, concatenated
positions        [T]    each token's position in its sequence
slot_mapping     [T]    block_table[pos // block_size] * block_size + pos % block_size
query_start_loc  [R+1]  where each request's tokens start in the flat row
seq_lens         [R]    tokens in the KV cache after this step, per request
block_tables     [R, max_blocks]
logits_indices   [S+P]  flat index of the last token of each request that samples (and of
                        each draft), then of every prompt position that scores a prompt token
                        for a request that wants prompt logprobs (`prompt_rows` says whose)

A model of several KV groups (core/kv_groups.py) gets block tables, slot mappings and the
backend's metadata for each group, and `layer_metadata` names each layer's; a windowed group's
null blocks become the scratch block, which its window never reads.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from inflight.attention import AttentionBackend
from inflight.core.kv_groups import KVLayout
from inflight.core.outputs import ScheduledRequest


@dataclass
class StepInputs:
    input_ids: torch.Tensor
    positions: torch.Tensor
    slot_mapping: torch.Tensor
    query_start_loc: list[int]
    seq_lens: list[int]
    block_tables: torch.Tensor
    logits_indices: torch.Tensor
    attn_metadata: Any  # the backend's own (group 0's)
    # after the sampling rows: (request id, its first row's position, number of rows)
    prompt_rows: list[tuple[str, int, int]]
    layer_metadata: list[Any] | None = None  # each layer's group's, with several groups
    conv_step: Any = None  # the convolution state's reads and writes (`runner/conv_state.py`)


def kv_group_args(layout: KVLayout | None, kv_cache: Any) -> tuple[Sequence[int], int | None]:
    """`build_step_inputs`' `layer_groups` and `null_block` for a pool of `layout`: each
    layer's group where there are several, and the scratch block for windowed groups' nulls."""
    windowed = layout is not None and any(w is not None for w in layout.group_windows)
    layer_groups = layout.layer_group if layout and layout.num_groups > 1 else ()
    return layer_groups, kv_cache.scratch_block if windowed else None


def build_step_inputs(
    scheduled: list[ScheduledRequest],
    block_size: int,
    attn_backend: AttentionBackend,
    device: torch.device,
    score_prompts: bool = True,
    every_row: bool = False,
    layer_groups: Sequence[int] = (),
    null_block: int | None = None,
) -> StepInputs:
    """The flat batch of `scheduled` (the module docstring lists its tensors), for any model
    whose KV cache has the pool's block layout: the target's, or its drafter's (which scores
    no prompt: `score_prompts` False). `every_row`: the outputs of every token, in order (an
    embedding model that pools them all), in place of the sampling rows. `layer_groups`: each
    layer's KV group, where there are several; `null_block` stands in for the null blocks of
    windowed groups."""
    input_ids: list[int] = []
    start_pos: list[int] = []
    query_start_loc = [0]
    logits_indices: list[int] = []
    prompt_indices: list[int] = []
    prompt_rows: list[tuple[str, int, int]] = []
    for s in scheduled:
        input_ids.extend(s.token_ids)
        start_pos.append(s.start_pos)
        query_start_loc.append(query_start_loc[-1] + s.num_tokens)
        if every_row:
            logits_indices.extend(range(query_start_loc[-2], query_start_loc[-1]))
        elif s.sample:  # the last token's logits, and each draft's before it
            end = query_start_loc[-1]
            logits_indices.extend(range(end - 1 - len(s.draft_token_ids), end))
        scoring = s.prompt_logprob_positions if score_prompts else range(0)
        if scoring:
            first = query_start_loc[-2] + scoring.start - s.start_pos
            prompt_indices.extend(range(first, first + len(scoring)))
            prompt_rows.append((s.request_id, scoring.start, len(scoring)))
    logits_indices += prompt_indices

    seq_lens = [s.start_pos + s.num_tokens for s in scheduled]
    max_blocks = max(len(s.block_table) for s in scheduled)
    # positions: for each request, start_pos .. start_pos + q_len - 1 (lists: a decode step's
    # few values cost more as tensor ops' dispatch than as Python)
    positions = [p for s in scheduled for p in range(s.start_pos, s.start_pos + s.num_tokens)]
    # Every token at or past its request's prompt attends as a decode (`DecodeBatch`): the
    # newest token, the drafts after it, and outputs recomputed after a preemption, which so
    # get the values they got when first decoded (a prompt chunk's kernel rounds otherwise).
    decodes = [max(0, s.start_pos + s.num_tokens - max(s.start_pos, len(s.prompt_token_ids)))
               for s in scheduled]  # fmt: skip

    def group_inputs(tables: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor, Any]:
        if null_block is not None:
            tables = [[null_block if b < 0 else b for b in t] for t in tables]
        # one tensor from padded lists: a tensor per row costs a Python call each, per step
        padded = torch.tensor([t + [0] * (max_blocks - len(t)) for t in tables], dtype=torch.long)
        slots = torch.tensor([table[p // block_size] * block_size + p % block_size
                              for table, s in zip(tables, scheduled, strict=True)
                              for p in range(s.start_pos, s.start_pos + s.num_tokens)],
                             dtype=torch.long).to(device)  # fmt: skip
        meta = attn_backend.build_metadata(query_start_loc, start_pos, padded, slots, device,
                                           decodes)  # fmt: skip
        return padded, slots, meta

    block_tables, slot_mapping, meta = group_inputs([s.block_table for s in scheduled])
    layer_metadata = None
    if any(layer_groups):
        metas = [meta]
        for g in range(1, max(layer_groups) + 1):
            metas.append(group_inputs([s.group_tables[g - 1] for s in scheduled])[2])
        layer_metadata = [metas[g] for g in layer_groups]
    return StepInputs(
        input_ids=torch.tensor(input_ids, device=device),
        positions=torch.tensor(positions, dtype=torch.long, device=device),
        slot_mapping=slot_mapping,
        query_start_loc=query_start_loc,
        seq_lens=seq_lens,
        block_tables=block_tables,
        logits_indices=torch.tensor(logits_indices, dtype=torch.long, device=device),
        attn_metadata=meta,
        prompt_rows=prompt_rows,
        layer_metadata=layer_metadata,
    )
