"""`inflight bench offline | compare | serve`: run a workload, write a results folder."""

from __future__ import annotations

import argparse
import gc
import json
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from inflight.bench import peers as peer_runs
from inflight.bench.offline import reset_peak_rss, run_offline
from inflight.bench.structured import (
    compare,
    is_constrained,
    order_constraint,
    write_structured_report,
)
from inflight.config import ModelConfig, SchedulerConfig
from inflight.errors import ConfigError, InflightError
from inflight.metrics.profiling import OVERHEAD_PHASES, breakdown
from inflight.model.loader import is_gguf, resolve_quantized_activations
from inflight.platform import describe_device, resolve_device, resolve_dtype
from inflight.sampling_params import StructuredOutputs
from inflight.workload.flags import add_workload_flags
from inflight.workload.requests import NAMED, WorkloadRequest, load_jsonl, named
from inflight.workload.results import RunResult

logger = logging.getLogger("inflight.bench")


# inflight's own runs in `bench compare`, as knob overrides. Padded rows' pad tokens are real
# tokens to the engine: the prefix cache would share the padding block after block, where
# `generate` computes it for every row, so that run goes without the cache.
COMPARE_MODES = {
    "continuous": {"batching": "continuous"},
    "static": {"batching": "static"},
    "static-padded": {"batching": "static", "enable_prefix_caching": False},
    # speculation on top of continuous batching, n-gram or `--speculative-model`'s (the other
    # modes keep the knobs' number of draft tokens)
    "speculative": {"batching": "continuous", "num_speculative_tokens": 4},
    # activations in float32 or rounded to 16 or 8 bits (each a model of its own: loaded again)
    "exact": {"batching": "continuous", "quantized_activations": "off"},
    "int16": {"batching": "continuous", "quantized_activations": "int16"},
    "int8": {"batching": "continuous", "quantized_activations": "int8"},
    # float32 where the default is bf16 (an AVX-512 BF16 CPU): there the GGUF's blocks and
    # 16-bit activations apply, as on an AVX2 CPU
    "float32": {"batching": "continuous", "dtype": "float32"},
    # the KV cache in another dtype than the model's (the same model, a pool of other blocks)
    "kv-bf16": {"batching": "continuous", "kv_cache_dtype": "bf16"},
    "kv-int8": {"batching": "continuous", "kv_cache_dtype": "int8"},
    "kv-fp8": {"batching": "continuous", "kv_cache_dtype": "fp8"},
}


CONSTRAINED = "+json"  # the suffix of a mode's run with constrained requests


