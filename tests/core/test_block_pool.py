from __future__ import annotations

import pytest

from inflight.core.block_pool import BlockPool, NoFreeBlocksError, SwapSpace
from inflight.core.kv_cache_manager import KVCacheManager
from tests.core.helpers import make_request


def test_allocate_and_free_keep_accounting_exact():
    pool = BlockPool(8)
    a = pool.allocate(3)
    b = pool.allocate(2)
    assert a == [0, 1, 2] and b == [3, 4]
    assert (pool.num_free_blocks, pool.num_used_blocks) == (3, 5)
    pool.free(a)
    assert (pool.num_free_blocks, pool.num_used_blocks) == (6, 2)
    # Freed blocks join the tail: never-used blocks are handed out first.
    assert pool.allocate(3) == [5, 6, 7]
    pool.check_invariants()


def test_over_allocation_and_double_free_are_errors():
    pool = BlockPool(2)
    ids = pool.allocate(2)
    with pytest.raises(NoFreeBlocksError):
        pool.allocate(1)
    pool.free(ids)
    with pytest.raises(RuntimeError, match="double free"):
        pool.free([ids[0]])


def test_swap_space_hands_out_each_block_to_one_owner_and_counts_exactly():
    swap = SwapSpace(5)
    a, b = swap.allocate(2), swap.allocate(2)
    assert sorted(a + b) == [0, 1, 2, 3] and (swap.num_free_blocks, swap.num_used_blocks) == (1, 4)
    swap.free(a)
    c = swap.allocate(3)  # the two given back, and the last fresh one
    assert sorted(c) == sorted([*a, 4]) and not set(c) & set(b)
    assert (swap.num_free_blocks, swap.num_used_blocks) == (0, 5)
    with pytest.raises(NoFreeBlocksError):
        swap.allocate(1)
    swap.free(b + c)
    assert swap.num_free_blocks == 5 and sorted(swap.allocate(5)) == [0, 1, 2, 3, 4]
    with pytest.raises(RuntimeError, match="double free"):
        SwapSpace(3).free([1])


def test_swap_space_of_a_tiny_models_gib_starts_with_its_first_blocks():
    """A tiny model's default GiB of swap space is millions of blocks, all free at once."""
    swap = SwapSpace(10_000_000)
    assert swap.num_free_blocks == 10_000_000 and swap.allocate(2) == [0, 1]
    assert swap.num_used_blocks == 2


def test_blocks_are_allocated_only_at_block_boundaries():
    kv = KVCacheManager(num_blocks=10, block_size=4)
    req = make_request("r", prompt_len=5, max_tokens=10)
    assert kv.allocate_slots(req, 5)  # 5 tokens -> 2 blocks
    assert len(kv.get_block_table("r")) == 2
    req.num_computed_tokens = 5
    for expected_blocks in (2, 2, 2, 3):  # tokens 6, 7, 8 fit; token 9 crosses into block 3
        assert kv.allocate_slots(req, 1)
        assert len(kv.get_block_table("r")) == expected_blocks
        req.num_computed_tokens += 1
    assert kv.pool.num_used_blocks == 3
    kv.free(req)
    assert kv.pool.num_used_blocks == 0 and kv.get_block_table("r") == []


def test_allocate_slots_fails_without_side_effects():
    kv = KVCacheManager(num_blocks=3, block_size=4)
    big = make_request("big", prompt_len=13, max_tokens=1)  # needs 4 blocks
    assert not kv.allocate_slots(big, 13)
    assert kv.pool.num_free_blocks == 3 and kv.get_block_table("big") == []
