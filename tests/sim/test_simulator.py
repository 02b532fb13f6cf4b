"""The discrete-event simulation: clock, arrivals, replicas, pool sizing."""

from __future__ import annotations

import pytest

from inflight.errors import ConfigError
from inflight.sim.claims import steps_claim
from inflight.sim.hardware import PROFILES
from inflight.sim.model_profile import load_model_profile
from inflight.sim.simulator import build_setup, simulate
from inflight.workload.requests import WorkloadRequest
from inflight.workload.results import summarize
from tests.core.test_static_vs_continuous import LENGTHS, continuous_steps, static_steps
from tests.sim.helpers import overhead_only, toy_model

KNOBS = {"num_kv_blocks": 64, "max_model_len": 256}


def request(max_tokens: int, arrival: float = 0.0, prompt: int = 8) -> WorkloadRequest:
    return WorkloadRequest(list(range(prompt)), max_tokens, arrival)


def test_clock_advances_by_step_costs():
    """1 s per step: the prompt step samples the first token, each decode one more."""
    setup = build_setup(overhead_only(1.0), toy_model(), KNOBS)
    run = simulate(setup, [request(3)], "one")
    (r,) = run.requests
    assert (r.ttft, r.e2e, run.wall_s) == (1.0, 3.0, 3.0)
    assert [s.t for s in run.timeline] == [1.0, 2.0, 3.0]


def test_late_arrival_waits_for_the_running_step_and_idle_time_is_skipped():
    setup = build_setup(overhead_only(1.0), toy_model(), KNOBS)
    run = simulate(setup, [request(3), request(2, arrival=0.5), request(1, arrival=10.0)], "x")
    first, second, third = run.requests  # in finishing order
    assert (first.ttft, first.e2e) == (1.0, 3.0)
    # arrives mid-step at 0.5, joins the step starting at 1.0: first token at 2.0
    assert (second.ttft, second.e2e) == (1.5, 2.5)
    assert (third.ttft, third.e2e) == (1.0, 1.0)  # the fleet was idle; it starts on arrival
    assert run.wall_s == 11.0


def test_replicas_share_the_load():
    workload = [request(4) for _ in range(4)]
    one = simulate(build_setup(overhead_only(), toy_model(), {**KNOBS, "max_num_seqs": 1}),
                   workload, "1")  # fmt: skip
    four = simulate(build_setup(overhead_only(), toy_model(), {**KNOBS, "max_num_seqs": 1},
                                replicas=4), workload, "4")  # fmt: skip
    assert sorted(r.e2e for r in one.requests) == [4.0, 8.0, 12.0, 16.0]
    assert [r.e2e for r in four.requests] == [4.0] * 4
    assert four.extra["replicas"] == 4 and four.extra["steps_all_replicas"] == 16


def test_static_and_continuous_steps_match_independent_models():
    workload = [request(n) for n in LENGTHS]
    steps = {}
    for mode in ("static", "continuous"):
        knobs = {"num_kv_blocks": 10_000, "max_model_len": 512, "max_num_seqs": 10,
                 "batching": mode}  # fmt: skip
        steps[mode] = summarize(simulate(build_setup(overhead_only(), toy_model(), knobs),
                                         workload, mode))["steps"]  # fmt: skip
    assert steps == {"static": static_steps(LENGTHS), "continuous": continuous_steps(LENGTHS)}


def test_steps_claim_figures_are_consistent():
    _, figures = steps_claim()
    assert figures["continuous"] >= figures["lower_bound"] == -(-figures["total_tokens"] // 10)
    assert figures["static"] > figures["continuous"]


def test_seat_utilization_of_a_half_empty_batch():
    knobs = {**KNOBS, "max_num_seqs": 4}
    run = simulate(build_setup(overhead_only(), toy_model(), knobs), [request(2)] * 2, "x")
    assert run.extra["seat_utilization"] == 0.5


def test_gpu_pool_is_the_memory_left_after_weights():
    model = load_model_profile("llama-3.1-8b")
    knobs = {"max_num_seqs": 256, "max_num_batched_tokens": 8192}
    setup = build_setup(PROFILES["h100-sxm"], model, knobs, memory_utilization=0.9)
    left = 80e9 * 0.9 - model.weight_bytes_total - model.activation_bytes(8192, 256) - 2**30
    assert setup.num_kv_blocks == int(left) // (model.kv_bytes_per_token * 16)
    assert setup.max_model_len == 131072


def test_model_that_does_not_fit_is_refused():
    model = load_model_profile("llama-3.3-70b", "bf16")
    with pytest.raises(ConfigError, match="no room for a KV cache"):
        build_setup(PROFILES["h100-sxm"], model, {})


def test_request_longer_than_max_model_len_is_refused():
    setup = build_setup(overhead_only(), toy_model(), KNOBS)
    with pytest.raises(ConfigError, match="workload request 0"):
        simulate(setup, [request(250, prompt=10)], "x")


def test_the_simulator_shares_the_engine_between_tenants_under_fair():
    """`bench fairness`'s scene, simulated: a flood past what two seats serve and a steady
    tenant; under fcfs the steady one waits behind the flood's queue, under fair it starts at
    once (the same scheduler code the engine runs, with each request's tenant)."""
    flood = [WorkloadRequest(list(range(9)), 8, 0.1 * i, tenant="flood") for i in range(60)]
    steady = [WorkloadRequest(list(range(5)), 8, 1.0 + 2.0 * i, tenant="steady")
              for i in range(5)]  # fmt: skip

    def steady_ttfts(policy: str) -> list[float]:
        knobs = {**KNOBS, "max_num_seqs": 2, "scheduling_policy": policy}
        run = simulate(build_setup(overhead_only(0.05), toy_model(), knobs), flood + steady, policy)
        return [r.ttft for r in run.requests if r.prompt_tokens == 5]

    fcfs, fair = steady_ttfts("fcfs"), steady_ttfts("fair")
    assert len(fcfs) == len(fair) == 5
    assert max(fair) <= 0.1 + 1e-9 and min(fcfs[1:]) > 1.0


def test_the_simulator_refuses_as_slo_admission_does_and_goodput_rises():
    """Twice the arrivals two seats serve, with a 1 s TTFT target: refused at arrival (on the
    replica's own queue and fitted step cost), the admitted meet their target, where FCFS
    queues everyone past it."""
    workload = [request(8, arrival=0.05 * i) for i in range(200)]

    def run(**slo):
        knobs = {**KNOBS, "max_num_seqs": 2, **slo}
        return simulate(build_setup(overhead_only(0.05), toy_model(), knobs), workload, "x")

    def met(result) -> int:
        return sum(r.ttft <= 1.0 + 1e-9 for r in result.requests)

    fcfs, slo = run(), run(slo_ttft=1.0)
    assert fcfs.extra["refused"] == 0 and len(fcfs.requests) == 200
    assert slo.extra["refused"] > 50 and len(slo.requests) + slo.extra["refused"] == 200
    assert met(slo) == len(slo.requests)  # the forecast is exact here: one step cost
    assert met(slo) / slo.wall_s > 2 * met(fcfs) / fcfs.wall_s
