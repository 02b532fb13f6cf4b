"""`inflight bench fairness`: one tenant's flood against another's steady stream, offline.

Two tenants share an engine of equal weights: `steady` sends `--steady-rate` requests a second,
`flood` `--flood-factor` times as many, both Poisson (seeded), for `--duration` seconds, past
what the engine serves. Three runs on one loaded model: the steady stream alone, then both
under `fcfs`, then both under `fair`; each request's TTFT comes from the engine's own clock
(arrival to first token). With `--slo ttft=S,tpot=S`, each tenant's goodput too (its requests
within both targets, per second). Results: fairness.json, summary.md and a plot of the steady
tenant's TTFT percentiles per run.
"""

from __future__ import annotations

import logging
import random
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from inflight import LLM, SamplingParams
from inflight.bench.slo import parse_targets
from inflight.model.loader import LoadedModel
from inflight.workload.report import write_mode_report

logger = logging.getLogger("inflight.bench")

PROMPT = "Write a few sentences about the history of {topic}."
TOPICS = ("bridges", "maps", "tea", "clocks", "ships", "paper", "glass", "salt", "bells", "wool")


@dataclass(frozen=True)
class Arrival:
    t: float
    tenant: str
    prompt: str


def arrivals(steady_rate: float, flood_factor: float, duration: float, seed: int,
             with_flood: bool) -> list[Arrival]:  # fmt: skip
    """Poisson arrivals of both tenants (the steady one's the same with or without the
    flood: its own generator)."""
    out = []
    for tenant, rate, salt in (
        ("steady", steady_rate, 0),
        ("flood", steady_rate * flood_factor, 1),
    ):
        if tenant == "flood" and not with_flood:
            continue
        rng, t, i = random.Random(seed * 2 + salt), 0.0, 0
        while True:
            t += rng.expovariate(rate)
            if t >= duration:
                break
            out.append(Arrival(t, tenant, PROMPT.format(topic=TOPICS[i % len(TOPICS)]) + f" #{i}"))
            i += 1
    return sorted(out, key=lambda a: a.t)


def run_one(llm: LLM, plan: list[Arrival], max_tokens: int,
            targets: tuple[float, float] | None = None) -> dict[str, Any]:  # fmt: skip
    """Feeds the arrivals in real time to the engine; TTFTs per tenant, and with `targets`
    (TTFT, TPOT) each tenant's goodput."""
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    tenant_of, ttft = {}, {"steady": [], "flood": []}
    met = {"steady": 0, "flood": 0}
    pending, start, tokens = list(plan), time.monotonic(), 0
    while pending or llm.core.has_unfinished_requests():
        now = time.monotonic() - start
        while pending and pending[0].t <= now:
            a = pending.pop(0)
            tenant_of[llm.add_request(a.prompt, params, tenant=a.tenant)] = a.tenant
        if not llm.core.has_unfinished_requests():
            time.sleep(max(0.0, pending[0].t - now))
            continue
        for out in llm.step():
            if out.finished and out.metrics.ttft is not None:
                tenant, m, n = tenant_of[out.request_id], out.metrics, len(out.outputs[0].token_ids)
                ttft[tenant].append(m.ttft)
                tokens += n
                tpot = (m.e2e_latency - m.ttft) / (n - 1) if m.e2e_latency and n > 1 else None
                if targets and m.ttft <= targets[0] and (tpot is None or tpot <= targets[1]):
                    met[tenant] += 1
    elapsed = time.monotonic() - start
    result = {"policy": llm.config.scheduler.scheduling_policy, "elapsed_s": round(elapsed, 2),
              "output_tok_s": round(tokens / elapsed, 2),
              "ttft": {t: _percentiles(v) for t, v in ttft.items() if v}}  # fmt: skip
    if targets:
        result["goodput_req_s"] = {t: round(met[t] / elapsed, 3) for t, v in ttft.items() if v}
    return result


def _percentiles(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)

    def at(q: float) -> float:
        return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 3)

    return {"n": len(ordered), "p50": at(0.5), "p90": at(0.9), "p99": at(0.99),
            "mean": round(statistics.fmean(ordered), 3)}  # fmt: skip


def run_fairness(args: Any, knobs: dict[str, Any], out: Path) -> dict[str, Any]:
    """The three runs (the module docstring says which), each engine reusing the first's
    weights."""
    knobs = {k: v for k, v in knobs.items() if k != "scheduling_policy"}
    targets = parse_targets(args.slo) if args.slo else None
    loaded: LoadedModel | None = None
    runs = []
    for name, policy, with_flood in (("steady alone", "fcfs", False), ("both, fcfs", "fcfs", True),
                                     ("both, fair", "fair", True)):  # fmt: skip
        plan = arrivals(
            args.steady_rate, args.flood_factor, args.duration, args.arrival_seed, with_flood
        )
        logger.info("%s: %d requests over %.0f s", name, len(plan), args.duration)
        llm = LLM(loaded_model=loaded, scheduling_policy=policy, **knobs)
        loaded = llm.core.loaded
        result = run_one(llm, plan, args.max_tokens, targets)
        runs.append({"run": name, **result})
        logger.info("%s: steady TTFT %s", name, result["ttft"]["steady"])
    alone = runs[0]["ttft"]["steady"]["p99"]
    assert loaded is not None
    report = {"model": str(loaded.path), "steady_rate": args.steady_rate,
              "flood_factor": args.flood_factor, "duration_s": args.duration,
              "max_tokens": args.max_tokens, "knobs": {k: str(v) for k, v in knobs.items()},
              "runs": runs,
              "steady_p99_vs_alone": {r["run"]: round(r["ttft"]["steady"]["p99"] / alone, 2)
                                      for r in runs}}  # fmt: skip
    write_mode_report(out, "fairness", report, summary, plot)
    return report


def summary(report: dict[str, Any]) -> str:
    lines = [
        f"Steady tenant {report['steady_rate']} req/s, flood {report['flood_factor']}x that, "
        f"{report['duration_s']} s of arrivals, {report['max_tokens']} tokens each.", "",
        "| run | steady TTFT p50 | p99 | p99 / alone | flood TTFT p99 | output tok/s |",
        "|---|---|---|---|---|---|",
    ]  # fmt: skip
    for r in report["runs"]:
        steady, flood = r["ttft"]["steady"], r["ttft"].get("flood")
        lines.append(
            f"| {r['run']} | {steady['p50']} s | {steady['p99']} s | "
            f"{report['steady_p99_vs_alone'][r['run']]}x | "
            f"{flood['p99'] if flood else '-'} s | {r['output_tok_s']} |"
        )
    if any("goodput_req_s" in r for r in report["runs"]):
        lines += ["", "Goodput per tenant (requests within both targets per second):", "",
                  "| run | steady | flood |", "|---|---|---|"]  # fmt: skip
        for r in report["runs"]:
            g = r.get("goodput_req_s", {})
            lines.append(f"| {r['run']} | {g.get('steady', '-')} | {g.get('flood', '-')} |")
    return "\n".join(lines) + "\n"


def plot(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.6))
    names = [r["run"] for r in report["runs"]]
    for i, q in enumerate(("p50", "p90", "p99")):
        values = [r["ttft"]["steady"][q] for r in report["runs"]]
        ax.bar([x + (i - 1) * 0.27 for x in range(len(names))], values, width=0.27, label=q)
    ax.set_xticks(range(len(names)), names)
    ax.set_ylabel("steady tenant's TTFT (s)")
    ax.set_title(f"A {report['flood_factor']:g}x flood beside a steady tenant")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
