"""`inflight bench slo`: goodput past saturation, without latency targets and with SLO-aware
admission, measured over HTTP and predicted by the simulator.

1. One server (`inflight serve`, `--policy`'s queue order) takes a burst of the workload at
   once, more requests than it has seats; its capacity is the requests it completed while some
   still waited (until the burst's last first token) over that time, and the offered rate is
   `--load` times that.
2. It then takes the same Poisson arrivals at that rate for `--duration` seconds twice, as
   streaming completions: without targets, then with them in every request (`slo_ttft`,
   `slo_tpot`: SLO admission, `core/slo.py`, as the server's `--slo-ttft` / `--slo-tpot` would
   set them). Each run's prompts carry a `cache_salt` of their own, so no run reuses another's
   cached prefixes. Goodput is the requests that met both targets (TTFT and mean TPOT, measured
   at the client) per second of the run; a refusal (429) is timed from send to answer.
3. The engine runs the same arrivals offline (`LLM`, in real time, no targets), a step-cost
   line is fitted to its steps (`sim/calibrate.fit_line`: seconds on tokens and sequences), and
   the simulator runs both configurations on those arrivals with the same scheduler and
   admission code: its goodput is set beside the measured. The run without targets is the one
   it was fitted to; the run with SLO admission is a prediction.

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


async def _send(client: httpx.AsyncClient, url: str, r: WorkloadRequest, start: float,
                extra: dict[str, Any]) -> Outcome:  # fmt: skip
    await asyncio.sleep(max(0.0, r.arrival_time - (time.perf_counter() - start)))
    sent = time.perf_counter()
    body = {"model": "bench", "prompt": r.prompt_token_ids, "max_tokens": r.max_tokens,
            "temperature": 0, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}, **extra}  # fmt: skip
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


async def _load(url: str, workload: list[WorkloadRequest],
                extra: dict[str, Any]) -> tuple[list[Outcome], float]:  # fmt: skip
    """The workload at its arrival times, each body with `extra`'s fields."""
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(timeout=None, limits=limits) as client:
        start = time.perf_counter()
        outcomes = await asyncio.gather(*(_send(client, url, r, start, extra) for r in workload))
        return list(outcomes), time.perf_counter() - start


def _percentile(values: list[float], q: float) -> float | None:
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 4) if ordered else None


def saturated_rate(burst: list[Outcome]) -> float:
    """Requests a second the engine completes while requests wait: all were sent at once, so
    from the first completion to the burst's last first token every seat is busy and the
    queue holds more; the completions between, over that time."""
    ends = sorted(o.e2e for o in burst if o.status == 200 and o.e2e is not None)
    firsts = [o.ttft for o in burst if o.status == 200 and o.ttft is not None]
    if len(ends) < 2 or not firsts:
        raise RuntimeError("the capacity burst completed fewer than 2 requests")
    saturated_until = max(firsts)
    within = [e for e in ends if e <= saturated_until]
    if len(within) < 2:  # nobody waited long: the whole burst is the measure
        return (len(ends) - 1) / (ends[-1] - ends[0])
    return (len(within) - 1) / (within[-1] - within[0])


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
        "refusal_p50_ms": _percentile([o.e2e * 1e3 for o in refused if o.e2e is not None], 0.5),
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


