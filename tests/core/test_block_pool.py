from __future__ import annotations

import pytest

from inflight.core.block_pool import BlockPool, NoFreeBlocksError
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
