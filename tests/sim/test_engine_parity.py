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
    engine_schedules = []
    schedule = llm.core.scheduler.schedule

    def recording_schedule():
        out = schedule()
        engine_schedules.append(out)
        return out

    llm.core.scheduler.schedule = recording_schedule
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
