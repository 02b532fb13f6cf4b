"""The routing policies: pure functions of a prefix key and replica loads."""

from __future__ import annotations

import pytest

from inflight.core.kv_cache_manager import KVCacheManager
from inflight.request import Request
from inflight.routing import ROUTERS, PrefixAware, make_router, prefix_key
from inflight.sampling_params import SamplingParams


def test_prefix_key_is_the_prefix_caches_block_hashes():
    tokens = list(range(100))
    kv = KVCacheManager(num_blocks=16, block_size=16)
    request = Request("r", tokens, SamplingParams(), cache_salt="s")
    assert prefix_key(tokens, 16, "s") == kv.block_hashes(request)[:6]
    assert len(prefix_key(tokens, 16, max_blocks=2)) == 2
    assert prefix_key(tokens, 16, "s") != prefix_key(tokens, 16, "other salt")
    assert prefix_key(tokens[:15], 16) == []  # no full block: no key


def test_round_robin_least_loaded_and_power_of_two():
    rr = make_router("round-robin")
    loads = {"a": 5, "b": 0, "c": 9}
    assert [rr.choose([], loads) for _ in range(4)] == ["a", "b", "c", "a"]
    assert make_router("least-loaded").choose([], loads) == "b"
    p2 = make_router("power-of-two", seed=1)
    picks = [p2.choose([], loads) for _ in range(200)]
    assert "c" not in picks  # "c" loses every pair it is drawn in
    assert make_router("power-of-two").choose([], {"only": 3}) == "only"
    with pytest.raises(ValueError, match="unknown router"):
        make_router("random")
    assert sorted(ROUTERS) == sorted(["round-robin", "least-loaded", "power-of-two",
                                      "prefix-aware"])  # fmt: skip


def test_prefix_aware_follows_the_longest_known_prefix_within_the_margin():
    router = PrefixAware(margin=2)
    system, other = list(range(64)), list(range(1000, 1064))
    loads = {0: 0, 1: 0, 2: 0}
    first = router.choose(prefix_key(system + [7] * 16, 16), loads)
    assert router.load_routed == 1
    # the same system prompt, another question: where the prefix is
    assert router.choose(prefix_key(system + [8] * 16, 16), loads) == first
    assert router.prefix_routed == 1
    # within the margin it stays; beyond it, load decides
    busy = {r: (2 if r == first else 0) for r in loads}
    assert router.choose(prefix_key(system, 16), busy) == first
    overloaded = {r: (3 if r == first else 0) for r in loads}
    assert router.choose(prefix_key(system, 16), overloaded) != first
    # the longest match wins: the system prompt now also lives elsewhere
    longer = system + [8] * 16
    owner_of_longer = router.owner[prefix_key(longer, 16)[-1]]
    assert router.choose(prefix_key(longer, 16), loads) == owner_of_longer
    # a dead replica's prefixes are forgotten, and absent replicas are never chosen
    router.forget(owner_of_longer)
    assert owner_of_longer not in router.owner.values()
    alive = {r: 0 for r in loads if r != owner_of_longer}
    assert router.choose(prefix_key(other, 16), alive) in alive


def test_prefix_table_is_bounded():
    router = PrefixAware(table_size=10)
    for i in range(20):
        router.choose(prefix_key(list(range(i * 100, i * 100 + 32)), 16), {0: 0, 1: 0})
    assert len(router.owner) == 10