def predict(knobs: dict[str, Any], workload: list[WorkloadRequest],
            runs: dict[str, dict[str, Any]], ttft: float,
            tpot: float) -> dict[str, dict[str, Any]]:  # fmt: skip
    """The simulator's goodput for each run (its knobs), its step cost a line fitted to an
    offline run of the workload on this CPU."""
    from inflight.bench.offline import run_offline
    from inflight.engine.llm import LLM
    from inflight.sim.calibrate import fit_line
    from inflight.sim.hardware import measure_local
    from inflight.sim.simulator import setup_like_engine, simulate

    plain = {k: v for k, v in knobs.items() if not k.startswith("slo_")}
    llm = LLM(**plain)
    fit_run = run_offline(llm, workload, "calibration")
    base = setup_like_engine(measure_local(), llm.core, plain)
    del llm
    gc.collect()
    line = fit_line(fit_run.timeline)
    logger.info("step cost: %.1f ms + %.3f ms/token + %.3f ms/sequence", line.base_s * 1e3,
                line.per_token_s * 1e3, line.per_seq_s * 1e3)  # fmt: skip
    fit_met = [
        r
        for r in fit_run.requests
        if r.ttft is not None and r.ttft <= ttft and (r.tpot is None or r.tpot <= tpot)
    ]
    predicted: dict[str, dict[str, Any]] = {"offline engine, no targets (fitted)": {
        "goodput_req_s": round(len(fit_met) / fit_run.wall_s, 4), "met": len(fit_met),
        "wall_s": round(fit_run.wall_s, 2),
        "line_ms": [round(v * 1e3, 4) for v in (line.base_s, line.per_token_s, line.per_seq_s)],
    }}  # fmt: skip
    for name, run_knobs in runs.items():
        setup = dataclasses.replace(
            base, scheduler=dataclasses.replace(base.scheduler, **run_knobs)
        )
        result = simulate(setup, workload, name, cost_model=line)
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
    logging.getLogger("httpx").setLevel(logging.WARNING)  # a line per request otherwise
    model = knobs.get("model")
    tokenizer = load_tokenizer(resolve_model_path(model))
    plain = {k: v for k, v in knobs.items() if k not in ("model", "slo_ttft", "slo_tpot")}
    burst = named(args.workload, tokenizer, args.workload_seed, args.burst_requests, "all")

    def measure(url: str) -> tuple[float, list[WorkloadRequest], list[tuple[list[Outcome], float]]]:
        capacity = saturated_rate(asyncio.run(_load(url, burst, {"cache_salt": "burst"}))[0])
        rate = args.load * capacity
        logger.info("capacity %.3f req/s; offering %.3f req/s for %g s", capacity, rate,
                    args.duration)  # fmt: skip
        workload = named(args.workload, tokenizer, args.workload_seed + 1,
                         max(1, round(rate * args.duration)), "poisson", rate)  # fmt: skip
        targets = {"slo_ttft": ttft, "slo_tpot": tpot}
        return capacity, workload, [
            asyncio.run(_load(url, workload, {"cache_salt": "plain"})),
            asyncio.run(_load(url, workload, {"cache_salt": "targets", **targets})),
        ]  # fmt: skip

    policy = {"scheduling_policy": args.policy}
    capacity, workload, ((plain_run, plain_wall), (slo_run, slo_wall)) = _with_server(
        plain | policy, model, measure
    )
    runs = [summarize_run(f"{args.policy}, no targets", plain_run, plain_wall, ttft, tpot),
            summarize_run(f"{args.policy}, SLO admission", slo_run, slo_wall, ttft,
                          tpot)]  # fmt: skip
    slo_knobs = {"slo_ttft": ttft, "slo_tpot": tpot, **policy}
    predicted = predict(knobs | plain, workload, {
        runs[0]["run"]: policy, runs[1]["run"]: slo_knobs,
    }, ttft, tpot) if args.simulate else {}  # fmt: skip
    for run in runs:
        if run["run"] in predicted:
            run["simulated"] = predicted[run["run"]]
    fitted = predicted.get("offline engine, no targets (fitted)")
    rate = len(workload) / args.duration
    report = {"model": str(model or "default"), "workload": args.workload,
              "targets": {"ttft_s": ttft, "tpot_s": tpot}, "capacity_req_s": round(capacity, 4),
              "load": args.load, "offered_req_s": round(rate, 4), "duration_s": args.duration,
              "knobs": {k: str(v) for k, v in plain.items()}, "runs": runs,
              "offline_fit_run": fitted,
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
        "| TPOT p50 s | refusal p50 / p99 / max ms |",
        "|---|---|---|---|---|---|---|---|",
    ]  # fmt: skip
    for r in report["runs"]:
        sim = r.get("simulated", {}).get("goodput_req_s", "-")
        lines.append(
            f"| {r['run']} | {r['served']} | {r['refused']} | {r['met']} | {r['goodput_req_s']} "
            f"({sim}) | {r['ttft_p50_s']} / {r['ttft_p99_s']} | {r['tpot_p50_s']} | "
            f"{r['refusal_p50_ms'] or '-'} / {r['refusal_p99_ms'] or '-'} / "
            f"{r['refusal_max_ms'] or '-'} |"
        )
    lines += ["", f"Goodput, SLO admission / no targets: **{report['goodput_ratio']}x**."]
    fit = report.get("offline_fit_run")
    if fit:
        base, per_token, per_seq = fit["line_ms"]
        lines += ["", f"The simulator's step cost, fitted to the engine run offline on the same "
                  f"arrivals without targets (goodput {fit['goodput_req_s']} req/s there): "
                  f"{base} ms + {per_token} ms a token + {per_seq} ms a sequence."]  # fmt: skip
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
