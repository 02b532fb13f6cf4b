"""The simulator's fleet mode with the routing policies: prefix-aware routing keeps a system
prompt's blocks on one replica, so the fleet hits its prefix caches more often."""

from __future__ import annotations

from inflight.sim.hardware import resolve_hardware
from inflight.sim.model_profile import load_model_profile
from inflight.sim.simulator import build_setup, simulate
from inflight.workload.requests import WordTokenizer, named


def test_prefix_aware_routing_raises_the_fleets_prefix_hits():
    workload = named("prefix_groups", WordTokenizer(), 0, None, "poisson", 4.0)
    setup = build_setup(resolve_hardware("h100-sxm"), load_model_profile(None, "bf16", "bf16"),
                        {}, replicas=2)  # fmt: skip
    results = {r: simulate(setup, workload, r, router=r).extra
               for r in ("round-robin", "least-loaded", "prefix-aware")}  # fmt: skip
    aware = results["prefix-aware"]
    # 16 system prompts: each one's first request is routed by load, the rest follow it
    assert aware["prefix_routed"] == len(workload) - 16
    assert aware["prefix_routed"] + aware["load_routed"] == len(workload)
    assert results["round-robin"]["prefix_routed"] == results["least-loaded"]["prefix_routed"] == 0
    # round-robin computes every system prompt on both replicas
    assert aware["prefix_cache_hit_rate"] > results["round-robin"]["prefix_cache_hit_rate"] + 0.05
