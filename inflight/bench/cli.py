"""`inflight bench offline | compare | serve`: run a workload, write a results folder."""

from __future__ import annotations

import argparse
import gc
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from inflight.bench import peers as peer_runs
from inflight.bench.offline import run_offline
from inflight.bench.stats import RunResult
from inflight.bench.workloads import NAMED, WorkloadRequest, load_jsonl, named

logger = logging.getLogger("inflight.bench")


def add_workload_flags(parser: argparse.ArgumentParser) -> None:
    named_list = ", ".join(NAMED)
    parser.add_argument("--workload", default="mixed64",
                        help=f"named ({named_list}) or JSONL file (default: mixed64)")  # fmt: skip
    parser.add_argument("--num-requests", type=int, default=None,
                        help="override the named workload's request count")  # fmt: skip
    parser.add_argument("--workload-seed", type=int, default=0, help="(default: 0)")
    parser.add_argument("--arrival", choices=("all", "poisson", "gamma"), default="all",
                        help="(default: all at once)")  # fmt: skip
    parser.add_argument("--rate", type=float, default=4.0,
                        help="mean requests/s when not 'all' (default: 4)")  # fmt: skip
    parser.add_argument("--out", type=Path, default=None,
                        help="results folder (default: results/bench-COMMAND-TIME)")  # fmt: skip


def load_workload(args: argparse.Namespace, tokenizer) -> list[WorkloadRequest]:
    if args.workload.endswith(".jsonl"):
        return load_jsonl(Path(args.workload), tokenizer)
    return named(args.workload, tokenizer, args.workload_seed, args.num_requests, args.arrival,
                 args.rate)  # fmt: skip


def add_bench_parser(sub: Any, add_engine_flags: Callable[[argparse.ArgumentParser], None]) -> None:
    bench = sub.add_parser("bench", help="benchmarks: offline, compare, serve")
    modes = bench.add_subparsers(dest="bench_command", required=True)
    fmt = argparse.ArgumentDefaultsHelpFormatter
    offline = modes.add_parser("offline", help="one workload through the engine",
                               formatter_class=fmt)  # fmt: skip
    compare = modes.add_parser(
        "compare", formatter_class=fmt, help="continuous vs static batching, and peers, in one run"
    )
    for p in (offline, compare):
        add_workload_flags(p)
        add_engine_flags(p)
    compare.add_argument(
        "--peers",
        default="",
        help=f"comma-separated peers to run too: {', '.join(peer_runs.PEERS)}",
    )
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
    add_workload_flags(serve)


def run_bench(args: argparse.Namespace, knobs: dict[str, Any]) -> int:
    out = (
        args.out or Path("results") / f"bench-{args.bench_command}-{time.strftime('%Y%m%d-%H%M%S')}"
    )
    if args.bench_command == "serve":
        from inflight.bench.serve import run_serve_sweep

        report = run_serve_sweep(args, out)
    else:
        report = run_local(args, knobs, out)
    logger.info("results in %s", out)
    print((out / "summary.md").read_text())
    return 0 if all("error" not in r for r in report["runs"]) else 1


def run_local(args: argparse.Namespace, knobs: dict[str, Any], out: Path) -> dict:
    """Inflight in each mode on the same loaded weights, then the peers; the report is rewritten
    after every run, so a long comparison cut short still leaves its finished runs."""
    from inflight.bench.report import write_report  # matplotlib: only when reporting
    from inflight.engine.llm import LLM

    title = f"inflight bench {args.bench_command}: {args.workload}"
    modes = ["continuous", "static"] if args.bench_command == "compare" else [
        knobs.get("batching", "continuous")]  # fmt: skip
    runs: list[RunResult] = []
    loaded = None
    for mode in modes:
        llm = LLM(loaded_model=loaded, **{**knobs, "batching": mode})
        loaded = llm.core.loaded
        workload = load_workload(args, llm.tokenizer)
        dtype = str(llm.core.dtype).removeprefix("torch.")
        runs.append(run_offline(llm, workload, f"inflight-{mode}"))
        meta = {
            "model": str(loaded.path), "dtype": dtype, "workload": args.workload,
            "requests": len(workload), "arrival": args.arrival,
            "max_num_seqs": llm.config.scheduler.max_num_seqs,
            "max_num_batched_tokens": llm.config.scheduler.max_num_batched_tokens,
        }  # fmt: skip
        report = write_report(out, title, runs, meta)
        del llm
        gc.collect()
    for peer in [p for p in getattr(args, "peers", "").split(",") if p]:
        try:
            if peer == "hf-static":
                runs.append(peer_runs.run_hf_static(loaded.path, workload, dtype,
                                                    meta["max_num_seqs"]))  # fmt: skip
            elif peer == "hf-continuous":
                runs.append(peer_runs.run_hf_continuous(loaded.path, workload, dtype))
            else:
                raise ValueError(f"unknown peer {peer!r}; known: {', '.join(peer_runs.PEERS)}")
        except Exception as e:  # a peer failing must not lose the other results
            logger.exception("peer %s failed", peer)
            runs.append(RunResult(peer, 0.0, [], error=f"{type(e).__name__}: {e}"))
        report = write_report(out, title, runs, meta)
        gc.collect()
    return report
