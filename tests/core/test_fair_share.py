"""Fair share between tenants (`core/fair_share.py`) on the tensor-free core: the VTC bound on
random arrivals, a flood that does not starve a steady tenant, no credit banked while idle,
priority classes first, and preemption of the most-served tenant's newest request."""

from __future__ import annotations

import random

import pytest

from inflight.core.fair_share import TenantShares
from tests.core.helpers import make_request, make_scheduler, step


def tenant_request(rid: str, tenant: str, prompt_len: int, max_tokens: int, priority: int = 0):
    request = make_request(rid, prompt_len, max_tokens)
    request.tenant, request.priority = tenant, priority
    return request


@pytest.mark.parametrize("seed", range(6))
def test_backlogged_tenants_counters_stay_within_vtcs_bound(seed):
    """VTC's bound on random arrivals: while tenants have requests waiting, their counters
    (tokens computed / weight) differ by at most 2 max(U, M): U the largest request's weighted
    tokens, M the weighted tokens a full batch can hold (running requests go on while a less
    served tenant waits for a seat); here one tenant sends four times the others' requests."""
    rng = random.Random(seed)
    weights = {"flood": 1.0, "steady": 1.0, "heavy": 2.0}
    seats, longest_prompt, longest_output = 2, 40, 24
    s = make_scheduler(num_blocks=256, block_size=4, max_num_seqs=seats,
                       max_num_batched_tokens=48, scheduling_policy="fair",
                       tenant_weights=tuple(weights.items()),
                       enable_prefix_caching=False)  # fmt: skip
    largest = (longest_prompt + longest_output) / min(weights.values())
    bound = 2 * max(largest, seats * largest)
    widest, n = 0.0, 0
    for t in range(400):
        for tenant, per_step in (("flood", 4), ("steady", 1), ("heavy", 1)):
            if rng.random() < per_step / 6:
                prompt, out = rng.randint(1, longest_prompt), rng.randint(1, longest_output)
                s.add_request(tenant_request(f"{tenant}-{n}", tenant, prompt, out))
                n += 1
        step(s)
        counters = {r.tenant: s.shares.counter(r.tenant) for r in s.waiting}
        if len(counters) > 1:
            spread = max(counters.values()) - min(counters.values())
            widest = max(widest, spread)
            assert spread <= bound, (t, counters, bound)
    served = s.shares.served_tokens
    assert served["flood"] > 0 and served["steady"] > 0 and served["heavy"] > 0
    assert widest > 0  # tenants were backlogged together


def _first_token_steps(policy: str) -> list[int]:
    """A flood of 40 requests at once from one tenant, then one request per 4 steps from
    another: how many steps each of the latter waits for its first token."""
    s = make_scheduler(num_blocks=512, block_size=4, max_num_seqs=4, max_num_batched_tokens=64,
                       scheduling_policy=policy, enable_prefix_caching=False)  # fmt: skip
    for i in range(40):
        s.add_request(tenant_request(f"flood-{i}", "flood", 16, 16))
    waits, pending = [], {}
    for t in range(600):
        if t % 4 == 0 and t < 80:
            request = tenant_request(f"steady-{t}", "steady", 16, 4)
            s.add_request(request)
            pending[request.request_id] = (t, request)
        step(s)
        for rid, (arrived, request) in list(pending.items()):
            if request.num_output_tokens:
                waits.append(t - arrived)
                del pending[rid]
    assert not pending
    return waits


def test_a_flood_from_one_tenant_does_not_starve_a_steady_one():
    """The flood holds every seat when a steady request comes: under `fair` the flood's newest
    request gives its seat back (the steady tenant holds none of its half), so the steady one
    starts at once; under FCFS it waits behind the whole flood."""
    fair, fcfs = _first_token_steps("fair"), _first_token_steps("fcfs")
    assert max(fair) <= 1, fair
    assert min(fcfs) > 50, fcfs


def test_a_tenant_back_from_idle_starts_at_the_least_active_counter():
    s = make_scheduler(scheduling_policy="fair", enable_prefix_caching=False)
    s.add_request(tenant_request("a-0", "a", 8, 8))
    s.add_request(tenant_request("b-0", "b", 4, 1))
    while s.has_unfinished_requests():  # b finishes early; a goes on alone
        step(s)
    s.add_request(tenant_request("a-1", "a", 8, 40))
    for _ in range(30):
        step(s)
    assert s.shares.counter("a") > s.shares.counter("b") + 20
    s.add_request(tenant_request("b-1", "b", 4, 1))  # no credit for the time away
    assert s.shares.counter("b") == s.shares.counter("a")


def test_priority_classes_come_first_and_fairness_orders_tenants_within_one():
    s = make_scheduler(scheduling_policy="fair", max_num_seqs=1, enable_prefix_caching=False)
    for rid, tenant, priority in (("a-low", "a", 1), ("a-high", "a", 0), ("b-low", "b", 1),
                                  ("b-high", "b", 0), ("c-high", "c", 0)):  # fmt: skip
        s.add_request(tenant_request(rid, tenant, 4, 2, priority))
    s.shares.counters.update(a=100.0, b=0.0, c=50.0)  # served so far: a most, b least
    s.waiting.prepare(0.0)
    assert [r.request_id for r in s.waiting] == ["b-high", "c-high", "a-high", "b-low", "a-low"]


def test_preemption_takes_the_most_served_tenants_newest_request():
    s = make_scheduler(num_blocks=12, block_size=4, max_num_seqs=4, scheduling_policy="fair",
                       enable_prefix_caching=False)  # fmt: skip
    for rid, tenant in (("a-0", "a"), ("b-0", "b"), ("a-1", "a"), ("b-1", "b")):
        s.add_request(tenant_request(rid, tenant, 4, 30))
    s.shares.on_served("b", 1000)
    preempted = []
    for _ in range(30):
        preempted += step(s).preempted_request_ids
    assert preempted and preempted[0] == "b-1"


def test_weights_must_be_positive_and_finite():
    for bad in (0, -1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="weight"):
            TenantShares({"t": bad})


def test_share_preemption_needs_a_whole_seat_of_share_and_no_better_class():
    """Three tenants over two seats (a share under a seat each): nobody is preempted for
    share; a waiting request of a worse priority class preempts nobody either."""
    s = make_scheduler(max_num_seqs=2, scheduling_policy="fair", enable_prefix_caching=False)
    s.add_request(tenant_request("a-0", "a", 4, 30))
    s.add_request(tenant_request("b-0", "b", 4, 30))
    step(s)
    s.add_request(tenant_request("c-0", "c", 4, 30))
    assert not step(s).preempted_request_ids  # c's share: 2/3 of a seat
    s2 = make_scheduler(max_num_seqs=2, scheduling_policy="fair", enable_prefix_caching=False)
    for i in range(2):
        s2.add_request(tenant_request(f"a-{i}", "a", 4, 30))
    step(s2)
    s2.add_request(tenant_request("b-low", "b", 4, 30, priority=1))
    assert not step(s2).preempted_request_ids  # a's requests are of a better class
    s2.add_request(tenant_request("b-0", "b", 4, 30))
    assert step(s2).preempted_request_ids == ["a-1"]  # b holds none of its seat; a's newest
