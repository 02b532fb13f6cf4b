"""SLO admission on the tensor-free core: the forecast against the scheduler it predicts, the
refusal, earliest deadline first, decodes kept within their TPOT, and goodput's judgement."""

from __future__ import annotations

import math
import random

import pytest

from inflight.config import SchedulerConfig
from inflight.core.slo import check_slo, forecast_ttft, met_target, tpot_token_cap
from inflight.errors import ConfigError, SLOUnmetError
from inflight.request import SLOTarget
from tests.core.helpers import fake_model_output, make_request, make_scheduler

BASE_S, PER_TOKEN_S = 0.02, 0.001  # the step cost every test's engine runs at


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def run_step(scheduler, clock: Clock) -> list:
    """One step costing BASE_S + PER_TOKEN_S per token, recorded like the engine's."""
    out = scheduler.schedule()
    start = clock.t
    clock.t += BASE_S + PER_TOKEN_S * out.num_batched_tokens
    outputs = scheduler.update_from_output(out, fake_model_output(out))
    scheduler.record_step_time(out, clock.t - start)
    return outputs


def fitted_scheduler(clock: Clock, **knobs):
    """A scheduler whose step-cost line is fitted, exactly, to steps of varied size."""
    # (no prefix cache: the helpers' prompts share prefixes, and the forecast counts no hits)
    scheduler = make_scheduler(num_blocks=512, block_size=4, max_model_len=512, clock=clock,
                               enable_prefix_caching=False, **knobs)  # fmt: skip
    for i, n in enumerate((5, 40, 13, 90, 27)):
        scheduler.add_request(make_request(f"warm{i}", n, 1))
        while scheduler.has_unfinished_requests():
            run_step(scheduler, clock)
    base, per_token = scheduler.step_cost.line()
    assert base == pytest.approx(BASE_S) and per_token == pytest.approx(PER_TOKEN_S)
    scheduler.output_lengths.mean = 1000.0  # past every max_tokens: outputs known exactly
    return scheduler


@pytest.mark.parametrize("seed", range(12))
def test_the_forecast_is_the_first_token_the_scheduler_then_gives(seed: int) -> None:
    """With outputs of known length and the fitted line, playing the queue forward is the
    schedule itself (runs of decode-only steps taken at once included): the forecast TTFT
    equals the one the request then gets."""
    rng, clock = random.Random(seed), Clock()
    scheduler = fitted_scheduler(clock, max_num_seqs=rng.choice((2, 4, 8)),
                                 max_num_batched_tokens=64)  # fmt: skip
    for i in range(rng.randint(3, 9)):  # a queue: some running, some waiting
        scheduler.add_request(make_request(f"r{i}", rng.randint(1, 150), rng.randint(1, 60)))
    for _ in range(rng.randint(0, 6)):
        run_step(scheduler, clock)
    clock.t += rng.uniform(0, 0.05)  # it arrives mid-step: it waits for the next one
    arrival = clock.t
    new = make_request("new", rng.randint(1, 150), 8)
    new.arrival_time = arrival
    predicted = forecast_ttft(scheduler.queue_state(), _work(scheduler, new), arrival)
    scheduler.add_request(new)
    while new.first_token_time is None:
        run_step(scheduler, clock)
    assert predicted == pytest.approx(new.first_token_time - arrival, abs=1e-9)


def _work(scheduler, request):
    from inflight.core.slo import expected_work

    return expected_work(request, scheduler.output_lengths.mean, scheduler.config.max_model_len)


def test_a_request_predicted_to_miss_its_target_is_refused_with_when_to_retry() -> None:
    clock = Clock()
    scheduler = fitted_scheduler(clock, max_num_seqs=2, max_num_batched_tokens=64)
    for i in range(6):
        scheduler.add_request(make_request(f"r{i}", 100, 20))
    config, state = scheduler.config, scheduler.queue_state()
    late = make_request("late", 50, 8)
    late.slo = SLOTarget(ttft_s=0.5)
    predicted = forecast_ttft(state, _work(scheduler, late), clock.t)
    assert 0.5 < predicted < math.inf
    with pytest.raises(SLOUnmetError) as refused:
        check_slo(state, [late], clock.t, config)
    assert refused.value.retry_after == math.ceil(predicted - 0.5)
    assert refused.value.code == "slo_unmet"
    late.slo = SLOTarget(ttft_s=predicted + 0.01)  # a target it meets: admitted
    check_slo(state, [late], clock.t, config)
    # requests sent just before it (not in the state yet) count: behind them it misses
    ahead = [make_request(f"a{i}", 100, 20) for i in range(2)]
    with pytest.raises(SLOUnmetError):
        check_slo(state, [late], clock.t, config, pending=ahead)
    late.slo = SLOTarget(ttft_s=0.5)
    queue_anyway = SchedulerConfig(max_model_len=512, slo_admission="queue")
    check_slo(state, [late], clock.t, queue_anyway)  # queued anyway
    no_target = make_request("free", 50, 8)
    check_slo(state, [no_target], clock.t, config)  # no target: nothing to miss


def test_a_fresh_engine_admits_everything_until_it_has_a_step_cost() -> None:
    clock = Clock()
    scheduler = make_scheduler(clock=clock)
    for i in range(8):
        scheduler.add_request(make_request(f"r{i}", 100, 20))
    request = make_request("new", 10, 4)
    request.slo = SLOTarget(ttft_s=1e-6)
    check_slo(scheduler.queue_state(), [request], clock.t, scheduler.config)


