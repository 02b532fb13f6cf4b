"""KV groups: windowed layers give their out-of-window blocks back, with exact accounting, prefix
hits that need only what a window reaches, swap, and pool sizing by the pages a sequence can
hold at most."""

from __future__ import annotations

import pytest

from inflight.core.kv_cache_manager import KVCacheManager
from inflight.core.kv_groups import NULL_BLOCK, plan_kv_layout
from inflight.core.sizing import peak_pages, resolve_max_model_len
from inflight.errors import ConfigError
from tests.core.helpers import make_request, make_scheduler, run_to_completion, step


def gemma3_windows(num_layers: int, window: int) -> list[int | None]:
    return [None if (layer + 1) % 6 == 0 else window for layer in range(num_layers)]


def test_layouts_of_the_families():
    gemma3 = plan_kv_layout(gemma3_windows(18, 512))  # Gemma 3 270M: every sixth layer global
    assert gemma3.group_windows == (None, 512, 512, 512, 512, 512)
    assert gemma3.layers_per_page == 3
    assert [layer for layer in range(18) if gemma3.layer_group[layer] == 0] == [5, 11, 17]
    assert [layer for layer in range(18) if gemma3.layer_group[layer] == 2] == [3, 4, 6]
    assert [gemma3.layer_slot[layer] for layer in (3, 4, 6)] == [0, 1, 2]
    # Gemma 3 1B: 4 global layers of 26, 22 windowed: pages of gcd(4, 22) = 2 layers
    one_b = plan_kv_layout(gemma3_windows(26, 512))
    assert one_b.layers_per_page == 2 and one_b.num_groups == 13
    assert one_b.group_windows.count(None) == 2
    alternating = plan_kv_layout([128, None] * 12)  # gpt-oss-20b
    assert alternating.group_windows == (None, 128) and alternating.layers_per_page == 12
    assert plan_kv_layout([4096] * 32).group_windows == (4096,)  # Mistral: one windowed group
    assert plan_kv_layout([None] * 30).num_groups == 1
    with pytest.raises(ValueError, match="window must be positive"):
        plan_kv_layout([0, None])


def test_a_windowed_group_holds_only_what_its_window_reaches():
    kv = KVCacheManager(num_blocks=64, block_size=4, group_windows=(None, 6))
    r = make_request("r", 20, 8)
    assert kv.allocate_slots(r, 20)  # the prompt in one chunk: from position 0, every block
    assert [len(t) for t in kv.get_block_tables("r")] == [5, 5]
    assert kv.pool.num_used_blocks == 10
    r.num_computed_tokens = 20
    r.output_token_ids.append(7)
    # the decode at position 20 sees positions 15..20: blocks 3 (12-15) and on
    assert kv.allocate_slots(r, 1)
    full, windowed = kv.get_block_tables("r")
    assert len(full) == 6 and windowed[:3] == [NULL_BLOCK] * 3 and NULL_BLOCK not in windowed[3:]
    assert kv.num_held("r") == 6 + 3 == kv.pool.num_used_blocks
    assert kv.pages_for(21) == 9  # what a decoding request holds with 21 tokens cached
    kv.free(r)
    assert kv.pool.num_used_blocks == 0
    assert kv.num_held("r") == kv.num_held_for_reservation("r") == 0  # (a waiting request's)


def test_pages_needed_counts_what_the_window_gives_back():
    kv = KVCacheManager(num_blocks=64, block_size=4, group_windows=(5,))
    r = make_request("r", 16, 4)
    assert kv.allocate_slots(r, 16)
    r.num_computed_tokens = 16
    r.output_token_ids.append(7)
    # position 16 sees 12..16: blocks 0-2 go back, block 4 is new
    assert kv.pages_needed(r, 1) == 1 - 3
    assert kv.max_new_tokens(r, 0) == 12  # blocks 3-6: the kept one and the 3 given back
    assert kv.allocate_slots(r, 1) and kv.pool.num_used_blocks == 2


