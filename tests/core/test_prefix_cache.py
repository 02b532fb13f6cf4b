"""Prefix caching in the pool, the KV-cache manager and the scheduler (hand-made outputs)."""

from __future__ import annotations

from inflight.core.block_pool import BlockPool
from inflight.core.kv_cache_manager import KVCacheManager
from inflight.request import Request
from inflight.sampling_params import SamplingParams
from tests.core.helpers import fake_model_output, make_scheduler, run_to_completion


def request(rid: str, tokens: list[int], max_tokens: int = 2, salt: str | None = None) -> Request:
    return Request(rid, list(tokens), SamplingParams(max_tokens=max_tokens, ignore_eos=True),
                   cache_salt=salt)  # fmt: skip


def test_freed_cached_blocks_are_evicted_least_recently_freed_first():
    pool = BlockPool(4)
    a, b = pool.allocate(2), pool.allocate(2)
    for i, block in enumerate(a + b):
        pool.cache(block, block_hash=100 + i, token_ids=(i,))
    pool.free(b)  # freed first: evicted first
    pool.free(a)
    assert pool.num_free_blocks == 4 and pool.num_cached_blocks == 4
    assert pool.lookup(100, (0,)) == a[0]
    pool.touch([a[0]])  # a hit revives a free block
    assert pool.num_free_blocks == 3 and pool.blocks[a[0]].ref_count == 1
    assert pool.allocate(2) == b  # eviction order: b (oldest free) first
    assert pool.lookup(102, (2,)) is None and pool.num_evictions == 2
    assert pool.lookup(100, (0,)) == a[0]  # still cached
    pool.check_invariants()


def test_a_hash_hit_is_confirmed_against_the_tokens():
    pool = BlockPool(2)
    (block,) = pool.allocate(1)
    pool.cache(block, block_hash=7, token_ids=(1, 2))
    assert pool.lookup(7, (1, 2)) == block
    assert pool.lookup(7, (1, 3)) is None  # same hash, other tokens: a collision, not a hit


def test_longest_cached_prefix_leaves_one_token_to_compute():
    kv = KVCacheManager(num_blocks=16, block_size=4)
    first = request("a", list(range(12)))
    assert kv.allocate_slots(first, 12)
    first.num_computed_tokens = 12
    kv.cache_full_blocks(first)  # 3 full blocks published
    kv.free(first)

    same = request("b", list(range(12)))  # fully cached: only 2 blocks may be reused
    assert kv.get_computed_blocks(same).num_blocks == 2
    longer = request("c", [*range(12), 99, 98])
    assert kv.get_computed_blocks(longer).num_blocks == 3
    diverging = request("d", [0, 1, 2, 3, 4, 5, 77, 7, 8, 9, 10, 11, 12])
    assert kv.get_computed_blocks(diverging).num_blocks == 1
    salted = request("e", [*range(12), 99], salt="tenant-2")
    assert kv.get_computed_blocks(salted).num_blocks == 0
    off = KVCacheManager(num_blocks=16, block_size=4, enable_prefix_caching=False)
    assert off.get_computed_blocks(longer).num_blocks == 0


def test_shared_blocks_are_held_once_per_holder_and_freed_by_the_last():
    kv = KVCacheManager(num_blocks=8, block_size=4)
    a = request("a", list(range(9)))
    assert kv.allocate_slots(a, 9)
    a.num_computed_tokens = 9
    kv.cache_full_blocks(a)
    b = request("b", [*range(8), 50, 51])
    hit = kv.get_computed_blocks(b)
    assert hit.tables == [kv.get_block_table("a")[:2]]
    assert kv.allocate_slots(b, 2, hit)
    assert kv.get_block_table("b")[:2] == hit.pages
    assert kv.pool.num_used_blocks == 4 and kv.pool.num_refs == 6  # 2 shared blocks
    kv.free(a)
    assert kv.pool.num_used_blocks == 3  # a's private block freed; shared ones still held by b
    kv.free(b)
    assert kv.pool.num_used_blocks == 0


def test_scheduler_skips_cached_tokens_and_counts_hits():
    s = make_scheduler(num_blocks=64, block_size=4, max_num_seqs=4)
    system = list(range(100, 120))  # a 20-token shared prefix
    s.add_request(request("first", [*system, 1, 2, 3]))
    run_to_completion(s)
    s.add_request(request("second", [*system, 4, 5]))
    out = s.schedule()
    (chunk,) = out.scheduled
    assert chunk.start_pos == 20 and chunk.token_ids == [4, 5]
    assert s.kv.prefix_stats.hits == 20 and s.kv.prefix_stats.queries == 23 + 22
    s.update_from_output(out, fake_model_output(out))
    run_to_completion(s)
    assert s.kv.pool.num_used_blocks == 0


