"""Capacity planning and the calibration fit, on hand-made cases."""

from __future__ import annotations

import numpy as np
import pytest

from inflight.sim.calibrate import fit_profile, nonnegative_lstsq
from inflight.sim.cost_model import CostModel, StepWork
from inflight.sim.planner import plan
from inflight.workload.requests import WorkloadRequest
from tests.sim.helpers import overhead_only, toy_hardware, toy_model

KNOBS = {"num_kv_blocks": 64, "max_model_len": 256}


def test_plan_returns_fewest_replicas_that_meet_the_target():
    """4 requests at once, 1 s per step, 2 tokens each. One seat per replica: TTFTs 1, 3, 5, 7
    on one replica, 1, 1, 3, 3 on two, all 1 on four. Four seats: all 1 on one replica."""
    workload = [WorkloadRequest([1, 2, 3], 2) for _ in range(4)]
    single_seat = plan(overhead_only(), toy_model(), KNOBS, workload, slo_ttft_p99=1.5,
                       max_replicas=4, seqs_grid=(1,), tokens_grid=(64,))  # fmt: skip
    assert single_seat.best["replicas"] == 4
    assert [r["meets"] for r in single_seat.rows] == [False, False, False, True]
    wide = plan(overhead_only(), toy_model(), KNOBS, workload, slo_ttft_p99=1.5,
                max_replicas=4, seqs_grid=(1, 4), tokens_grid=(64,))  # fmt: skip
    assert (wide.best["replicas"], wide.best["max_num_seqs"]) == (1, 4)


def test_plan_needs_a_target():
    with pytest.raises(ValueError, match="target"):
        plan(overhead_only(), toy_model(), KNOBS, [], max_replicas=1)


def test_nonnegative_lstsq_clips_a_coefficient_that_would_go_negative():
    x = np.array([[1.0, 0.0], [1.0, 1.0], [1.0, 2.0]])
    assert nonnegative_lstsq(x, 2.0 + 3.0 * x[:, 1]) == pytest.approx([2.0, 3.0])
    assert nonnegative_lstsq(x, 5.0 - 1.0 * x[:, 1]) == pytest.approx([4.0, 0.0])


def test_fit_recovers_the_profile_that_generated_the_steps():
    model = toy_model()
    truth = toy_hardware(combine="sum", step_overhead_s=0.3, seq_overhead_s=0.05,
                         kv_bw_efficiency=0.5, compute_efficiency=0.25)  # fmt: skip
    rng = np.random.default_rng(0)
    works = [StepWork(num_tokens=int(n), num_seqs=int(s), num_sampled=int(s),
                      kv_read_tokens=int(k), attention_pairs=int(p))
             for n, s, k, p in rng.integers(1, 50, size=(40, 4))]  # fmt: skip
    measured = np.array([CostModel(truth, model, 16).cost(w).seconds for w in works])
    fitted = fit_profile(toy_hardware(), model, works, measured)
    assert fitted.step_overhead_s == pytest.approx(0.3)
    assert fitted.seq_overhead_s == pytest.approx(0.05)
    assert fitted.kv_bw_efficiency == pytest.approx(0.5)
    assert fitted.compute_efficiency == pytest.approx(0.25)
    assert fitted.notes["fit_step_r2"] == pytest.approx(1.0)


def test_fit_refuses_unpaired_steps():
    with pytest.raises(RuntimeError, match="same way"):
        fit_profile(toy_hardware(), toy_model(), [StepWork()], np.array([1.0, 2.0]))


def test_a_step_line_is_fitted_to_a_runs_periods_and_costs_steps_by_it():
    """Steps timed to the next step's end while work was left (the whole loop), by their own
    duration after an idle engine; the line through them prices a schedule."""
    from inflight.core.outputs import SchedulerOutput
    from inflight.metrics.stats import StepStats
    from inflight.sim.calibrate import fit_line

    def true_period(tokens: int, seqs: int) -> float:
        return 0.01 + 0.001 * tokens + 0.002 * seqs

    steps, t = [], 0.0
    for i, (tokens, seqs) in enumerate([(5, 1), (40, 3), (13, 2), (90, 4), (27, 2), (8, 8)]):
        idle_after = i == 2  # nothing left after it: an idle gap follows, not counted
        t += true_period(tokens, seqs) + (5.0 if i == 3 else 0.0)  # the gap before step 3
        steps.append(StepStats(t=t, duration_s=true_period(tokens, seqs) - 0.0,
                               num_batched_tokens=tokens, num_scheduled_seqs=seqs,
                               num_running=0 if idle_after else 1))  # fmt: skip
    line = fit_line(steps)
    assert (line.base_s, line.per_token_s, line.per_seq_s) == pytest.approx((0.01, 0.001, 0.002))
    out = SchedulerOutput(scheduled=[object()] * 3, num_batched_tokens=100)  # type: ignore[list-item]
    assert line.step_cost(out).seconds == pytest.approx(true_period(100, 3))