def test_prefix_hits_need_only_the_blocks_a_window_reaches():
    kv = KVCacheManager(num_blocks=64, block_size=4, group_windows=(None, 6))
    first = make_request("a", 24, 1)
    assert kv.allocate_slots(first, 24)
    first.num_computed_tokens = 24
    kv.cache_full_blocks(first)
    _, first_windowed = kv.get_block_tables("a")
    kv.free(first)
    again = make_request("b", 26, 1)  # the same 24 tokens and two more
    hit = kv.get_computed_blocks(again)
    assert hit.num_blocks == 6  # the new tokens start at 24, which sees 19..24: blocks 4 and 5
    full, windowed = hit.tables
    assert len(full) == 6 and windowed == [NULL_BLOCK] * 4 + first_windowed[4:]
    assert kv.num_revived(hit) == 8
    assert kv.allocate_slots(again, 2, hit)
    assert kv.pool.num_used_blocks == 7 + 3  # full: 6 + 1 new; windowed: 2 + 1 new
    kv.free(again)
    # windowed block 4 evicted: from 24 or 20 the window needs it; from 16 (11..16), not
    block = kv.pool.blocks[first_windowed[4]]
    del kv.pool._cached[block.block_hash]
    block.block_hash = block.token_ids = None
    hit = kv.get_computed_blocks(make_request("c", 26, 1))
    assert hit.num_blocks == 4 and hit.tables[1] == [NULL_BLOCK] * 2 + first_windowed[2:4]


def test_swap_keeps_the_null_blocks_and_moves_the_rest():
    kv = KVCacheManager(num_blocks=16, block_size=4, enable_prefix_caching=False,
                        num_cpu_blocks=16, group_windows=(None, 5))  # fmt: skip
    r = make_request("r", 16, 4)
    assert kv.allocate_slots(r, 16)
    r.num_computed_tokens = 16
    r.output_token_ids.append(7)
    assert kv.allocate_slots(r, 1)  # position 16: windowed blocks 0-2 given back
    r.num_computed_tokens = 17
    held = kv.num_held("r")
    copies = kv.swap_out(r)
    assert len(copies) == held == kv.cpu_pool.num_used_blocks and kv.pool.num_used_blocks == 0
    assert kv.swapped["r"][1][:3] == [NULL_BLOCK] * 3
    back = kv.swap_in(r, 1)
    assert back is not None and len(back) == held and kv.cpu_pool.num_used_blocks == 0
    assert kv.get_block_tables("r")[1][:3] == [NULL_BLOCK] * 3
    assert kv.num_held("r") == kv.pool.num_used_blocks


def test_a_long_sequence_holds_a_fraction_of_the_pages():
    """A Gemma 3-like model (1 full group, 5 windowed) at 32k tokens with a 512-token window:
    the windowed groups hold 32 or 33 pages each where the full one holds 2,048."""
    windows = (None,) + (512,) * 5
    assert peak_pages(32_768, 16) == 2048
    assert peak_pages(32_768, 16, windows, chunk=512) == 2048 + 5 * (64 + 1)
    kv = KVCacheManager(num_blocks=4096, block_size=16, group_windows=windows)
    assert kv.pages_for(32_768) == 2048 + 5 * 32  # position 32,767 sees 32,256..: block 2,016 on
    assert kv.pages_for(32_769) == 2049 + 5 * 33
    # against one table for all 6 layer groups: 6 x 2,048 pages
    assert 6 * 2048 / kv.pages_for(32_768) > 5.5


def test_max_model_len_from_the_pages_a_sequence_can_hold():
    windows = (None, 8)
    # 10 pages: a sequence of n blocks holds n full and at most cdiv(8 - 1 + 4, 4) + 1 = 4
    assert resolve_max_model_len(None, 1000, 10, 4, windows, chunk=4) == 24
    with pytest.raises(ConfigError, match="holds 24 tokens of a sequence"):
        resolve_max_model_len(40, 1000, 10, 4, windows, chunk=4)
    assert resolve_max_model_len(None, 1000, 10, 4, (8,), chunk=4) == 1000  # only windowed


def test_the_scheduler_runs_windowed_groups_to_the_end_with_exact_accounting():
    s = make_scheduler(num_blocks=24, block_size=4, max_model_len=64, max_num_seqs=4,
                       max_num_batched_tokens=16, group_windows=[None, 6, 6])  # fmt: skip
    for i in range(6):
        s.add_request(make_request(f"r{i}", 30 + i, 20))
    most = 0
    while s.has_unfinished_requests():
        step(s)
        most = max(most, s.kv.pool.num_used_blocks)
        held = sum(s.kv.num_held(r) for r in s.kv.block_tables)
        assert held == s.kv.pool.num_refs
    assert s.kv.pool.num_used_blocks == 0 and most <= 24
    assert run_to_completion(s) == 0
