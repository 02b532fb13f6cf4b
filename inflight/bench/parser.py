"""The `inflight bench` subcommands' flags, apart from the runs they start: building the
parser (every `inflight` command builds it, `--help` included) imports nothing heavier than
argparse, where the runs import torch, transformers and matplotlib."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any

from inflight.workload.flags import DefaultsHelpFormatter, add_workload_flags
from inflight.workload.requests import NAMED

PEERS = ("hf-static", "hf-continuous", "vllm", "llamacpp", "llamacpp-gguf", "llama-server",
         "inflight-serve")  # fmt: skip


def positive(text: str) -> float:
    """A finite number > 0, for rates and durations (a flag value, so argparse reports it)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text}")
    return value


def add_bench_parser(sub: Any, add_engine_flags: Callable[[argparse.ArgumentParser], None]) -> None:
    bench = sub.add_parser(
        "bench",
        help="benchmarks: offline, compare, roofline, serve, soak, slowloris, fairness, fleet, "
        "calibrate, agreement, memory, slo",
    )
    modes = bench.add_subparsers(dest="bench_command", required=True)
    fmt = DefaultsHelpFormatter
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
                                 help="quantized activations (or KV cache dtypes) against "
                                 "the exact path: greedy tokens on the parity prompts, and "
                                 "a scored text's perplexity")  # fmt: skip
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
        help=f"comma-separated peers to run too: {', '.join(PEERS)}",
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
