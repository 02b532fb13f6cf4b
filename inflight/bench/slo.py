"""`inflight bench slo`: goodput past saturation, FCFS against SLO-aware admission, measured over
HTTP and predicted by the simulator.

1. A server with no targets (`inflight serve`, FCFS) takes a burst of the workload at once; its
   capacity is the burst's requests over its makespan, and the offered rate is `--load` times
   that.
2. The same server, then one with `--slo-ttft` / `--slo-tpot` (SLO admission, `core/slo.py`),
   each take the same Poisson arrivals at that rate for `--duration` seconds, as streaming
   completions. Goodput is the requests that met both targets (TTFT and mean TPOT, measured at
   the client) per second of the run; a refusal (429) is timed from send to answer.
3. The engine runs the burst offline once more, the simulator's cost model of this CPU is
   fitted to it (`sim/calibrate.py`), and the simulator runs both configurations on the same
   arrivals with the same scheduler and admission code: its goodput is set beside the measured.

Results: slo.json, summary.md and slo.png (goodput measured and simulated, per configuration).
"""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import json
import logging
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from inflight.bench.server_peers import free_port, serve_flags, start_server, stop_server
from inflight.workload.requests import WorkloadRequest, named

logger = logging.getLogger("inflight.bench")


@dataclass(frozen=True)
class Outcome:
    """One request as the client saw it."""

    status: int  # HTTP status (0: the connection failed)
    ttft: float | None = None  # send -> first text, s
    e2e: float | None = None  # send -> last byte, s
    output_tokens: int = 0

    @property
    def tpot(self) -> float | None:
        if self.ttft is None or self.e2e is None or self.output_tokens < 2:
            return None
        return (self.e2e - self.ttft) / (self.output_tokens - 1)

    def met(self, ttft: float, tpot: float) -> bool:
        return (self.status == 200 and self.ttft is not None and self.ttft <= ttft
                and (self.tpot is None or self.tpot <= tpot))  # fmt: skip


def parse_targets(text: str) -> tuple[float, float]:
    """`ttft=1.0,tpot=0.1` -> (1.0, 0.1), both required and positive."""
    values: dict[str, float] = {}
    for part in text.split(","):
        key, _, value = part.partition("=")
        values[key.strip()] = float(value)
    if set(values) != {"ttft", "tpot"} or min(values.values()) <= 0:
        raise ValueError(f"--slo wants ttft=SECONDS,tpot=SECONDS (positive), got {text!r}")
    return values["ttft"], values["tpot"]


async def _send(client: httpx.AsyncClient, url: str, r: WorkloadRequest, start: float) -> Outcome:
    await asyncio.sleep(max(0.0, r.arrival_time - (time.perf_counter() - start)))
    sent = time.perf_counter()
    body = {"model": "bench", "prompt": r.prompt_token_ids, "max_tokens": r.max_tokens,
            "temperature": 0, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}}  # fmt: skip
    ttft, tokens = None, 0
    try:
        async with client.stream("POST", f"{url}/v1/completions", json=body) as resp:
            if resp.status_code != 200:
                await resp.aread()
                return Outcome(resp.status_code, e2e=time.perf_counter() - sent)
            async for line in resp.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if chunk.get("usage"):
                    tokens = chunk["usage"]["completion_tokens"]
                elif ttft is None and any(c.get("text") for c in chunk.get("choices", [])):
                    ttft = time.perf_counter() - sent
    except httpx.HTTPError:
        return Outcome(0)
    return Outcome(200, ttft, time.perf_counter() - sent, tokens)


async def _load(url: str, workload: list[WorkloadRequest]) -> tuple[list[Outcome], float]:
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(timeout=None, limits=limits) as client:
        start = time.perf_counter()
        outcomes = await asyncio.gather(*(_send(client, url, r, start) for r in workload))
        return list(outcomes), time.perf_counter() - start


def _percentile(values: list[float], q: float) -> float | None:
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 4) if ordered else None


