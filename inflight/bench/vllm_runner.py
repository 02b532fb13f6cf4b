"""Runs one workload through vLLM's offline API; executed by vLLM's own Python, never imported
by inflight (vLLM is not our dependency). Usage:

    python vllm_runner.py WORKLOAD.jsonl RESULT.json --model DIR --dtype bfloat16 --max-num-seqs 64

The workload holds token ids (`prompt`) and `max_tokens`; every request is greedy with
`ignore_eos`, as inflight's runs are. The requests are added to vLLM's engine and stepped to the
end, as `LLM.generate` does internally, but watching every step's outputs: the result holds the
wall time (start-up excluded) and, per request, prompt and output token counts, time to first
token and end-to-end latency from the start. The caller samples peak memory.
"""

import argparse
import json
import time


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("workload")
    parser.add_argument("result")
    parser.add_argument("--model", required=True)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--max-num-seqs", type=int, default=64)
    parser.add_argument("--max-num-batched-tokens", type=int, default=2048)
    args = parser.parse_args()

    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    with open(args.workload) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    max_len = max(len(r["prompt"]) + r["max_tokens"] for r in rows)
    llm = LLM(
        model=args.model,
        dtype=args.dtype,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=max(args.max_num_batched_tokens, max_len),
        max_model_len=max_len,
        seed=0,
    )
    prompts = [TokensPrompt(prompt_token_ids=r["prompt"]) for r in rows]
    params = [
        SamplingParams(temperature=0.0, max_tokens=r["max_tokens"], ignore_eos=True) for r in rows
    ]
    engine = llm.llm_engine
    first_token: dict[str, float] = {}
    finished: dict[str, list] = {}
    start = time.perf_counter()
    for i, (prompt, param) in enumerate(zip(prompts, params, strict=True)):
        engine.add_request(str(i), prompt, param)
    while engine.has_unfinished_requests():
        for out in engine.step():
            now = time.perf_counter() - start
            if out.outputs and out.outputs[0].token_ids:
                first_token.setdefault(out.request_id, now)
            if out.finished:
                finished[out.request_id] = [
                    len(out.prompt_token_ids), len(out.outputs[0].token_ids),
                    first_token[out.request_id], now,
                ]  # fmt: skip
    wall = time.perf_counter() - start
    result = {"wall_s": wall, "requests": [finished[str(i)] for i in range(len(rows))]}
    with open(args.result, "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
