"""Calibration's maths: fit the cost model of the local CPU to the engine's measured steps, and
compare a measured run with its simulation. (`inflight bench calibrate` runs the engine and
calls these.)

The engine and the simulator schedule a workload identically (same scheduler, same pool), so
the engine's step i and the simulated step i did the same work; the fit is a least-squares
regression of the measured step times on that work:

    step time = weights / bandwidth                      (read once per step, at the measured rate)
                + overhead + per-sequence * seqs         (host time: Python, input prep, sampling)
                + kv bytes / (bandwidth * kv efficiency) (attention reads)
                + FLOPs / (peak * compute efficiency)    (matmuls)

with every coefficient >= 0. The CPU's kernels run one after another, so the calibrated
profile adds memory and compute time (`combine="sum"`) rather than overlapping them.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
from collections.abc import Sequence

import numpy as np

from inflight.metrics.stats import StepStats
from inflight.sim.cost_model import LineCost, StepWork, model_step_work, step_amounts
from inflight.sim.hardware import HardwareProfile
from inflight.sim.model_profile import ModelProfile
from inflight.sim.simulator import SimSetup, Simulation
from inflight.workload.requests import WorkloadRequest
from inflight.workload.results import RunResult, summarize

logger = logging.getLogger("inflight.sim")


def step_times(run: RunResult) -> np.ndarray:
    """Time between consecutive step ends: the whole loop (step, output processing, request
    intake), which is what wall time is made of when requests are waiting."""
    ends = np.array([s.t for s in run.timeline])
    return np.diff(ends, prepend=0.0)


def schedule_works(setup: SimSetup, workload: list[WorkloadRequest]) -> list[StepWork]:
    sim = Simulation(setup)
    sim.record_schedules = True
    sim.run(workload, "schedule")
    return [model_step_work(out, setup.model.arch) for out in sim.schedules]


def nonnegative_lstsq(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Least squares with coefficients >= 0, by trying every subset of columns (few columns)."""
    best, best_err = np.zeros(x.shape[1]), float(np.sum(y**2))
    for k in range(1, x.shape[1] + 1):
        for cols in itertools.combinations(range(x.shape[1]), k):
            coef, *_ = np.linalg.lstsq(x[:, cols], y, rcond=None)
            if np.all(coef >= 0):
                err = float(np.sum((x[:, cols] @ coef - y) ** 2))
                if err < best_err:
                    best = np.zeros(x.shape[1])
                    best[list(cols)] = coef
                    best_err = err
    return best


def fit_profile(
    local: HardwareProfile, model: ModelProfile, works: list[StepWork], measured: np.ndarray
) -> HardwareProfile:
    if len(works) != len(measured):
        raise RuntimeError(
            f"engine ran {len(measured)} steps, the simulated schedule {len(works)}: the two "
            "did not schedule the same way, so their steps cannot be paired"
        )
    bw = local.memory_bw
    peak = local.peak_flops(model.compute_dtype)
    amounts = np.array([step_amounts(model, w) for w in works])  # [steps, 3]
    weight_s, kv_s, flop_s = amounts[:, 0] / bw, amounts[:, 1] / bw, amounts[:, 2] / peak
    seqs = np.array([w.num_seqs for w in works], dtype=float)
    x = np.stack([np.ones_like(seqs), seqs, kv_s, flop_s], axis=1)
    overhead, per_seq, kv_factor, flop_factor = nonnegative_lstsq(x, measured - weight_s)
    predicted = x @ np.array([overhead, per_seq, kv_factor, flop_factor]) + weight_s
    return dataclasses.replace(
        local,
        name="local-cpu-calibrated",
        source=local.source + f"; fitted to {len(works)} engine steps of {model.name}",
        combine="sum",
        step_overhead_s=float(overhead),
        seq_overhead_s=float(per_seq),
        kv_bw_efficiency=1.0 / kv_factor if kv_factor > 0 else 1e9,
        compute_efficiency=1.0 / flop_factor if flop_factor > 0 else 1e9,
        notes={
            "fit_total_error": float(predicted.sum() / measured.sum() - 1),
            "fit_step_r2": float(
                1 - np.sum((predicted - measured) ** 2) / np.sum((measured - measured.mean()) ** 2)
            ),
        },
    )


METRICS = (  # (label, summary key, percentile or None)
    ("output tokens/s", "output_tok_per_s", None),
    ("wall time (s)", "wall_s", None),
    ("steps", "steps", None),
    ("mean sequences/step", "mean_batch_seqs", None),
    ("TTFT p50 (s)", "ttft_s", "p50"),
    ("TTFT p99 (s)", "ttft_s", "p99"),
    ("TPOT p50 (s)", "tpot_s", "p50"),
    ("e2e p50 (s)", "e2e_s", "p50"),
    ("e2e p99 (s)", "e2e_s", "p99"),
)


def compare_runs(measured: RunResult, simulated: RunResult) -> list[dict]:
    """Per metric: measured, simulated, relative error of the simulation."""
    a, b = summarize(measured), summarize(simulated)
    rows = []
    for label, key, pct in METRICS:
        m, s = a.get(key), b.get(key)
        if pct is not None:
            m, s = (m or {}).get(pct), (s or {}).get(pct)
        if m is None or s is None:
            continue
        rows.append({"metric": label, "measured": m, "simulated": s,
                     "error": (s - m) / m if m else None})  # fmt: skip
    return rows


def fit_line(steps: Sequence[StepStats]) -> LineCost:
    """Least squares (coefficients >= 0) of each step's period on its tokens and sequences. A
    step followed by work is timed to the next step's end (the whole loop: output processing
    and intake too); one after which the engine had nothing left, by its own duration (what
    follows may be idle time)."""
    rows, periods = [], []
    for before, step in zip([None, *steps[:-1]], steps, strict=True):
        busy = before is not None and before.num_running + before.num_waiting > 0
        periods.append(step.t - before.t if busy and before is not None else step.duration_s)
        rows.append([1.0, step.num_batched_tokens, step.num_scheduled_seqs])
    if len(rows) < 3:
        raise ValueError("a line needs at least 3 steps")
    base, per_token, per_seq = nonnegative_lstsq(np.array(rows), np.array(periods))
    return LineCost(float(base), float(per_token), float(per_seq))
