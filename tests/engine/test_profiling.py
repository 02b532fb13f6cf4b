"""Phase timing: shares and overhead computed from hand-made step phases."""

from __future__ import annotations

import pytest

from inflight.metrics.profiling import NO_TIMER, PhaseTimer, breakdown
from inflight.metrics.stats import StepStats


def test_breakdown_shares_and_overhead():
    steps = [StepStats(num_scheduled_seqs=4,
                       phases={"forward": 0.6, "schedule": 0.1, "output": 0.1}),
             StepStats(num_scheduled_seqs=2, phases={"forward": 0.2, "sample": 0.0})]  # fmt: skip
    b = breakdown(steps)
    assert b["steps"] == 2
    assert list(b["phases"]) == ["forward", "schedule", "output", "sample"]
    assert b["phases"]["forward"] == {"seconds": 0.8, "share": 0.8, "ms_per_step": 400.0}
    assert b["overhead_share"] == pytest.approx(0.2)


def test_timer_accumulates_per_step_and_the_null_timer_records_nothing():
    timer = PhaseTimer()
    for _ in range(2):
        with timer.phase("schedule"):
            pass
    record = StepStats(num_scheduled_seqs=3)
    timer.end_step(record)
    (step,) = timer.steps
    assert step is record and set(step.phases) == {"schedule"}
    untimed = StepStats(num_scheduled_seqs=3)
    with NO_TIMER.phase("forward"):
        pass
    NO_TIMER.end_step(untimed)
    assert untimed.phases == {} and untimed == StepStats(num_scheduled_seqs=3)
    assert not getattr(NO_TIMER, "steps", [])  # it keeps no record either


def test_the_timer_waits_for_the_device_at_the_end_of_each_phase():
    """On a GPU, `sync` is torch.cuda.synchronize: the phase that queued the work pays for it."""
    calls: list[str] = []
    timer = PhaseTimer(sync=lambda: calls.append("sync"))
    with timer.phase("forward"):
        calls.append("forward")
    with timer.phase("sample"):
        calls.append("sample")
    assert calls == ["forward", "sync", "sample", "sync"]
