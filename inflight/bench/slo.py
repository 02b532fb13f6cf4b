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
3. While the burst ran, a dashboard watched the server: its own step records (the belt) give a
   step-cost line (`sim/calibrate.fit_line`: seconds on tokens and sequences), and the
   simulator runs both configurations on the Poisson arrivals with the same scheduler and
   admission code, the server's pool and context: its goodput, a prediction for both runs (it
   was fitted to neither), is set beside the measured.

Results: slo.json, summary.md and slo.png (goodput measured and simulated, per configuration).
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from inflight.bench.serve import Outcome, send_completion
from inflight.bench.server_peers import free_port, serve_flags, start_server, stop_server
from inflight.metrics.stats import StepStats
from inflight.workload.report import write_mode_report
from inflight.workload.requests import WorkloadRequest, named

logger = logging.getLogger("inflight.bench")


def parse_targets(text: str) -> tuple[float, float]:
    """`ttft=1.0,tpot=0.1` -> (1.0, 0.1), both required and positive."""
    values: dict[str, float] = {}
    for part in text.split(","):
        key, _, value = part.partition("=")
        values[key.strip()] = float(value)
    if set(values) != {"ttft", "tpot"} or min(values.values()) <= 0:
        raise ValueError(f"--slo wants ttft=SECONDS,tpot=SECONDS (positive), got {text!r}")
    return values["ttft"], values["tpot"]


async def _load(url: str, workload: list[WorkloadRequest],
                extra: dict[str, Any]) -> tuple[list[Outcome], float]:  # fmt: skip
    """The workload at its arrival times, each body with `extra`'s fields."""
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(timeout=None, limits=limits) as client:
        start = time.perf_counter()
        outcomes = await asyncio.gather(
            *(send_completion(client, url, "bench", r, start, extra) for r in workload)
        )
        return list(outcomes), time.perf_counter() - start


def _percentile(values: list[float], q: float) -> float | None:
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 4) if ordered else None


def saturated_rate(burst: list[Outcome]) -> float:
    """Requests a second the engine completes while requests wait: all were sent at once, so
    from the first completion to the burst's last first token every seat is busy and the queue
    holds more; the completions between, over that time (the whole burst's where fewer than two
    came by then). Completions bunched into a span under half the time to the first of them
    (one step finishing the whole burst) measure no rate: then the burst's completions over the
    time from its send to the last of them."""
    ends = sorted(o.e2e for o in burst if o.status == 200 and o.e2e is not None)
    firsts = [o.ttft for o in burst if o.status == 200 and o.ttft is not None]
    if len(ends) < 2 or not firsts:
        raise RuntimeError("the capacity burst completed fewer than 2 requests")
    within = [e for e in ends if e <= max(firsts)]
    counted = within if len(within) >= 2 else ends
    span = counted[-1] - counted[0]
    if span < 0.5 * counted[0]:
        return len(counted) / counted[-1]
    return (len(counted) - 1) / span


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
        "tpot_p50_s": _percentile([t for o in served if (t := o.record.tpot) is not None], 0.5),
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


async def _watched(url: str, workload: list[WorkloadRequest], extra: dict[str, Any],
                   ) -> tuple[list[Outcome], list[list[float]]]:  # fmt: skip
    """The workload through the server while a dashboard watches it: the outcomes, and the
    server's own step records meanwhile (its belt rows: t, step ms, prompt tokens, decode
    tokens, sequences, KV usage)."""
    rows: list[list[float]] = []
    done = asyncio.Event()

    async def watch() -> None:
        async with httpx.AsyncClient(timeout=None) as client, client.stream(
            "GET", f"{url}/dashboard/events") as resp:  # fmt: skip
            async for line in resp.aiter_lines():
                if line.startswith("data: "):
                    rows.extend(json.loads(line[6:]).get("steps", []))
                if done.is_set():
                    return

    watcher = asyncio.create_task(watch())
    await asyncio.sleep(0.5)  # connected: every step of the run is on its belt
    outcomes, _ = await _load(url, workload, extra)
    await asyncio.sleep(1.0)  # the last steps' update (4 a second)
    done.set()
    await asyncio.wait_for(watcher, 10)
    return outcomes, rows


def steps_of(rows: list[list[float]]) -> list[StepStats]:
    """Belt rows as step records for `fit_line`: a step is busy (timed to the next step's end)
    where the next one followed within 20 ms of its own duration, and idle otherwise."""
    steps = []
    for i, (t, ms, prompt, decode, seqs, _) in enumerate(rows):
        after = rows[i + 1] if i + 1 < len(rows) else None
        busy = after is not None and after[0] - t - after[1] / 1e3 < 0.02
        steps.append(StepStats(t=t, duration_s=ms / 1e3, num_batched_tokens=int(prompt + decode),
                               num_scheduled_seqs=int(seqs), num_running=int(busy)))  # fmt: skip
    return steps