def test_edf_serves_the_earliest_deadline_first() -> None:
    clock = Clock()
    scheduler = make_scheduler(clock=clock, max_num_seqs=1, scheduling_policy="edf")
    targets = {"slack": 9.0, "none": None, "urgent": 1.0, "soon": 3.0}
    for name, ttft in targets.items():
        request = make_request(name, 8, 1)
        request.arrival_time = 0.0
        request.slo = SLOTarget(ttft_s=ttft)
        scheduler.add_request(request)
    order = []
    while scheduler.has_unfinished_requests():
        out = scheduler.schedule()
        order += [s.request_id for s in out.scheduled]
        scheduler.update_from_output(out, fake_model_output(out))
    assert order == ["urgent", "soon", "slack", "none"]


def test_decodes_with_a_tpot_target_cap_the_prompt_tokens_of_a_step() -> None:
    clock = Clock()
    scheduler = fitted_scheduler(clock, max_num_seqs=4, max_num_batched_tokens=512)
    talker = make_request("talker", 8, 200)
    talker.slo = SLOTarget(tpot_s=0.05)
    scheduler.add_request(talker)
    for _ in range(3):
        run_step(scheduler, clock)
    scheduler.add_request(make_request("long", 400, 4))  # a prompt that would take 0.42 s
    out = scheduler.schedule()
    slack = 0.05 * talker.num_output_tokens - (clock.t - talker.first_token_time)
    assert out.num_batched_tokens == int((slack - BASE_S) / PER_TOKEN_S) < 400
    assert BASE_S + PER_TOKEN_S * out.num_batched_tokens <= slack + 1e-9
    # without a target the same step takes the whole prompt
    assert tpot_token_cap([make_request("plain", 8, 9)], clock.t, (BASE_S, PER_TOKEN_S), 1) is None


def test_a_prompt_always_gets_at_least_a_block_beside_hopeless_decodes() -> None:
    clock = Clock()
    scheduler = fitted_scheduler(clock, max_num_seqs=4, max_num_batched_tokens=512)
    talker = make_request("talker", 8, 200)
    talker.slo = SLOTarget(tpot_s=1e-4)  # missed whatever the step does
    scheduler.add_request(talker)
    for _ in range(2):
        run_step(scheduler, clock)
    scheduler.add_request(make_request("long", 400, 4))
    out = scheduler.schedule()
    assert out.num_batched_tokens == 1 + scheduler.kv.block_size


def test_goodput_counts_each_finished_request_against_its_targets_per_tenant() -> None:
    clock = Clock()
    scheduler = fitted_scheduler(clock, max_num_seqs=8, max_num_batched_tokens=512,
                                 slo_ttft=10.0)  # fmt: skip
    targets = {"met": SLOTarget(), "late": SLOTarget(ttft_s=1e-3),
               "slow": SLOTarget(tpot_s=1e-3)}  # fmt: skip
    for name, slo in targets.items():
        request = make_request(name, 20, 4)
        request.tenant, request.slo, request.arrival_time = name, slo, clock.t
        scheduler.add_request(request)
    met, missed = {}, {}
    while scheduler.has_unfinished_requests():
        out = scheduler.schedule()
        clock.t += 0.05
        scheduler.update_from_output(out, fake_model_output(out))
        stats = scheduler.make_stats(out, 0, 0.05)
        for mine, theirs in ((met, stats.slo_met), (missed, stats.slo_missed)):
            for tenant, n in theirs.items():
                mine[tenant] = mine.get(tenant, 0) + n
    # the default TTFT (10 s) applies to each request without its own (the warm-ups too)
    assert met == {"default": 5, "met": 1} and missed == {"late": 1, "slow": 1}


def test_met_target_reads_ttft_and_mean_tpot() -> None:
    request = make_request("r", 4, 5)
    request.arrival_time, request.first_token_time, request.finished_time = 0.0, 0.4, 0.8
    request.output_token_ids = [1] * 5  # 4 gaps of 0.1 s
    for slo, met in ((SLOTarget(0.4, 0.1), True), (SLOTarget(0.39, None), False),
                     (SLOTarget(None, 0.09), False), (SLOTarget(), None)):  # fmt: skip
        request.slo = slo
        assert met_target(request) is met


@pytest.mark.parametrize("bad", [0, -1.0, math.nan, math.inf, "1", True])
def test_bad_targets_are_refused(bad) -> None:
    with pytest.raises(ValueError, match="ttft_s"):
        SLOTarget(ttft_s=bad)
    with pytest.raises(ConfigError, match="slo_tpot"):
        SchedulerConfig(slo_tpot=bad)


def test_a_first_token_past_the_forecasts_reach_is_a_miss_whatever_the_target() -> None:
    """The forecast runs on the server's event loop, so it plays a bounded number of steps: a
    request behind more prompt steps than that is refused (Retry-After 60), even with a day's
    target, rather than holding the loop."""
    from inflight.core.slo import MAX_FORECAST_STEPS, QueueState, Work

    waiting = tuple(Work(2048, 1) for _ in range(MAX_FORECAST_STEPS + 10))  # a step each
    state = QueueState(t=0.0, running=(), waiting=waiting, line=(0.001, 0.0), max_num_seqs=64,
                       token_budget=2048, chunk_limit=2048, policy="fcfs", num_added=0,
                       mean_output=1.0)  # fmt: skip
    assert forecast_ttft(state, Work(10, 1), 0.0) == math.inf
    request = make_request("patient", 10, 1)
    request.slo = SLOTarget(ttft_s=86_400.0)
    with pytest.raises(SLOUnmetError) as refused:
        check_slo(state, [request], 0.0, SchedulerConfig(max_model_len=4096))
    assert refused.value.retry_after == 60