def positive(text: str) -> float:
    """A finite number > 0, for rates and durations (a flag value, so argparse reports it)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text}")
    return value


def load_workload(args: argparse.Namespace, tokenizer) -> list[WorkloadRequest]:
    if args.workload.endswith(".jsonl"):
        return load_jsonl(Path(args.workload), tokenizer)
    return named(args.workload, tokenizer, args.workload_seed, args.num_requests, args.arrival,
                 args.rate)  # fmt: skip


def add_bench_parser(sub: Any, add_engine_flags: Callable[[argparse.ArgumentParser], None]) -> None:
    bench = sub.add_parser(
        "bench",
        help="benchmarks: offline, compare, roofline, serve, soak, slowloris, fairness, fleet, "
        "calibrate, agreement, memory, slo",
    )
    modes = bench.add_subparsers(dest="bench_command", required=True)
    fmt = argparse.ArgumentDefaultsHelpFormatter
    offline = modes.add_parser("offline", help="one workload through the engine",
                               formatter_class=fmt)  # fmt: skip
    compare = modes.add_parser(
        "compare", formatter_class=fmt, help="continuous vs static batching, and peers, in one run"
    )
    roofline = modes.add_parser(
        "roofline", formatter_class=fmt,
        help="the engine against this machine's measured roofline for the workload",
    )  # fmt: skip
    for p in (offline, compare, roofline):
        add_workload_flags(p)
        add_engine_flags(p)
    from inflight.bench.fleet import add_fleet_parser

    add_engine_flags(add_fleet_parser(modes, fmt))
    calibrate = modes.add_parser("calibrate", formatter_class=fmt,
                                 help="fit the simulator's cost model of this CPU to engine runs, "
                                 "and check it on another workload")  # fmt: skip
    calibrate.add_argument("--fit-workload", choices=list(NAMED), default="mixed64")
    calibrate.add_argument("--check-workload", choices=list(NAMED), default="longtail")
    calibrate.add_argument("--num-requests", type=int, default=None,
                           help="override both workloads' request counts")  # fmt: skip
    calibrate.add_argument("--out", type=Path, default=None)
    add_engine_flags(calibrate)
    agreement = modes.add_parser("agreement", formatter_class=fmt,
                                 help="greedy tokens with quantized activations (or KV "
                                 "cache dtypes) against the exact path, on the parity "
                                 "prompts")  # fmt: skip
    agreement.add_argument("--max-tokens", type=int, default=64, help="greedy tokens per prompt")
    agreement.add_argument("--reference-dtype", choices=["float32", "bfloat16"], default=None,
                           help="compare against the exact path in this dtype (and the engine's "
                           "own exact path too); default: the engine's dtype")  # fmt: skip
    agreement.add_argument("--kv-cache-dtypes", default="",
                           help="compare these KV cache dtypes (comma-separated: bf16, fp8, "
                           "int8) with the model's own instead of the quantized "
                           "activations")  # fmt: skip
    agreement.add_argument("--out", type=Path, default=None)
    add_engine_flags(agreement)
    offline.add_argument(
        "--profile", action="store_true",
        help="time every phase of every step; writes profile.md (overhead vs forward)",
    )  # fmt: skip
    offline.add_argument(
        "--constrained-fraction", type=float, default=0.0,
        help="also run the workload with this share of its requests constrained to a JSON "
        "schema; writes structured.md (step time with and without)",
    )  # fmt: skip
    compare.add_argument(
        "--modes", default="continuous,static,static-padded",
        help="inflight's own runs: continuous, static (a batch admits nobody until its last "
        "member ends), static-padded (static, and every member decodes until the batch's "
        "longest is done, as transformers `generate` does), speculative (continuous with "
        "4 n-gram draft tokens), and exact, int16 and int8 (continuous with "
        "quantized_activations off, int16 and int8), float32 (continuous in float32), "
        "kv-bf16, kv-int8 and kv-fp8 (continuous with that kv_cache_dtype)",
    )  # fmt: skip
    compare.add_argument(
        "--repeats", type=int, default=1,
        help="rounds: every mode and peer once per round (every other round in reverse "
        "order), runs named '#k'; the report gives each run's median and range and its ratio "
        "to the first run within each round",
    )  # fmt: skip
    compare.add_argument(
        "--peers",
        default="",
        help=f"comma-separated peers to run too: {', '.join(peer_runs.PEERS)}",
    )
    compare.add_argument(
        "--vllm-python", type=Path, default=None,
        help="python of a virtual environment with vLLM's CPU build (for --peers vllm)",
    )  # fmt: skip
    compare.add_argument(
        "--llama-server", type=Path, default=None,
        help="llama.cpp's llama-server binary (for --peers llama-server: the same GGUF over "
        "HTTP with --parallel max_num_seqs slots; --peers inflight-serve measures inflight's "
        "server the same way)",
    )  # fmt: skip
    compare.add_argument(
        "--llamacpp-python", type=Path, default=None,
        help="python of a virtual environment with llama-cpp-python (for --peers llamacpp: "
        "single stream in inflight's dtype; llamacpp-gguf: the GGUF file as shipped)",
    )  # fmt: skip
    serve = modes.add_parser(
        "serve",
        formatter_class=fmt,
        help="load an OpenAI-compatible server at a sweep of request rates",
    )
    serve.add_argument("--url", required=True, help="server base URL, e.g. http://127.0.0.1:8000")
    serve.add_argument("--model", required=True, help="model id the server expects")
    serve.add_argument(
        "--tokenizer",
        default=None,
        help="model path whose tokenizer builds the prompts (default: ours)",
    )
    serve.add_argument(
        "--rates", default="1,2,4,8", help="request rates to sweep, requests/s (default: 1,2,4,8)"
    )
    serve.add_argument(
        "--slo-ttft", type=float, default=1.0, help="goodput SLO on TTFT, s (default: 1)"
    )
    serve.add_argument(
        "--slo-tpot", type=float, default=0.2, help="goodput SLO on TPOT, s (default: 0.2)"
    )
    serve.add_argument("--api-key", default=None)
    serve.add_argument(
        "--dashboards",
        type=int,
        default=0,
        help="also run each rate with this many dashboards open (their cost)",
    )
    serve.add_argument("--repeats", type=int, default=1, help="runs of each rate (default: 1)")
    add_workload_flags(serve)

    memory = modes.add_parser(
        "memory", formatter_class=fmt,
        help="peak memory of `inflight serve` (and `llama-server`) on one file: weights, KV "
        "pool, runtime, start-up time",
    )  # fmt: skip
    memory.add_argument("--llama-server", type=Path, default=None,
                        help="llama.cpp's llama-server binary, run on the same file")  # fmt: skip
    add_workload_flags(memory)
    add_engine_flags(memory)

    soak = modes.add_parser(
        "soak",
        formatter_class=fmt,
        help="a bounded overload run against `inflight serve`: outcomes, /health, RSS",
    )
    soak.add_argument(
        "--duration",
        type=positive,
        default=600.0,
        help="seconds of Poisson arrivals (default: 600)",
    )
    soak.add_argument(
        "--load",
        type=positive,
        default=2.0,
        help="arrival rate as a multiple of the measured saturation rate (default: 2)",
    )
    soak.add_argument(
        "--disconnect-fraction",
        type=float,
        default=0.1,
        help="share of clients that leave mid-stream (default: 0.1)",
    )
    soak.add_argument(
        "--max-queued-requests",
        type=int,
        default=64,
        help="the started server's queue bound (default: 64)",
    )
    soak.add_argument(
        "--request-timeout",
        type=positive,
        default=300.0,
        help="client timeout per request, s; past it the request is lost (default: 300)",
    )
    soak.add_argument("--url", default=None, help="soak a running server instead of starting one")
    soak.add_argument("--served-model-name", default=None, help="with --url: its model id")
    soak.add_argument(
        "--server-pid", type=int, default=None, help="with --url: the server's pid, for its RSS"
    )
    soak.add_argument("--workload", default="chat", help="named workload (default: chat)")
    soak.add_argument("--workload-seed", type=int, default=0, help="(default: 0)")
    soak.add_argument(
        "--out", type=Path, default=None, help="results folder (default: results/bench-soak-<time>)"
    )
    add_engine_flags(soak)  # fmt: skip

    fairness = modes.add_parser(
        "fairness", formatter_class=fmt,
        help="a tenant's flood beside another's steady stream: the steady one's TTFT alone, "
             "under fcfs and under fair",
    )  # fmt: skip
    fairness.add_argument("--steady-rate", type=positive, default=0.25,
                          help="the steady tenant's requests a second")  # fmt: skip
    fairness.add_argument("--flood-factor", type=positive, default=5.0,
                          help="the flood's rate, in multiples of the steady one's")  # fmt: skip
    fairness.add_argument("--duration", type=positive, default=40.0,
                          help="seconds of arrivals a run")  # fmt: skip
    fairness.add_argument("--max-tokens", type=int, default=48, help="tokens a request")
    fairness.add_argument("--arrival-seed", type=int, default=0, help="the arrivals' seed")
    fairness.add_argument("--slo", default=None,
                          help="ttft=SECONDS,tpot=SECONDS: each tenant's goodput too")  # fmt: skip
    fairness.add_argument("--out", type=Path, default=None,
                          help="results folder (default: results/bench-fairness-*)")  # fmt: skip
    add_engine_flags(fairness)
    slowloris = modes.add_parser(
        "slowloris", formatter_class=fmt,
        help="trickling clients against `inflight serve`: how long each is held, what it "
             "costs, and others' latency meanwhile",
    )  # fmt: skip
    slowloris.add_argument("--clients", type=int, default=200,
                           help="trickling connections (default: 200)")  # fmt: skip
    slowloris.add_argument("--interval", type=positive, default=1.0,
                           help="seconds between a client's bytes (default: 1)")  # fmt: skip
    slowloris.add_argument("--probes", type=int, default=5,
                           help="completions timed before and during (default: 5)")  # fmt: skip
    slowloris.add_argument("--url", default=None, help="a running server instead of starting one")
    slowloris.add_argument("--served-model-name", default=None, help="with --url: its model id")
    slowloris.add_argument("--server-pid", type=int, default=None,
                           help="with --url: the server's pid, for its RSS")  # fmt: skip
    slowloris.add_argument("--out", type=Path, default=None,
                           help="results folder (default: results/bench-slowloris-*)")  # fmt: skip
    add_engine_flags(slowloris)
    slo = modes.add_parser(
        "slo", formatter_class=fmt,
        help="goodput past saturation: FCFS against SLO-aware admission over HTTP, and the "
             "simulator's prediction of both",
    )  # fmt: skip
    slo.add_argument("--slo", default="ttft=1.5,tpot=0.15",
                     help="targets: ttft=SECONDS,tpot=SECONDS")  # fmt: skip
    slo.add_argument("--load", type=positive, default=1.5,
                     help="offered rate, in multiples of the measured capacity")  # fmt: skip
    slo.add_argument("--duration", type=positive, default=60.0, help="seconds of arrivals")
    slo.add_argument("--workload", default="chat", help="named workload")
    slo.add_argument("--workload-seed", type=int, default=0)
    slo.add_argument(
        "--burst-requests",
        type=int,
        default=128,
        help="requests of the burst that measures capacity (more than the seats)",
    )
    slo.add_argument("--policy", choices=("fcfs", "edf"), default="fcfs",
                     help="queue order of the run with SLO admission")  # fmt: skip
    slo.add_argument("--no-simulate", dest="simulate", action="store_false",
                     help="skip the simulator's prediction")  # fmt: skip
    slo.add_argument("--out", type=Path, default=None,
                     help="results folder (default: results/bench-slo-*)")  # fmt: skip
    add_engine_flags(slo)


def run_bench(args: argparse.Namespace, knobs: dict[str, Any]) -> int:
    out = (
        args.out or Path("results") / f"bench-{args.bench_command}-{time.strftime('%Y%m%d-%H%M%S')}"
    )
    if args.bench_command == "serve":
        from inflight.bench.serve import run_serve_sweep

        report = run_serve_sweep(args, out)
    elif args.bench_command == "soak":
        from inflight.bench.soak import ok, run_soak

        summary = run_soak(args, dict(knobs), out)["summary"]
        _show_summary(out)
        return 0 if ok(summary) else 1
    elif args.bench_command == "fairness":
        from inflight.bench.fairness import run_fairness

        run_fairness(args, dict(knobs), out)
        return _show_summary(out)
    elif args.bench_command == "slo":
        from inflight.bench.slo import run_slo_bench

        run_slo_bench(args, dict(knobs), out)
        return _show_summary(out)
    elif args.bench_command == "slowloris":
        from inflight.bench.edge import run_slowloris

        run_slowloris(args, dict(knobs), out)
        return _show_summary(out)
    elif args.bench_command == "fleet":
        from inflight.bench.fleet import run_fleet

        print(run_fleet(args, dict(knobs), out))
        logger.info("results in %s", out)
        return 0
    elif args.bench_command == "calibrate":
        from inflight.bench.calibrate import run_calibration

        print(run_calibration(knobs, args.fit_workload, args.check_workload, out,
                              args.num_requests))  # fmt: skip
        logger.info("results in %s", out)
        return 0
    elif args.bench_command == "memory":
        from inflight.bench.memory import run_memory
        from inflight.model.loader import resolve_model_path
        from inflight.tokenizer import load_tokenizer

        model = resolve_model_path(knobs.get("model"))
        workload = load_workload(args, load_tokenizer(model))
        knobs = {k: v for k, v in knobs.items() if k != "model"}
        runs = run_memory(model, workload, knobs, args.llama_server, out)
        _show_summary(out)
        return 0 if all(r.error is None for r in runs) else 1
    elif args.bench_command == "agreement":
        from inflight.bench.agreement import run_agreement

        kv_dtypes = tuple(k for k in args.kv_cache_dtypes.split(",") if k)
        print(run_agreement(knobs, out, args.max_tokens, args.reference_dtype, kv_dtypes))
        logger.info("results in %s", out)
        return 0
    elif args.bench_command == "roofline":
        from inflight.bench.roofline import run_roofline

        title = f"inflight bench roofline: {args.workload}"
        report = run_roofline(knobs, lambda tok: load_workload(args, tok), out, title)
    else:
        try:
            report = run_local(args, knobs, out)
        except InflightError as e:
            logger.error("%s", e)
            return 2
    _show_summary(out)
    return 0 if all("error" not in r for r in report["runs"]) else 1


def _show_summary(out: Path) -> int:
    """Where the results are, and their summary.md on stdout (exit code 0)."""
    logger.info("results in %s", out)
    print((out / "summary.md").read_text())
    return 0


def write_profile(out: Path, steps: list, max_num_seqs: int) -> None:
    """profile.json and profile.md: every phase's share of step time, over all steps and over
    the steps that ran a full batch of `max_num_seqs` sequences."""
    full = [s for s in steps if s.num_scheduled_seqs >= max_num_seqs]
    result = {"all_steps": breakdown(steps), "full_batch_steps": breakdown(full)}
    out.mkdir(parents=True, exist_ok=True)
    (out / "profile.json").write_text(json.dumps(result, indent=2) + "\n")
    lines = ["# Step profile", "", f"Overhead = {' + '.join(OVERHEAD_PHASES)} "
             "(everything but the forward pass).", ""]  # fmt: skip
    for key, label in (("all_steps", "all steps"),
                       ("full_batch_steps", f"steps with {max_num_seqs} sequences")):  # fmt: skip
        b = result[key]
        lines += [f"## {label} ({b['steps']}): overhead {b['overhead_share']:.1%}", "",
                  "| phase | seconds | share | ms/step |", "|---|---|---|---|"]  # fmt: skip
        lines += [f"| {name} | {p['seconds']} | {p['share']:.1%} | {p['ms_per_step']} |"
                  for name, p in b["phases"].items()]  # fmt: skip
        lines.append("")
    (out / "profile.md").write_text("\n".join(lines))
    print("\n".join(lines))


def run_local(args: argparse.Namespace, knobs: dict[str, Any], out: Path) -> dict:
    """Inflight in each mode on the same loaded weights, then the peers; the report is rewritten
    after every run, so a long comparison cut short still leaves its finished runs."""
    from inflight.engine.llm import LLM
    from inflight.workload.report import write_report  # matplotlib: only when reporting

    title = f"inflight bench {args.bench_command}: {args.workload}"
    modes = [knobs.get("batching", "continuous")]
    if args.bench_command == "compare":
        modes = [m for m in args.modes.split(",") if m]
        if not modes or not set(modes) <= set(COMPARE_MODES):
            raise ConfigError(
                f"--modes takes some of {', '.join(COMPARE_MODES)}, got {args.modes!r}"
            )
    fraction = getattr(args, "constrained_fraction", 0.0)
    if not 0.0 <= fraction <= 1.0:
        raise ConfigError(f"--constrained-fraction must be in [0, 1], got {fraction}")
    if fraction:
        modes = [modes[0], modes[0] + CONSTRAINED]
    repeats = getattr(args, "repeats", 1)
    if repeats < 1:
        raise ConfigError(f"--repeats must be at least 1, got {repeats}")
    peers = [p for p in getattr(args, "peers", "").split(",") if p]
    runs: list[RunResult] = []
    loaded = None
    for repeat in range(repeats):
        suffix = f" #{repeat + 1}" if repeats > 1 else ""
        # every other round in reverse: a shared machine's speed drifts within a sitting, and
        # a fixed order would hand the drift to the same mode every round
        reverse = repeat % 2 == 1
        for mode in modes[::-1] if reverse else modes:
            reset_peak_rss()  # each run's own peak (the first one's includes loading the model)
            base_mode = mode.removesuffix(CONSTRAINED)
            mode_knobs = {**knobs, **COMPARE_MODES.get(base_mode, {})}
            if not mode_knobs.get("num_speculative_tokens"):  # a draft model drafts only there
                mode_knobs.pop("speculative_model", None)
            if loaded is not None:
                wanted = resolve_dtype(
                    mode_knobs.get("dtype", ModelConfig.dtype),
                    resolve_device(mode_knobs.get("device", ModelConfig.device)),
                )
                activations = resolve_quantized_activations(
                    mode_knobs.get("quantized_activations", ModelConfig.quantized_activations),
                    wanted,
                    mode_knobs.get("max_num_seqs", SchedulerConfig.max_num_seqs),
                )
                if loaded.mismatch(wanted, activations):
                    loaded = None  # weights in another dtype, or packed for other activations
            llm = LLM(loaded_model=loaded, **mode_knobs)
            loaded = llm.core.loaded
            workload = load_workload(args, llm.tokenizer)
            dtype = str(llm.core.dtype).removeprefix("torch.")
            if mode == modes[0]:  # peers compute in the first mode's dtype (the default's)
                peer_dtype = dtype
            device = llm.core.device.type
            timer = llm.core.enable_profiling() if getattr(args, "profile", False) else None
            with_json = mode != base_mode

            def constraint(i: int, with_json: bool = with_json) -> StructuredOutputs | None:
                return order_constraint() if with_json and is_constrained(i, fraction) else None

            padded = mode == "static-padded"
            runs.append(run_offline(llm, workload, f"inflight-{mode}{suffix}", padded=padded,
                                    constrained=constraint))  # fmt: skip
            if timer is not None:
                write_profile(out, timer.steps, llm.config.scheduler.max_num_seqs)
            meta = {
                "model": str(loaded.path), "dtype": peer_dtype, "workload": args.workload,
                "device": describe_device(llm.core.device),
                "requests": len(workload), "arrival": args.arrival,
                "max_num_seqs": llm.config.scheduler.max_num_seqs,
                "max_num_batched_tokens": llm.config.scheduler.max_num_batched_tokens,
            }  # fmt: skip
            report = write_report(out, title, runs, meta)
            if with_json:
                result = compare(runs[-2], runs[-1], meta["max_num_seqs"],
                                 llm.input_processor.grammars.stats)  # fmt: skip
                print(write_structured_report(out, result, runs[-2], runs[-1], fraction,
                                              meta["device"]))  # fmt: skip
            del llm
            gc.collect()
        for peer in peers[::-1] if reverse else peers:
            try:
                result = run_peer(args, peer, loaded.path, workload, peer_dtype, device, knobs,
                                  meta["max_num_seqs"])  # fmt: skip
            except Exception as e:  # a peer failing must not lose the other results
                logger.exception("peer %s failed", peer)
                result = RunResult(peer, 0.0, [], error=f"{type(e).__name__}: {e}")
            result.name += suffix
            runs.append(result)
            report = write_report(out, title, runs, meta)
            gc.collect()
    return report


def run_peer(args: argparse.Namespace, peer: str, model: Path, workload: list, dtype: str,
             device: str, knobs: dict[str, Any], max_num_seqs: int) -> RunResult:  # fmt: skip
    """One run of a peer engine on the workload inflight just ran."""
    if peer == "hf-static":
        return peer_runs.run_hf_static(model, workload, dtype, max_num_seqs, device)
    if peer == "hf-continuous":
        return peer_runs.run_hf_continuous(model, workload, dtype, device)
    if peer == "vllm":
        if args.vllm_python is None:
            raise ValueError("--peers vllm needs --vllm-python (vLLM's own venv)")
        from inflight.bench.vllm_peer import run_vllm

        return run_vllm(args.vllm_python, model, workload, dtype, max_num_seqs)
    if peer in ("llamacpp", "llamacpp-gguf"):
        if args.llamacpp_python is None:
            raise ValueError(f"--peers {peer} needs --llamacpp-python (its own venv)")
        from inflight.bench.llamacpp_peer import run_llamacpp

        return run_llamacpp(args.llamacpp_python, model, workload, dtype,
                            as_shipped=peer == "llamacpp-gguf")  # fmt: skip
    if peer == "llama-server":
        if args.llama_server is None:
            raise ValueError("--peers llama-server needs --llama-server (its binary)")
        if not is_gguf(model):
            raise ValueError("llama-server runs a GGUF file; the model is not one")
        from inflight.bench.server_peers import run_llama_server

        return run_llama_server(args.llama_server, model, workload, max_num_seqs)
    if peer == "inflight-serve":
        from inflight.bench.server_peers import run_inflight_server

        return run_inflight_server(model, workload, knobs)
    raise ValueError(f"unknown peer {peer!r}; known: {', '.join(peer_runs.PEERS)}")
