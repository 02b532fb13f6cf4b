"""`inflight bench fleet`: this machine's cores as one engine or as replicas, by router.

Each configuration starts a real server (`inflight serve`, with `--replicas` on Ray Serve), is
loaded with each workload at a Poisson rate through the streaming completions API, and its
engines' own prefix-cache counters are read from `/metrics`. The simulator then predicts the same
runs: a fleet on one machine is simulated as replicas of the given hardware profile (a profile
written by `inflight bench calibrate` on this machine, or `local-cpu`) with its bandwidth and
compute divided among the replicas, and the same routing policy.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from inflight.bench.serve import run_rate
from inflight.bench.server_peers import free_port, start_server, stop_server
from inflight.metrics.doctor import Snapshot
from inflight.workload.requests import named
from inflight.workload.results import summarize

# (label, replicas, router): one engine with every core, then two replicas with half each
CONFIGS = [
    ("1 engine", 1, "least-loaded"),
    ("2 replicas, round-robin", 2, "round-robin"),
    ("2 replicas, prefix-aware", 2, "prefix-aware"),
]


def _prefix_counters(url: str) -> tuple[float, float]:
    """(hits, queries) in prompt tokens, summed over every engine behind `url`."""
    snap = Snapshot.parse(time.time(), httpx.get(url + "/metrics", timeout=30).text)
    hits = sum(snap.labelled("inflight_prefix_cache_hits_total").values())
    return hits, sum(snap.labelled("inflight_prefix_cache_queries_total").values())


def _start_server(replicas: int, router: str, serve_args: list[str]) -> tuple[Any, str]:
    port = free_port()
    cmd = [sys.executable, "-m", "inflight", "serve", "--port", str(port),
           "--replicas", str(replicas), "--router", router, *serve_args]  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    proc = start_server(cmd, url, lambda r: replicas == 1 or r.json()["replicas_up"] == replicas,
                        timeout_s=300)  # fmt: skip
    return proc, url


def measure(args: argparse.Namespace, tokenizer: Any, model: str) -> list[dict]:
    rows = []
    for label, replicas, router in CONFIGS:
        proc, url = _start_server(replicas, router, args.serve_args.split())
        try:
            for workload_name in args.workloads.split(","):
                workload = named(workload_name, tokenizer, args.workload_seed,
                                 args.num_requests, "poisson", args.rate)  # fmt: skip
                hits0, queries0 = _prefix_counters(url)
                run = asyncio.run(run_rate(url, model, workload, f"{label}: {workload_name}",
                                           None, args.goodput_ttft, args.goodput_tpot))  # fmt: skip
                time.sleep(2.5)  # engines report their counters once a second
                hits1, queries1 = _prefix_counters(url)
                s = summarize(run)
                rows.append({
                    "config": label, "replicas": replicas, "router": router,
                    "workload": workload_name, "output_tok_per_s": s.get("output_tok_per_s"),
                    "ttft_p50_s": s.get("ttft_s", {}).get("p50"),
                    "ttft_p99_s": s.get("ttft_s", {}).get("p99"),
                    "tpot_p50_s": s.get("tpot_s", {}).get("p50"),
                    "errors": run.extra["errors"],
                    "prefix_hit_rate": round((hits1 - hits0) / max(1.0, queries1 - queries0), 3),
                })  # fmt: skip
        finally:
            stop_server(proc)
    return rows


def predict(args: argparse.Namespace, knobs: dict[str, Any]) -> list[dict]:
    """The simulator's view of the same runs (token counts from a word tokenizer)."""
    from inflight.sim.hardware import resolve_hardware
    from inflight.sim.model_profile import load_model_profile
    from inflight.sim.simulator import build_setup, simulate
    from inflight.workload.requests import WordTokenizer

    hardware = resolve_hardware(args.hardware)
    dtype = args.sim_dtype
    model = load_model_profile(None, dtype, dtype)
    rows = []
    for label, replicas, router in CONFIGS:
        share = hardware.with_overrides(
            memory_bw=hardware.memory_bw / replicas,
            flops={k: v / replicas for k, v in hardware.flops.items()},
        )  # a replica's share of the one machine
        for workload_name in args.workloads.split(","):
            workload = named(workload_name, WordTokenizer(), args.workload_seed,
                             args.num_requests, "poisson", args.rate)  # fmt: skip
            setup = build_setup(share, model, knobs, replicas)
            run = simulate(setup, workload, label, router=router)
            s = summarize(run)
            rows.append({
                "config": label, "workload": workload_name,
                "output_tok_per_s": s.get("output_tok_per_s"),
                "ttft_p50_s": s.get("ttft_s", {}).get("p50"),
                "prefix_hit_rate": run.extra["prefix_cache_hit_rate"],
            })  # fmt: skip
    return rows