def test_swap_round_trip_moves_blocks_between_pools():
    kv = KVCacheManager(num_blocks=8, block_size=4, enable_prefix_caching=False, num_cpu_blocks=4)
    r = request("r", list(range(10)))
    assert kv.allocate_slots(r, 10)
    r.num_computed_tokens = 10
    table = list(kv.get_block_table("r"))
    assert kv.can_swap_out(r)
    out = kv.swap_out(r)
    assert [d for d, _ in out] == table and kv.is_swapped(r)
    assert kv.pool.num_used_blocks == 0 and kv.cpu_pool.num_used_blocks == 3
    back = kv.swap_in(r, 1)  # plus room for one more token: still 3 blocks (11 tokens)
    assert [c for c, _ in back] == [c for _, c in out]
    assert kv.get_block_table("r") == [d for _, d in back]
    assert kv.pool.num_used_blocks == 3 and kv.cpu_pool.num_used_blocks == 0
    big = request("big", list(range(20)))
    assert kv.allocate_slots(big, 20)
    big.num_computed_tokens = 20
    assert not kv.can_swap_out(big)  # 5 blocks > 4 CPU blocks: the caller recomputes instead
    kv.swap_out(r)
    kv.free(r)  # an abort while swapped frees the swap space too
    assert kv.cpu_pool.num_used_blocks == 0


def test_a_swapped_requests_state_is_charged_to_the_swap_space():
    """A state-carrying model's swapped request holds its KV's blocks and its state's charge
    (`swap_state_blocks`) there; both come back at swap-in, or when it ends while swapped; a
    request whose KV and state together would not fit is recomputed instead."""
    kv = KVCacheManager(num_blocks=8, block_size=4, enable_prefix_caching=False,
                        num_cpu_blocks=6, swap_state_blocks=3)  # fmt: skip
    r, big = request("r", list(range(10))), request("big", list(range(13)))
    for req in (r, big):
        assert kv.allocate_slots(req, req.num_tokens)
        req.num_computed_tokens = req.num_tokens
    assert not kv.can_swap_out(big)  # 4 blocks + 3 for its state > 6
    assert kv.can_swap_out(r)  # 3 + 3
    kv.swap_out(r)
    assert kv.cpu_pool.num_used_blocks == kv.num_swap_blocks_held == 6
    kv.swap_in(r, 1)
    assert kv.cpu_pool.num_used_blocks == kv.num_swap_blocks_held == 0
    kv.swap_out(r)
    kv.free(r)  # an abort while swapped gives back its state's charge too
    assert kv.cpu_pool.num_used_blocks == kv.num_swap_blocks_held == 0


def test_saved_states_are_given_up_least_recently_used_first():
    """A state-carrying model's saved states (`StateSnapshots`): a row each, found by block
    hash; a lookup makes one the most recently used; a full store gives up the least recently
    used for a new one; a hash saved already, or a store of no rows, saves nothing."""
    from inflight.core.state_snapshots import StateSnapshots

    store = StateSnapshots(2)
    first, second = store.save(101), store.save(202)
    assert {first, second} == {0, 1} and store.save(101) is None
    assert store.lookup(101) == first  # now the most recently used
    assert store.save(303) == second and store.num_evicted == 1
    assert store.lookup(202) is None and store.lookup(101) == first and len(store) == 2
    assert store.save(2**64 + 7) == second and store.lookup(303) is None  # (303: least recent)
    assert store.lookup(101) == first and store.num_saved == 4
    assert StateSnapshots(0).save(5) is None


def test_a_state_model_saves_a_state_where_a_prompt_leaves_the_cached_blocks():
    """A state-carrying model's hits reach only as far as a saved state. A prompt that follows
    cached blocks of another prompt's further than any saved state ends its chunk where it
    leaves them and saves the state there (besides at its own last full block), so that the
    next prompt sharing that prefix resumes from it; whatever its chunk budget."""
    from inflight.config import SchedulerConfig
    from inflight.core.scheduler import Scheduler
    from inflight.core.state_snapshots import StateSnapshots
    from tests.core.helpers import step

    system = list(range(100, 110))  # two full blocks of 4, two tokens of a third
    kv = KVCacheManager(64, 4, True, snapshots=StateSnapshots(8))
    scheduler = Scheduler(SchedulerConfig(max_model_len=256, max_num_batched_tokens=64), kv)

    def chunks(r: Request) -> list[tuple[int, int, int | None, int | None]]:
        """(start, tokens, state restored, state saved) of each of `r`'s steps."""
        scheduler.add_request(r)
        seen = []
        while scheduler.has_unfinished_requests():
            out = step(scheduler)
            seen += [(s.start_pos, s.num_tokens, s.state_restore, s.state_save)
                     for s in out.scheduled if s.num_tokens > 1]  # fmt: skip
        return seen

    # the first: one chunk to its last full block (12 of 14), the state saved after it
    first = chunks(request("a", [*system, 1, 2, 3, 4], max_tokens=1))
    assert [c[:2] for c in first] == [(0, 12), (12, 2)] and first[1][3] is not None
    # the second follows the first's blocks for 8 tokens, where no state is saved: it ends a
    # chunk there and saves the state after it
    second = chunks(request("b", [*system, 5, 6, 7, 8], max_tokens=1))
    assert [c[:2] for c in second] == [(0, 8), (8, 4), (12, 2)]
    assert second[1][3] is not None and second[0][2] is None
    # the third resumes there
    third = chunks(request("c", [*system, 9, 10, 11, 12], max_tokens=1))
    assert third[0][:3] == (8, 4, second[1][3])
    assert kv.prefix_stats.hits == 8
