"""KV pool sizing (`core/sizing.py`), the one recipe the engine and the simulator share: blocks
from the budget capped at what the seats could use, an explicit count as given, max_model_len
shrunk to the pool unless asked for, and the swap space's blocks."""

from __future__ import annotations

import pytest

from inflight.core.sizing import KVPlan, plan_kv_pool
from inflight.errors import ConfigError

BASE = dict(bytes_per_token=1024, block_size=16, memory_bytes=2**20, num_kv_blocks=None,
            max_num_seqs=4, requested_len=None, model_limit=4096)  # fmt: skip


def test_the_budget_buys_blocks_up_to_what_the_seats_could_use():
    # 1 MiB at 16 KiB a block buys 64 blocks; 4 seats of 4,096 positions could use 1,024
    assert plan_kv_pool(**BASE) == KVPlan(num_blocks=64, max_model_len=1024, num_cpu_blocks=0)
    # a small model limit caps the pool: 4 seats of 64 positions use 16 blocks
    assert plan_kv_pool(**{**BASE, "model_limit": 64}) == KVPlan(16, 64, 0)
    assert plan_kv_pool(**{**BASE, "num_kv_blocks": 8}).num_blocks == 8  # as given


def test_an_explicit_max_model_len_the_pool_cannot_hold_is_refused():
    assert plan_kv_pool(**{**BASE, "requested_len": 512}).max_model_len == 512
    with pytest.raises(ConfigError, match="fewer than max_model_len=2048"):
        plan_kv_pool(**{**BASE, "requested_len": 2048})
    with pytest.raises(ConfigError, match="exceeds the model's limit"):
        plan_kv_pool(**{**BASE, "requested_len": 8192})


def test_swap_space_counts_the_swapped_models_bytes_only():
    # a drafter's KV doubles the pool's bytes a token but is recomputed, never swapped
    plan = plan_kv_pool(**{**BASE, "bytes_per_token": 2048}, swap_space_bytes=2**20,
                        swap_bytes_per_token=1024)  # fmt: skip
    assert (plan.num_blocks, plan.num_cpu_blocks) == (32, 64)
    assert plan_kv_pool(**BASE, swap_space_bytes=2**20).num_cpu_blocks == 64


def test_a_swapped_state_costs_the_swap_blocks_its_bytes_fill():
    per_block = BASE["bytes_per_token"] * BASE["block_size"]
    plan = plan_kv_pool(**BASE, swap_space_bytes=2**20, swap_state_bytes=2 * per_block + 1)
    assert (plan.num_cpu_blocks, plan.swap_state_blocks) == (64, 3)
    assert plan_kv_pool(**BASE, swap_state_bytes=per_block).swap_state_blocks == 0  # no swap