def predict(knobs: dict[str, Any], workload: list[WorkloadRequest],
            runs: dict[str, dict[str, Any]], ttft: float, tpot: float,
            burst_rows: list[list[float]], served: dict[str, str]) -> dict[str, Any]:  # fmt: skip
    """The simulator's goodput for each run (its knobs), on a step-cost line fitted to the
    server's own steps during the capacity burst, with the server's pool and context."""
    from inflight.sim.calibrate import fit_line
    from inflight.sim.hardware import HardwareProfile
    from inflight.sim.model_profile import load_model_profile
    from inflight.sim.simulator import ENGINE_ONLY_KNOBS, build_setup, simulate

    line = fit_line(steps_of(burst_rows))
    logger.info("step cost: %.1f ms + %.3f ms/token + %.3f ms/sequence", line.base_s * 1e3,
                line.per_token_s * 1e3, line.per_seq_s * 1e3)  # fmt: skip
    sim_knobs = {k: v for k, v in knobs.items() if k not in ENGINE_ONLY_KNOBS}
    sim_knobs |= {"num_kv_blocks": int(served["num_kv_blocks"]),
                  "max_model_len": int(served["max_model_len"])}  # fmt: skip
    model = load_model_profile(knobs.get("model"), "fp32", "fp32")
    predicted: dict[str, Any] = {"line_ms": [round(v * 1e3, 4) for v in (
        line.base_s, line.per_token_s, line.per_seq_s)], "steps": len(burst_rows)}  # fmt: skip
    # a CPU whose steps cost what the line says (the profile's rates are not read)
    cpu = HardwareProfile(name="this CPU", memory_bytes=2**40, memory_bw=1.0,
                          flops={"fp32": 1.0, "bf16": 1.0}, host_link_bw=1.0,
                          source="the server's own steps", is_cpu=True)  # fmt: skip
    for name, run_knobs in runs.items():
        setup = build_setup(cpu, model, sim_knobs | run_knobs)
        result = simulate(setup, workload, name, cost_model=line)
        met = [r for r in result.requests if r.within(ttft, tpot)]
        predicted[name] = {"goodput_req_s": round(len(met) / result.wall_s, 4),
                           "refused": result.extra["refused"], "met": len(met),
                           "wall_s": round(result.wall_s, 2)}  # fmt: skip
    return predicted


def _served_knobs(url: str) -> dict[str, str]:
    """The knobs the server resolved (its pool, its context), from its /metrics info."""
    from inflight.metrics.doctor import Snapshot

    snap = Snapshot.parse(time.time(), httpx.get(url + "/metrics", timeout=30).text)
    return dict(next(iter(snap.labelled("inflight_config_info"))))


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
        outcomes, rows = asyncio.run(_watched(url, burst, {"cache_salt": "burst"}))
        burst_rows[:] = rows
        served.update(_served_knobs(url))
        capacity = saturated_rate(outcomes)
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

    burst_rows: list[list[float]] = []
    served: dict[str, str] = {}
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
    }, ttft, tpot, burst_rows, served) if args.simulate else {}  # fmt: skip
    for run in runs:
        if run["run"] in predicted:
            run["simulated"] = predicted[run["run"]]
    fitted = {k: predicted[k] for k in ("line_ms", "steps") if k in predicted}
    rate = len(workload) / args.duration
    report = {"model": str(model or "default"), "workload": args.workload,
              "targets": {"ttft_s": ttft, "tpot_s": tpot}, "capacity_req_s": round(capacity, 4),
              "load": args.load, "offered_req_s": round(rate, 4), "duration_s": args.duration,
              "knobs": {k: str(v) for k, v in plain.items()}, "runs": runs,
              "step_line": fitted,
              "goodput_ratio": round(runs[1]["goodput_req_s"]
                                     / max(runs[0]["goodput_req_s"], 1e-9), 2)}  # fmt: skip
    write_mode_report(out, "slo", report, summary, plot)
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
    fit = report.get("step_line")
    if fit:
        base, per_token, per_seq = fit["line_ms"]
        lines += ["", f"The simulator's step cost, fitted to the server's {fit['steps']} steps "
                  f"of the capacity burst: {base} ms + {per_token} ms a token + {per_seq} ms a "
                  "sequence."]  # fmt: skip
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
