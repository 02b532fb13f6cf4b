"""First throughput figure: the default model on the `mixed64` workload, continuous vs static.

    .venv/bin/python scripts/throughput.py [--dtype bfloat16] [--out results/throughput.json]

Runs the same 64 requests (greedy, ignore_eos) through the same engine in both batching modes,
one after the other, and writes output tokens/s, wall time, steps and mean batch size to a JSON
file. A measurement script, not a test: numbers vary with machine load; compare within one run.
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import platform
import statistics
import time
from pathlib import Path

import torch

from inflight import LLM, SamplingParams
from inflight.bench.workloads import mixed64


def run_mode(batching: str, dtype: str, max_num_seqs: int) -> dict:
    llm = LLM(dtype=dtype, batching=batching, max_num_seqs=max_num_seqs)
    workload = mixed64(llm.tokenizer)
    prompts = [r.prompt_token_ids for r in workload]
    params = [
        SamplingParams(temperature=0, max_tokens=r.max_tokens, ignore_eos=True) for r in workload
    ]
    start = time.perf_counter()
    outputs = llm.generate(prompts, params)
    wall = time.perf_counter() - start
    num_out = sum(len(o.outputs[0].token_ids) for o in outputs)
    num_prompt = sum(len(p) for p in prompts)
    totals = llm.core.totals
    result = {
        "batching": batching,
        "requests": len(prompts),
        "prompt_tokens": num_prompt,
        "output_tokens": num_out,
        "wall_s": round(wall, 2),
        "output_tok_per_s": round(num_out / wall, 1),
        "total_tok_per_s": round((num_out + num_prompt) / wall, 1),
        "steps": totals.num_steps,
        "mean_batch_seqs": round(totals.mean_batch_seqs, 1),
        "mean_ttft_s": round(statistics.mean(o.metrics.ttft for o in outputs), 2),
        "preemptions": totals.num_preemptions,
    }
    del llm
    gc.collect()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--max-num-seqs", type=int, default=64)
    parser.add_argument("--out", type=Path, default=Path("results/throughput.json"))
    args = parser.parse_args()
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )

    runs = [run_mode(mode, args.dtype, args.max_num_seqs) for mode in ("continuous", "static")]
    ratio = runs[0]["output_tok_per_s"] / runs[1]["output_tok_per_s"]
    report = {
        "workload": "mixed64",
        "model": "SmolLM2-135M-Instruct (GGUF Q4_1, dequantized)",
        "dtype": args.dtype,
        "machine": platform.processor() or platform.machine(),
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "runs": runs,
        "continuous_over_static": round(ratio, 2),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print("| mode | output tok/s | wall s | steps | mean batch | mean TTFT s |")
    print("|---|---|---|---|---|---|")
    for r in runs:
        print(
            f"| {r['batching']} | {r['output_tok_per_s']} | {r['wall_s']} | {r['steps']} "
            f"| {r['mean_batch_seqs']} | {r['mean_ttft_s']} |"
        )
    print(f"continuous / static output tokens/s: {ratio:.2f}x  (written to {args.out})")


if __name__ == "__main__":
    main()