def summarize_run(name: str, outcomes: list[Outcome], wall: float, ttft: float,
                  tpot: float) -> dict[str, Any]:  # fmt: skip
    served = [o for o in outcomes if o.status == 200]
    refused = [o for o in outcomes if o.status == 429]
    met = [o for o in outcomes if o.met(ttft, tpot)]
    ttfts = [o.ttft for o in served if o.ttft is not None]
    return {
        "run": name, "requests": len(outcomes), "served": len(served), "refused": len(refused),
        "errors": len(outcomes) - len(served) - len(refused), "met": len(met),
        "wall_s": round(wall, 2), "goodput_req_s": round(len(met) / wall, 4),
        "ttft_p50_s": _percentile(ttfts, 0.5), "ttft_p99_s": _percentile(ttfts, 0.99),
        "tpot_p50_s": _percentile([o.tpot for o in served if o.tpot is not None], 0.5),
        "refusal_p99_ms": _percentile([o.e2e * 1e3 for o in refused if o.e2e is not None], 0.99),
        "refusal_max_ms": _percentile([o.e2e * 1e3 for o in refused if o.e2e is not None], 1.0),
    }  # fmt: skip


def _with_server(knobs: dict[str, Any], model: str | None, fn: Any) -> Any:
    port = free_port()
    cmd = [sys.executable, "-m", "inflight", "serve", *([model] if model else []),
           "--port", str(port), "--served-model-name", "bench", *serve_flags(knobs)]  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    proc = start_server(cmd, url, timeout_s=600)
    try:
        return fn(url)
    finally:
        stop_server(proc)


def predict(knobs: dict[str, Any], burst: list[WorkloadRequest],
            runs: dict[str, tuple[dict[str, Any], list[WorkloadRequest]]], ttft: float,
            tpot: float) -> dict[str, dict[str, Any]]:  # fmt: skip
    """The simulator's goodput for each run, its cost model fitted to an offline run of the
    burst on this CPU."""
    from inflight.bench.offline import run_offline
    from inflight.engine.llm import LLM
    from inflight.sim.calibrate import fit_profile, schedule_works, step_times
    from inflight.sim.hardware import measure_local
    from inflight.sim.simulator import setup_like_engine, simulate

    plain = {k: v for k, v in knobs.items() if not k.startswith("slo_")}
    llm = LLM(**plain)
    fit_run = run_offline(llm, burst, "calibration burst")
    base = setup_like_engine(measure_local(), llm.core, plain)
    del llm
    gc.collect()
    profile = fit_profile(base.hardware, base.model, schedule_works(base, burst),
                          step_times(fit_run))  # fmt: skip
    predicted = {}
    for name, (run_knobs, workload) in runs.items():
        scheduler = dataclasses.replace(base.scheduler, **run_knobs)
        setup = dataclasses.replace(base, hardware=profile, scheduler=scheduler)
        result = simulate(setup, workload, name)
        met = [r for r in result.requests
               if r.ttft <= ttft and (r.tpot is None or r.tpot <= tpot)]  # fmt: skip
        predicted[name] = {"goodput_req_s": round(len(met) / result.wall_s, 4),
                           "refused": result.extra["refused"], "met": len(met),
                           "wall_s": round(result.wall_s, 2)}  # fmt: skip
    return predicted


