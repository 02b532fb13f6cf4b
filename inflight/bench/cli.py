"""`inflight bench offline | compare | serve`: run a workload, write a results folder."""

from __future__ import annotations

import argparse
import gc
import json
import logging
import time
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
from inflight.model.loader import is_gguf, resolve_engine_dtype, resolve_quantized_activations
from inflight.platform import describe_device, resolve_device
from inflight.sampling_params import StructuredOutputs
from inflight.workload.requests import WorkloadRequest, load_jsonl, named
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


def load_workload(args: argparse.Namespace, tokenizer) -> list[WorkloadRequest]:
    if args.workload.endswith(".jsonl"):
        return load_jsonl(Path(args.workload), tokenizer)
    return named(args.workload, tokenizer, args.workload_seed, args.num_requests, args.arrival,
                 args.rate)  # fmt: skip


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
    """Inflight in each mode on the same loaded weights, then the peers; results.json and
    summary.md are rewritten after every run, so a long comparison cut short still leaves its
    finished runs, and the plots are drawn once, at the end."""
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
                asked = mode_knobs.get("quantized_activations", ModelConfig.quantized_activations)
                wanted = resolve_engine_dtype(
                    mode_knobs.get("dtype", ModelConfig.dtype),
                    resolve_device(mode_knobs.get("device", ModelConfig.device)),
                    loaded.path,
                    asked,
                )
                activations = resolve_quantized_activations(
                    asked,
                    wanted,
                    mode_knobs.get("max_num_seqs", SchedulerConfig.max_num_seqs),
                    loaded.path,
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
            write_report(out, title, runs, meta, plots=False)
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
            write_report(out, title, runs, meta, plots=False)
            gc.collect()
    return write_report(out, title, runs, meta)


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
