"""`inflight bench roofline`: how close the engine comes to this machine's physical limit.

Measures read bandwidth and bf16/fp32 matmul throughput of the engine's device (the CPU, or
the GPU's HBM and tensor cores) now, then computes the lower bound on
wall time for the workload: the engine's own schedule (simulated with the same scheduler, pool
and knobs), each step costing max(bytes / bandwidth, FLOPs / peak) with no overhead. The engine
then runs the same workload; the report's ratio `inflight-continuous / roofline` is the fraction
of the roofline reached.
"""

from __future__ import annotations

import gc
from pathlib import Path

from inflight.bench.offline import run_offline
from inflight.engine.llm import LLM
from inflight.platform import describe_device, resolve_device
from inflight.sim.hardware import measure_local
from inflight.sim.simulator import setup_like_engine, simulate
from inflight.workload.requests import WorkloadRequest
from inflight.workload.results import RunResult


def run_roofline(knobs: dict, load_workload, out: Path, title: str) -> dict:
    """`load_workload(tokenizer)` builds the workload. Returns the report (see bench.report)."""
    from inflight.workload.report import write_report

    local = measure_local(device=resolve_device(knobs.get("device", "auto")).type)
    llm = LLM(**knobs)
    workload: list[WorkloadRequest] = load_workload(llm.tokenizer)
    setup = setup_like_engine(local, llm.core, knobs)
    bound = simulate(setup, workload, "roofline")
    engine = run_offline(llm, workload, "inflight-continuous")
    meta = {
        "model": str(llm.core.loaded.path), "dtype": setup.model.weight_dtype,
        "device": describe_device(llm.core.device),
        "requests": len(workload), "max_num_seqs": setup.scheduler.max_num_seqs,
        "read bandwidth GB/s": round(local.memory_bw / 1e9, 1),
        "bf16 matmul GFLOP/s": round(local.flops["bf16"] / 1e9),
        "fp32 matmul GFLOP/s": round(local.flops["fp32"] / 1e9),
        "roofline wall s (lower bound)": round(bound.wall_s, 3),
        "engine wall s": round(engine.wall_s, 3),
        "fraction of roofline reached": float(f"{bound.wall_s / engine.wall_s:.3g}"),
    }  # fmt: skip
    del llm
    gc.collect()
    runs: list[RunResult] = [engine, bound]
    return write_report(out, title, runs, meta)