def run_slo_bench(args: Any, knobs: dict[str, Any], out: Path) -> dict[str, Any]:
    from inflight.model.loader import resolve_model_path
    from inflight.tokenizer import load_tokenizer

    ttft, tpot = parse_targets(args.slo)
    model = knobs.get("model")
    tokenizer = load_tokenizer(resolve_model_path(model))
    plain = {k: v for k, v in knobs.items() if k not in ("model", "slo_ttft", "slo_tpot")}
    burst = named(args.workload, tokenizer, args.workload_seed, args.burst_requests, "all")

    def fcfs_runs(url: str) -> tuple[float, tuple[list[Outcome], float]]:
        outcomes, wall = asyncio.run(_load(url, burst))
        capacity = sum(o.status == 200 for o in outcomes) / wall
        rate = args.load * capacity
        logger.info("capacity %.3f req/s; offering %.3f req/s for %g s", capacity, rate,
                    args.duration)  # fmt: skip
        workload[:] = named(args.workload, tokenizer, args.workload_seed + 1,
                            max(1, round(rate * args.duration)), "poisson", rate)  # fmt: skip
        return capacity, asyncio.run(_load(url, workload))

    workload: list[WorkloadRequest] = []
    fcfs_knobs = {"scheduling_policy": "fcfs"}
    capacity, (fcfs, fcfs_wall) = _with_server(plain | fcfs_knobs, model, fcfs_runs)
    slo_knobs = {"slo_ttft": ttft, "slo_tpot": tpot, "scheduling_policy": args.policy}
    slo, slo_wall = _with_server(plain | slo_knobs, model,
                                 lambda url: asyncio.run(_load(url, workload)))  # fmt: skip
    runs = [summarize_run("fcfs, no targets", fcfs, fcfs_wall, ttft, tpot),
            summarize_run(f"{args.policy}, SLO admission", slo, slo_wall, ttft, tpot)]  # fmt: skip
    predicted = predict(knobs | plain, burst, {
        runs[0]["run"]: (fcfs_knobs, workload), runs[1]["run"]: (slo_knobs, workload),
    }, ttft, tpot) if args.simulate else {}  # fmt: skip
    for run in runs:
        if run["run"] in predicted:
            run["simulated"] = predicted[run["run"]]
    rate = len(workload) / args.duration
    report = {"model": str(model or "default"), "workload": args.workload,
              "targets": {"ttft_s": ttft, "tpot_s": tpot}, "capacity_req_s": round(capacity, 4),
              "load": args.load, "offered_req_s": round(rate, 4), "duration_s": args.duration,
              "knobs": {k: str(v) for k, v in plain.items()}, "runs": runs,
              "goodput_ratio": round(runs[1]["goodput_req_s"]
                                     / max(runs[0]["goodput_req_s"], 1e-9), 2)}  # fmt: skip
    out.mkdir(parents=True, exist_ok=True)
    (out / "slo.json").write_text(json.dumps(report, indent=2) + "\n")
    (out / "summary.md").write_text(summary(report))
    plot(report, out / "slo.png")
    return report


def summary(report: dict[str, Any]) -> str:
    t = report["targets"]
    lines = [
        f"`{report['workload']}` at {report['load']:g}x the measured capacity "
        f"({report['capacity_req_s']} req/s): {report['offered_req_s']} req/s for "
        f"{report['duration_s']:g} s; targets TTFT {t['ttft_s']:g} s, TPOT {t['tpot_s']:g} s.",
        "",
        "| run | served | refused | met targets | goodput req/s (simulated) | TTFT p50 / p99 s "
        "| TPOT p50 s | refusal p99 / max ms |",
        "|---|---|---|---|---|---|---|---|",
    ]  # fmt: skip
    for r in report["runs"]:
        sim = r.get("simulated", {}).get("goodput_req_s", "-")
        lines.append(
            f"| {r['run']} | {r['served']} | {r['refused']} | {r['met']} | {r['goodput_req_s']} "
            f"({sim}) | {r['ttft_p50_s']} / {r['ttft_p99_s']} | {r['tpot_p50_s']} | "
            f"{r['refusal_p99_ms'] or '-'} / {r['refusal_max_ms'] or '-'} |"
        )
    lines += ["", f"Goodput, SLO admission / FCFS: **{report['goodput_ratio']}x**."]
    return "\n".join(lines) + "\n"


def plot(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.6))
    names = [r["run"] for r in report["runs"]]
    measured = [r["goodput_req_s"] for r in report["runs"]]
    simulated = [r.get("simulated", {}).get("goodput_req_s", 0) for r in report["runs"]]
    xs = range(len(names))
    ax.bar([x - 0.2 for x in xs], measured, width=0.4, label="measured")
    ax.bar([x + 0.2 for x in xs], simulated, width=0.4, label="simulated")
    ax.axhline(report["capacity_req_s"], color="gray", linestyle=":", label="capacity")
    ax.set_xticks(list(xs), names)
    ax.set_ylabel("goodput (requests within targets / s)")
    ax.set_title(f"{report['load']:g}x saturation, TTFT <= {report['targets']['ttft_s']:g} s, "
                 f"TPOT <= {report['targets']['tpot_s']:g} s")  # fmt: skip
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
