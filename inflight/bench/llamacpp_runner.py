"""Runs one workload through llama.cpp (`llama-cpp-python`), one request at a time: executed by
that package's own Python, never imported by inflight. Usage:

    python llamacpp_runner.py WORKLOAD.jsonl RESULT.json --model FILE.gguf --threads 2

Single stream is how llama.cpp's Python API serves: each request's prompt is evaluated in
`n_batch` chunks, then tokens are decoded one by one, greedily, for exactly `max_tokens` tokens
(`generate` never stops at end-of-text by itself, which is `ignore_eos`). Times are taken from
the start of the run, all requests having arrived then, as for the other peers: request i waits
for requests 0..i-1. Output: wall time and per request [prompt tokens, output tokens, TTFT, e2e].
"""

import argparse
import json
import time


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("workload")
    parser.add_argument("result")
    parser.add_argument("--model", required=True)
    parser.add_argument("--threads", type=int, required=True)
    parser.add_argument("--flash-attn", action="store_true")
    args = parser.parse_args()

    from llama_cpp import Llama

    with open(args.workload) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    max_len = max(len(r["prompt"]) + r["max_tokens"] for r in rows)
    llm = Llama(
        model_path=args.model,
        n_ctx=max_len,
        n_batch=512,
        n_threads=args.threads,
        n_threads_batch=args.threads,
        flash_attn=args.flash_attn,
        seed=0,
        verbose=False,
    )
    records = []
    start = time.perf_counter()
    for row in rows:
        first = None
        produced = 0
        # reset=True also lets llama.cpp reuse a prefix shared with the previous request.
        for _token in llm.generate(row["prompt"], top_k=1, temp=0.0, reset=True):
            produced += 1
            if first is None:
                first = time.perf_counter() - start
            if produced == row["max_tokens"]:
                break
        records.append([len(row["prompt"]), produced, first, time.perf_counter() - start])
    result = {"wall_s": time.perf_counter() - start, "requests": records}
    with open(args.result, "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
