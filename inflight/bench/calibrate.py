"""`inflight bench calibrate`: run the engine on two workloads, fit the local CPU's cost model
to the first (`inflight.sim.calibrate`), and check the fitted model on the second, which it was
not fitted on."""

from __future__ import annotations

import dataclasses
import gc
from pathlib import Path

from inflight.bench.offline import run_offline
from inflight.engine.llm import LLM
from inflight.sim.calibrate import compare_runs, fit_profile, schedule_works, step_times
from inflight.sim.hardware import measure_local
from inflight.sim.simulator import setup_like_engine, simulate
from inflight.workload.report import write_report
from inflight.workload.requests import named


def run_calibration(
    knobs: dict, fit_name: str, check_name: str, out: Path, num_requests: int | None = None
) -> str:
    """Measures this CPU, runs the engine on both workloads (each on a fresh KV pool: a warm
    prefix cache would change the schedule), fits on the first, checks on the second. Writes
    `cpu-profile.json` (use it as `--hardware`), `calibration.md` and the check's report."""

    local = measure_local()
    loaded, runs = None, {}
    for name in (fit_name, check_name):
        llm = LLM(loaded_model=loaded, **knobs)
        loaded = llm.core.loaded
        workload = named(name, llm.tokenizer, num_requests=num_requests)
        runs[name] = (workload, run_offline(llm, workload, f"engine-{name}"))
        setup = setup_like_engine(local, llm.core, knobs)
        del llm
        gc.collect()
    model = setup.model
    workload, fit_run = runs[fit_name]
    works = schedule_works(setup, workload)
    profile = fit_profile(local, model, works, step_times(fit_run))
    out.mkdir(parents=True, exist_ok=True)
    profile.save(out / "cpu-profile.json")

    kv_text = (
        "KV reads: no cost beyond the per-sequence term"
        if profile.kv_bw_efficiency >= 1e3
        else f"KV reads at {profile.kv_bw_efficiency:.0%} of the bandwidth"
    )
    lines = [f"# Calibration: {model.name} ({model.weight_dtype}) on this CPU", "",
             f"Measured: read bandwidth {local.memory_bw / 1e9:.1f} GB/s, bf16 matmul "
             f"{local.flops['bf16'] / 1e9:.0f} GFLOP/s, fp32 {local.flops['fp32'] / 1e9:.0f}.",
             f"Fitted on `{fit_name}` ({len(works)} steps, step-time R^2 "
             f"{profile.notes['fit_step_r2']:.3f}): overhead {profile.step_overhead_s * 1e3:.1f} "
             f"ms/step + {profile.seq_overhead_s * 1e3:.2f} ms/sequence, compute at "
             f"{profile.compute_efficiency:.0%} of the bf16 peak, {kv_text}.", ""]  # fmt: skip
    for name in (fit_name, check_name):
        workload, measured = runs[name]
        simulated = simulate(dataclasses.replace(setup, hardware=profile), workload, "simulated")
        write_report(out / name, f"calibration on {name}: engine vs simulated",
                     [measured, simulated], {"profile": str(out / "cpu-profile.json")})  # fmt: skip
        role = "fit" if name == fit_name else "check (not fitted on)"
        lines += [f"## `{name}` ({role})", "", "| metric | engine | simulated | error |",
                  "|---|---|---|---|"]  # fmt: skip
        for row in compare_runs(measured, simulated):
            err = "-" if row["error"] is None else f"{row['error']:+.1%}"
            lines.append(f"| {row['metric']} | {row['measured']:.4g} | {row['simulated']:.4g} "
                         f"| {err} |")  # fmt: skip
        lines.append("")
    text = "\n".join(lines)
    (out / "calibration.md").write_text(text)
    return text
