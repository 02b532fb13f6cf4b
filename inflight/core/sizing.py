"""KV pool sizing, in plain integers: shared by the engine and the simulator so both size the
pool, and refuse impossible configurations, by the same rules.

The pool gets what the memory budget buys, capped at what `max_num_seqs` sequences of
`max_model_len` tokens could ever hold (a small model does not reserve memory it can never use).
`max_model_len` defaults to the model's limit and shrinks to the pool's capacity when it was not
set explicitly; an explicit one the pool cannot hold is an error (such a request would be
preempted forever).

With KV groups (`kv_groups.py`) the pool's unit is a page, and a sequence's pages are its full
groups' blocks plus, in each windowed group, at most the blocks its window and one step's chunk
reach (`peak_pages`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from inflight.errors import ConfigError


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def peak_pages(
    num_tokens: int,
    block_size: int,
    group_windows: Sequence[int | None] = (None,),
    chunk: int = 1,
) -> int:
    """The most pages a sequence of `num_tokens` tokens holds, computed in steps of at most
    `chunk` tokens: `cdiv(num_tokens, block_size)` for a model of one full group."""
    blocks = cdiv(num_tokens, block_size)
    return sum(blocks if w is None else min(blocks, cdiv(w - 1 + chunk, block_size) + 1)
               for w in group_windows)  # fmt: skip


def num_blocks_for_budget(
    bytes_per_token: int,
    block_size: int,
    memory_bytes: int,
    max_num_seqs: int,
    max_model_len: int,
    group_windows: Sequence[int | None] = (None,),
    chunk: int = 1,
) -> int:
    """`bytes_per_token`: of one page's layers (every layer's, for a model of one group)."""
    per_block = bytes_per_token * block_size
    useful = max_num_seqs * peak_pages(max_model_len, block_size, group_windows, chunk)
    return max(1, min(memory_bytes // per_block, useful))


def resolve_max_model_len(
    requested: int | None, model_limit: int, num_blocks: int, block_size: int,
    group_windows: Sequence[int | None] = (None,), chunk: int = 1,
) -> int:  # fmt: skip
    max_model_len = requested or model_limit
    if max_model_len > model_limit:
        raise ConfigError(f"max_model_len {max_model_len} exceeds the model's limit {model_limit}")

    def fits(length: int) -> bool:
        return peak_pages(length, block_size, group_windows, chunk) <= num_blocks

    if not fits(max_model_len):
        # the longest sequence the pool holds, in whole blocks
        low, high = 0, cdiv(max_model_len, block_size)
        while low < high:
            mid = (low + high + 1) // 2
            low, high = (mid, high) if fits(mid * block_size) else (low, mid - 1)
        capacity = low * block_size
        if requested is not None:
            raise ConfigError(
                f"the KV cache holds {capacity} tokens of a sequence ({num_blocks} blocks of "
                f"{block_size}), fewer than max_model_len={max_model_len}; raise the KV budget "
                "or lower max_model_len"
            )
        max_model_len = capacity
    return max_model_len


@dataclass(frozen=True)
class KVPlan:
    num_blocks: int  # of the device pool
    max_model_len: int
    num_cpu_blocks: int  # of the swap space (0 unless preemption swaps)
    # what a swapped request's sequence state costs there (a state-carrying model's)
    swap_state_blocks: int = 0


def plan_kv_pool(
    *,
    bytes_per_token: int,
    block_size: int,
    memory_bytes: int,
    num_kv_blocks: int | None,
    max_num_seqs: int,
    requested_len: int | None,
    model_limit: int,
    swap_space_bytes: int = 0,
    swap_bytes_per_token: int | None = None,
    swap_state_bytes: int = 0,
    group_windows: Sequence[int | None] = (None,),
    chunk: int = 1,
) -> KVPlan:
    """The pool an engine (or a simulated replica) gets: `num_kv_blocks` blocks, or what
    `memory_bytes` buys capped at what `max_num_seqs` sequences could use; `max_model_len`
    resolved against it; and the swap space's blocks (`swap_space_bytes` over each block's
    `swap_bytes_per_token`, by default `bytes_per_token`: a drafter's KV is not swapped; a
    swapped request's `swap_state_bytes` are charged to it as the blocks they would fill). With
    KV groups, blocks are pages and `bytes_per_token` one page's layers' (`chunk`: the most
    tokens a step computes for a sequence)."""
    num_blocks = num_kv_blocks or num_blocks_for_budget(
        bytes_per_token, block_size, memory_bytes, max_num_seqs, requested_len or model_limit,
        group_windows, chunk,
    )  # fmt: skip
    max_model_len = resolve_max_model_len(requested_len, model_limit, num_blocks, block_size,
                                          group_windows, chunk)  # fmt: skip
    per_swapped_block = (swap_bytes_per_token or bytes_per_token) * block_size
    num_cpu_blocks = swap_space_bytes // per_swapped_block
    state_blocks = cdiv(swap_state_bytes, per_swapped_block) if num_cpu_blocks else 0
    return KVPlan(num_blocks, max_model_len, num_cpu_blocks, state_blocks)