def write_fleet_report(out: Path, measured: list[dict], predicted: list[dict],
                       meta: dict) -> str:  # fmt: skip
    out.mkdir(parents=True, exist_ok=True)
    (out / "fleet.json").write_text(
        json.dumps({"meta": meta, "measured": measured, "predicted": predicted}, indent=2) + "\n"
    )
    sim = {(r["config"], r["workload"]): r for r in predicted}
    lines = [f"# inflight bench fleet: {', '.join(sorted({r['workload'] for r in measured}))}",
             "", *[f"- {k}: {v}" for k, v in meta.items()], "",
             "| workload | config | output tok/s (sim) | TTFT p50 s (sim) | TPOT p50 s "
             "| prefix hits (sim) | errors |", "|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in measured:
        p = sim.get((r["config"], r["workload"]), {})
        lines.append(
            f"| {r['workload']} | {r['config']} | {r['output_tok_per_s']} "
            f"({p.get('output_tok_per_s', '-')}) | {_f(r['ttft_p50_s'])} "
            f"({_f(p.get('ttft_p50_s'))}) | {_f(r['tpot_p50_s'])} "
            f"| {r['prefix_hit_rate']:.1%} ({p.get('prefix_hit_rate', 0):.1%}) | {r['errors']} |"
        )
    text = "\n".join(lines) + "\n"
    (out / "fleet.md").write_text(text)
    _plot(out / "fleet.png", measured, predicted)
    return text


def _f(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def _plot(path: Path, measured: list[dict], predicted: list[dict]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    workloads = list(dict.fromkeys(r["workload"] for r in measured))
    configs = [c for c, _, _ in CONFIGS]
    fig, axes = plt.subplots(1, 3, figsize=(14, 4.2))
    keys = (("output_tok_per_s", "output tokens/s"), ("ttft_p50_s", "TTFT p50 (s)"),
            ("prefix_hit_rate", "prefix-cache hit rate"))  # fmt: skip
    width = 0.8 / len(configs)
    for ax, (key, title) in zip(axes, keys, strict=True):
        for i, config in enumerate(configs):

            def value(rows: list[dict], w: str, c: str = config, k: str = key) -> float:
                row = next((r for r in rows if r["config"] == c and r["workload"] == w), {})
                return row.get(k) or 0.0

            x = np.arange(len(workloads)) + i * width
            ax.bar(x, [value(measured, w) for w in workloads], width, label=config)
            ax.scatter(x, [value(predicted, w) for w in workloads], color="black", marker="_",
                       s=200, zorder=3, label="simulated" if i == 0 else None)  # fmt: skip
        ax.set_xticks(np.arange(len(workloads)) + width * (len(configs) - 1) / 2, workloads)
        ax.set_title(title)
    axes[0].legend(fontsize=8)
    fig.suptitle("One engine vs two replicas on the same cores (bars: measured; dashes: "
                 "simulated)")  # fmt: skip
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def run_fleet(args: argparse.Namespace, knobs: dict[str, Any], out: Path) -> str:
    import torch

    from inflight.model.loader import resolve_model_path
    from inflight.platform import describe_device
    from inflight.tokenizer import load_tokenizer

    path = resolve_model_path(None)
    tokenizer = load_tokenizer(path)
    measured = measure(args, tokenizer, path.stem)
    predicted = predict(args, {k: v for k, v in knobs.items()
                               if k not in ("model", "dtype", "device", "seed")})  # fmt: skip
    meta = {"device": describe_device(torch.device("cpu")), "rate": f"{args.rate}/s (Poisson)",
            "requests": args.num_requests or "as named", "hardware (sim)": args.hardware,
            "serve args": args.serve_args or "-"}  # fmt: skip
    return write_fleet_report(out, measured, predicted, meta)


def add_fleet_parser(modes: Any, fmt: Any) -> argparse.ArgumentParser:
    fleet = modes.add_parser("fleet", formatter_class=fmt,
                             help="one engine vs replicas (round-robin, prefix-aware) on this "
                                  "machine, measured and simulated")  # fmt: skip
    fleet.add_argument("--workloads", default="shared_prefix,prefix_groups,chat")
    fleet.add_argument("--rate", type=float, default=2.0, help="Poisson requests/s")
    fleet.add_argument("--num-requests", type=int, default=64)
    fleet.add_argument("--workload-seed", type=int, default=0)
    # goodput's targets (the engine's own --slo-ttft / --slo-tpot would refuse requests)
    fleet.add_argument("--goodput-ttft", type=float, default=1.0, help="TTFT target, s")
    fleet.add_argument("--goodput-tpot", type=float, default=0.2, help="TPOT target, s")
    fleet.add_argument("--serve-args", default="", help="extra flags for `inflight serve`")
    fleet.add_argument("--hardware", default="local-cpu",
                       help="the simulator's profile of this machine (local-cpu, or the JSON "
                            "from `inflight bench calibrate`)")  # fmt: skip
    fleet.add_argument(
        "--sim-dtype",
        default="fp32",
        choices=("fp32", "bf16"),
        help="the engine's dtype on this CPU (fp32 without AVX-512 BF16)",
    )
    fleet.add_argument("--out", type=Path, default=None)
    return fleet
