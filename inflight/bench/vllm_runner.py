"""Runs one workload through vLLM's offline API; executed by vLLM's own Python, never imported
by inflight (vLLM is not our dependency). Usage:

    python vllm_runner.py MODEL_DIR WORKLOAD.jsonl RESULT.json --dtype bfloat16 --max-num-seqs 64

The workload holds token ids (`prompt`) and `max_tokens`; every request is greedy with
`ignore_eos`, as inflight's runs are. The result holds the wall time of `generate` (start-up
excluded) and each request's prompt and output token counts; the caller samples peak memory.
"""

import argparse
import json
import time


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    parser.add_argument("workload")
    parser.add_argument("result")
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
    start = time.perf_counter()
    outputs = llm.generate(prompts, params, use_tqdm=True)
    wall = time.perf_counter() - start
    result = {
        "wall_s": wall,
        "requests": [[len(o.prompt_token_ids), len(o.outputs[0].token_ids)] for o in outputs],
    }
    with open(args.result, "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
