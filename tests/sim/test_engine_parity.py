"""The simulator calls the engine's own scheduler: for the same workload, the engine and the
simulation make the same schedule, step for step, preemptions and chunked prefills included."""

from __future__ import annotations

import pytest

from inflight.bench.offline import run_offline
from inflight.core.scheduler import Scheduler
from inflight.engine.llm import LLM
from inflight.sim.hardware import PROFILES
from inflight.sim.model_profile import ModelProfile
from inflight.sim.simulator import Simulation, build_setup
from inflight.workload.requests import named


def as_steps(outputs) -> list[list[tuple[str, int, int]]]:
    return [[(s.request_id, s.start_pos, s.num_tokens) for s in out.scheduled] for out in outputs]


def recorded_schedules(llm: LLM) -> list:
    """The list that every schedule the engine's scheduler makes from now on is appended to."""
    schedules = []
    schedule = llm.core.scheduler.schedule

    def recording_schedule():
        out = schedule()
        schedules.append(out)
        return out

    llm.core.scheduler.schedule = recording_schedule
    return schedules


@pytest.mark.parametrize(
    "knobs",
    [
        {"num_kv_blocks": 40, "max_num_batched_tokens": 64},  # chunked prefill + preemption
        {"num_kv_blocks": 200, "batching": "static"},
        {"num_kv_blocks": 40, "preemption_mode": "swap", "scheduling_policy": "sjf"},
        {"num_kv_blocks": 40, "kv_admission": "reserve", "predictive_admission": True},
    ],
)
def test_engine_and_simulation_schedule_identically(tiny_llama, knobs):
    knobs = {"max_num_seqs": 4, "max_model_len": 512, **knobs}
    llm = LLM(model=str(tiny_llama), dtype="float32", **knobs)
    engine_schedules = recorded_schedules(llm)
    workload = named("longtail", llm.tokenizer, num_requests=12, seed=3)
    workload = [r for r in workload if len(r.prompt_token_ids) + r.max_tokens <= 512]
    run = run_offline(llm, workload, "engine", progress=False)

    setup = build_setup(PROFILES["h100-sxm"], ModelProfile("tiny", llm.core.arch), knobs)
    sim = Simulation(setup)
    sim.record_schedules = True
    simulated = sim.run(workload, "simulated")

    assert isinstance(sim.replicas[0].scheduler, Scheduler)
    assert as_steps(sim.schedules) == as_steps(engine_schedules)
    assert len(simulated.requests) == len(run.requests) == len(workload)
    assert simulated.preemptions == run.preemptions
    if knobs.get("predictive_admission"):
        for key in ("predictive_admissions", "prediction_failures"):
            assert simulated.extra[key] == run.extra[key]
        assert run.extra["predictive_admissions"] > 0  # the case under test really predicts
    elif knobs["num_kv_blocks"] == 40:
        assert run.preemptions > 0  # the case under test really preempts


@pytest.mark.parametrize("arch", ["lfm2", "qwen3_5"])
@pytest.mark.parametrize(
    "knobs",
    [
        # prefix hits from the states saved as chunks end blocks, some given up (4 rows)
        {"num_kv_blocks": 400, "max_num_batched_tokens": 64},
        {"num_kv_blocks": 48, "preemption_mode": "swap", "max_num_batched_tokens": 96},
    ],
)
def test_a_state_carrying_model_schedules_identically(tiny_model_factory, arch, knobs):
    """A state-carrying model's hits reach only as far as a saved state, and a swapped request's
    state takes swap space: the simulation's KV manager holds the engine's saved states and
    charges the same swap blocks, so its schedule, hits and swaps are the engine's."""
    knobs = {"max_num_seqs": 4, "max_model_len": 512, **knobs}
    llm = LLM(model=str(tiny_model_factory(arch)), dtype="float32", **knobs)
    engine_schedules = recorded_schedules(llm)
    workload = named("shared_prefix", llm.tokenizer, num_requests=16, seed=3)
    run = run_offline(llm, workload, "engine", progress=False)

    profile = ModelProfile("tiny", llm.core.arch, "fp32", "fp32")  # (the engine's dtype)
    setup = build_setup(PROFILES["h100-sxm"], profile, knobs)
    sim = Simulation(setup)
    sim.record_schedules = True
    simulated = sim.run(workload, "simulated")

    assert as_steps(sim.schedules) == as_steps(engine_schedules)
    engine_kv, sim_kv = llm.core.kv_cache_manager, sim.replicas[0].kv
    assert sim_kv.prefix_stats.hits == engine_kv.prefix_stats.hits > 0
    assert sim_kv.snapshots.num_evicted == engine_kv.snapshots.num_evicted
    assert simulated.preemptions == run.preemptions
    if "preemption_mode" in knobs:
        assert run.preemptions > 0 and sim_kv.swap_state_blocks == engine_kv.swap_state_blocks > 0
        assert sim.replicas[0].scheduler.num_swaps == llm.core.scheduler.num_swaps > 0
