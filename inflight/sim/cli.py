"""`inflight simulate run | plan | claims` (calibration is `inflight bench calibrate`)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from inflight.errors import InflightError
from inflight.routing import ROUTERS
from inflight.sim.hardware import LINKS, PROFILES, resolve_hardware, resolve_link
from inflight.sim.model_profile import KV_BYTES, PRESETS, WEIGHT_BYTES, load_model_profile
from inflight.sim.simulator import ENGINE_ONLY_KNOBS
from inflight.workload.flags import DefaultsHelpFormatter, add_workload_flags
from inflight.workload.requests import WordTokenizer, load_jsonl, named

logger = logging.getLogger("inflight.sim")


def _add_target_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--hardware", default="h100-sxm",
                   help=f"{', '.join(PROFILES)}, local-cpu (measured now) or a profile JSON "
                   "from `inflight bench calibrate`")  # fmt: skip
    p.add_argument("--model", dest="model_spec", default=None,
                   help=f"preset ({', '.join(PRESETS)}), HF config.json, model folder or GGUF "
                   "(default: the engine's default model)")  # fmt: skip
    p.add_argument("--weights", choices=list(WEIGHT_BYTES), default="bf16")
    p.add_argument("--kv-dtype", choices=list(KV_BYTES), default="bf16")
    p.add_argument("--replicas", type=int, default=1)
    p.add_argument("--tensor-parallel-size", type=int, default=1,
                   help="devices each replica's model is split over")  # fmt: skip
    p.add_argument("--link", choices=list(LINKS), default=None,
                   help="what joins a replica's tensor-parallel ranks (default: nvlink4 "
                   "between GPUs, eth25 between CPU nodes)")  # fmt: skip
    p.add_argument("--router", choices=ROUTERS, default="least-loaded",
                   help="how a fleet of replicas shares arrivals (inflight.routing)")  # fmt: skip
    p.add_argument("--memory-utilization", type=float, default=0.9,
                   help="share of GPU memory for weights + activations + KV")  # fmt: skip
    for name in ("weight_bw_efficiency", "kv_bw_efficiency", "compute_efficiency"):
        p.add_argument("--" + name.replace("_", "-"), type=float, default=None,
                       help="override the profile's (1.0 = roofline)")  # fmt: skip
    p.add_argument("--step-overhead-ms", type=float, default=None,
                   help="host time per step (default: the profile's)")  # fmt: skip


def add_simulate_parser(
    sub: Any,
    add_engine_flags: Callable[[argparse.ArgumentParser], None],
    add_knob_flags: Callable[..., None],
) -> None:
    sim = sub.add_parser("simulate", help="the real scheduler on a cost model of GPUs or this CPU")
    modes = sim.add_subparsers(dest="simulate_command", required=True)
    fmt = DefaultsHelpFormatter
    run = modes.add_parser("run", formatter_class=fmt, help="simulate one workload")
    run.add_argument("--compare", action="store_true", help="continuous and static batching")
    plan = modes.add_parser("plan", formatter_class=fmt,
                            help="cheapest replicas/max_num_seqs/max_num_batched_tokens meeting "
                            "a P99 target at a request rate")  # fmt: skip
    plan.add_argument(
        "--duration", type=float, default=300.0,
        help="seconds of Poisson traffic at --rate (unless --num-requests)",
    )  # fmt: skip
    plan.add_argument("--slo-ttft-p99", type=float, default=None, help="seconds")
    plan.add_argument("--slo-tpot-p99", type=float, default=None, help="seconds")
    plan.add_argument("--max-replicas", type=int, default=8)
    plan.add_argument("--seqs-grid", default="16,32,64,128,256")
    plan.add_argument("--tokens-grid", default="2048,8192")
    for p in (run, plan):
        _add_target_flags(p)
        add_workload_flags(p)
        add_knob_flags(p, skip=ENGINE_ONLY_KNOBS)
    claims = modes.add_parser("claims", help="check the seeds' claims; writes claims.md")
    claims.add_argument("--out", type=Path, default=None)


def run_simulate(args: argparse.Namespace, knobs: dict[str, Any]) -> int:
    out = args.out or Path("results") / (
        f"simulate-{args.simulate_command}-{time.strftime('%Y%m%d-%H%M%S')}"
    )
    try:
        if args.simulate_command == "claims":
            from inflight.sim.claims import run_claims

            text, figures = run_claims()
            out.mkdir(parents=True, exist_ok=True)
            (out / "claims.md").write_text(text)
            (out / "claims.json").write_text(json.dumps(figures, indent=2) + "\n")
            print(text)
        else:
            knobs = {k: v for k, v in knobs.items() if k not in ENGINE_ONLY_KNOBS}
            hardware = resolve_hardware(args.hardware).with_overrides(
                weight_bw_efficiency=args.weight_bw_efficiency,
                kv_bw_efficiency=args.kv_bw_efficiency,
                compute_efficiency=args.compute_efficiency,
                step_overhead_s=None if args.step_overhead_ms is None
                else args.step_overhead_ms / 1e3,
            )  # fmt: skip
            model = load_model_profile(args.model_spec, args.weights, args.kv_dtype,
                                       args.tensor_parallel_size)  # fmt: skip
            args.link = resolve_link(args.link or ("eth25" if hardware.is_cpu else "nvlink4"))
            if args.simulate_command == "plan":
                _plan(args, hardware, model, knobs, out)
            else:
                _run(args, hardware, model, knobs, out)
    except (InflightError, ValueError) as e:
        logger.error("%s", e)
        return 2
    logger.info("results in %s", out)
    return 0


def _workload(args: argparse.Namespace, num_requests: int | None = None):
    tokenizer = WordTokenizer()  # token counts are all a simulation needs
    if args.workload.endswith(".jsonl"):
        return load_jsonl(Path(args.workload), tokenizer)
    return named(args.workload, tokenizer, args.workload_seed,
                 num_requests or args.num_requests, args.arrival, args.rate)  # fmt: skip


def _run(args, hardware, model, knobs, out: Path) -> None:
    from inflight.sim.simulator import build_setup, simulate
    from inflight.workload.report import write_report

    workload = _workload(args)
    modes = ["continuous", "static"] if args.compare else [knobs.get("batching", "continuous")]
    runs, meta = [], {}
    for mode in modes:
        setup = build_setup(hardware, model, {**knobs, "batching": mode}, args.replicas,
                            args.memory_utilization, link=args.link)  # fmt: skip
        runs.append(simulate(setup, workload, f"simulated-{mode}", progress=True,
                             router=args.router))  # fmt: skip
        meta = setup.describe() | {
            "workload": args.workload, "requests": len(workload), "arrival": args.arrival,
            "hardware source": hardware.source,
            **({"link source": args.link.source} if model.tensor_parallel > 1 else {}),
        }  # fmt: skip
    write_report(out, f"inflight simulate: {args.workload} on {hardware.name}", runs, meta)
    print((out / "summary.md").read_text())


def _plan(args, hardware, model, knobs, out: Path) -> None:
    from tqdm.auto import tqdm

    from inflight.sim.planner import plan

    if args.arrival == "all":
        args.arrival = "poisson"  # a rate means arrivals spread in time
    workload = _workload(args, args.num_requests or max(1, round(args.rate * args.duration)))
    seqs = tuple(int(x) for x in args.seqs_grid.split(","))
    tokens = tuple(int(x) for x in args.tokens_grid.split(","))
    with tqdm(total=len(seqs) * len(tokens) * args.max_replicas, desc="plan") as bar:
        result = plan(hardware, model, knobs, workload, args.slo_ttft_p99, args.slo_tpot_p99,
                      args.max_replicas, seqs, tokens, args.memory_utilization, bar,
                      args.link)  # fmt: skip
    out.mkdir(parents=True, exist_ok=True)
    (out / "plan.json").write_text(json.dumps(dataclasses.asdict(result), indent=2) + "\n")
    lines = [f"# Plan: {model.name} ({model.weight_dtype}) on {hardware.name}, "
             f"{args.rate} req/s of `{args.workload}`", "",
             f"Targets: P99 TTFT <= {args.slo_ttft_p99} s, P99 TPOT <= {args.slo_tpot_p99} s", "",
             "| replicas | max_num_seqs | max_num_batched_tokens | TTFT p99 s | TPOT p99 s "
             "| output tok/s | meets |", "|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in result.rows:
        if "error" in r:
            lines.append(f"| {r['replicas']} | {r['max_num_seqs']} | "
                         f"{r['max_num_batched_tokens']} | {r['error']} | | | no |")  # fmt: skip
            continue
        lines.append(
            f"| {r['replicas']} | {r['max_num_seqs']} | {r['max_num_batched_tokens']} "
            f"| {r['ttft_p99_s']:.3f} | {r['tpot_p99_s'] or 0:.4f} | {r['output_tok_per_s']:.0f} "
            f"| {'yes' if r['meets'] else 'no'} |"
        )
    best = result.best
    lines += ["", "**Cheapest:** " + (
        f"{best['replicas']} replica(s), max_num_seqs {best['max_num_seqs']}, "
        f"max_num_batched_tokens {best['max_num_batched_tokens']}" if best
        else f"none within {args.max_replicas} replicas")]  # fmt: skip
    (out / "plan.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
