"""KV pool sizing, in plain integers: shared by the engine and the simulator so both size the
pool, and refuse impossible configurations, by the same rules.

The pool gets what the memory budget buys, capped at what `max_num_seqs` sequences of
`max_model_len` tokens could ever hold (a small model does not reserve memory it can never use).
`max_model_len` defaults to the model's limit and shrinks to the pool's capacity when it was not
set explicitly; an explicit one the pool cannot hold is an error (such a request would be
preempted forever).
"""

from __future__ import annotations

from dataclasses import dataclass

from inflight.errors import ConfigError


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def num_blocks_for_budget(
    bytes_per_token: int,
    block_size: int,
    memory_bytes: int,
    max_num_seqs: int,
    max_model_len: int,
) -> int:
    per_block = bytes_per_token * block_size
    useful = max_num_seqs * cdiv(max_model_len, block_size)
    return max(1, min(memory_bytes // per_block, useful))


def resolve_max_model_len(
    requested: int | None, model_limit: int, num_blocks: int, block_size: int
) -> int:
    max_model_len = requested or model_limit
    if max_model_len > model_limit:
        raise ConfigError(f"max_model_len {max_model_len} exceeds the model's limit {model_limit}")
    capacity = num_blocks * block_size
    if capacity < max_model_len:
        if requested is not None:
            raise ConfigError(
                f"the KV cache holds {capacity} tokens ({num_blocks} blocks of {block_size}), "
                f"fewer than max_model_len={max_model_len}; raise the KV budget or lower "
                "max_model_len"
            )
        max_model_len = capacity
    return max_model_len


@dataclass(frozen=True)
class KVPlan:
    num_blocks: int  # of the device pool
    max_model_len: int
    num_cpu_blocks: int  # of the swap space (0 unless preemption swaps)


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
) -> KVPlan:
    """The pool an engine (or a simulated replica) gets: `num_kv_blocks` blocks, or what
    `memory_bytes` buys capped at what `max_num_seqs` sequences could use; `max_model_len`
    resolved against it; and the swap space's blocks (`swap_space_bytes` over each block's
    `swap_bytes_per_token`, by default `bytes_per_token`: a drafter's KV is not swapped)."""
    num_blocks = num_kv_blocks or num_blocks_for_budget(
        bytes_per_token, block_size, memory_bytes, max_num_seqs, requested_len or model_limit
    )
    max_model_len = resolve_max_model_len(requested_len, model_limit, num_blocks, block_size)
    per_swapped_block = (swap_bytes_per_token or bytes_per_token) * block_size
    return KVPlan(num_blocks, max_model_len, swap_space_bytes // per_swapped_block)
