"""Capacity planning: the cheapest setting that meets a P99 latency target at a request rate.

Cost is the number of replicas (GPUs). For each replica count, from one up, every combination
of `max_num_seqs` and `max_num_batched_tokens` is simulated on the same Poisson workload; the
first replica count with a setting that meets every target wins, and among its settings the one
with the most headroom (lowest worst ratio of P99 to target) is returned.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from inflight.errors import ConfigError
from inflight.sim.hardware import HardwareProfile, Link
from inflight.sim.model_profile import ModelProfile
from inflight.sim.simulator import build_setup, simulate
from inflight.workload.requests import WorkloadRequest
from inflight.workload.results import summarize


@dataclass
class PlanResult:
    rows: list[dict] = field(default_factory=list)  # every setting simulated
    best: dict | None = None


def headroom(summary: dict, slo_ttft_p99: float | None, slo_tpot_p99: float | None) -> float:
    """Worst ratio of P99 to its target (<= 1 meets every target); inf without data."""
    ratios = []
    for key, slo in (("ttft_s", slo_ttft_p99), ("tpot_s", slo_tpot_p99)):
        if slo is not None:
            p99 = summary[key].get("p99")
            ratios.append(float("inf") if p99 is None else p99 / slo)
    return max(ratios)


def plan(
    hardware: HardwareProfile,
    model: ModelProfile,
    knobs: dict,
    workload: list[WorkloadRequest],
    slo_ttft_p99: float | None = None,
    slo_tpot_p99: float | None = None,
    max_replicas: int = 8,
    seqs_grid: tuple[int, ...] = (16, 32, 64, 128, 256),
    tokens_grid: tuple[int, ...] = (2048, 8192),
    memory_utilization: float = 0.9,
    progress=None,
    link: Link | None = None,
) -> PlanResult:
    """`link`: what joins each replica's tensor-parallel ranks, where the model has several."""
    if slo_ttft_p99 is None and slo_tpot_p99 is None:
        raise ValueError("give a P99 TTFT target, a P99 TPOT target, or both")
    result = PlanResult()
    for replicas in range(1, max_replicas + 1):
        feasible = []
        for seqs, tokens in itertools.product(seqs_grid, tokens_grid):
            row = {"replicas": replicas, "max_num_seqs": seqs, "max_num_batched_tokens": tokens}
            setting = {**knobs, "max_num_seqs": seqs, "max_num_batched_tokens": tokens}
            try:
                setup = build_setup(hardware, model, setting, replicas, memory_utilization,
                                    link=link)  # fmt: skip
                summary = summarize(simulate(setup, workload, "plan"))
            except ConfigError as e:
                result.rows.append(row | {"error": str(e)})
                continue
            row |= {
                "ttft_p99_s": summary["ttft_s"].get("p99"),
                "tpot_p99_s": summary["tpot_s"].get("p99"),
                "output_tok_per_s": summary["output_tok_per_s"],
                "headroom": round(headroom(summary, slo_ttft_p99, slo_tpot_p99), 3),
            }
            row["meets"] = row["headroom"] <= 1.0
            result.rows.append(row)
            if row["meets"]:
                feasible.append(row)
            if progress is not None:
                progress.update(1)
        if feasible:
            result.best = min(feasible, key=lambda r: r["headroom"])
            break
    return result
