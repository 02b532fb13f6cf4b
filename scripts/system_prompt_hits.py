"""What a system prompt shared by requests costs each of them, one after another on one engine:
each request is the same `--system` random tokens followed by `--message` tokens of its own,
asked for one token. An attention model's second request resumes from the first's blocks; a
state-carrying model's (LFM2, Qwen3.5) from a state saved where the prompts part, which the
second request saves, so its third is the first to resume. Prints each request's seconds and
the tokens hit.

    .venv/bin/python scripts/system_prompt_hits.py F [--system 1000] [--message 40] [--requests 4]
"""

from __future__ import annotations

import argparse
import random
import time

from inflight import LLM, SamplingParams


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model")
    parser.add_argument("--system", type=int, default=1000, help="tokens every request shares")
    parser.add_argument("--message", type=int, default=40, help="tokens of each one's own")
    parser.add_argument("--requests", type=int, default=4)
    args = parser.parse_args()
    llm = LLM(args.model, max_num_seqs=4, kv_cache_memory_bytes=2**30)
    rng = random.Random(0)
    system = [rng.randrange(100, 30000) for _ in range(args.system)]
    params = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)
    llm.generate([[5, 6, 7]], params, use_tqdm=False)  # (first-use costs)
    seconds = []
    for _ in range(args.requests):
        prompt = system + [rng.randrange(100, 30000) for _ in range(args.message)]
        start = time.perf_counter()
        llm.generate([prompt], params, use_tqdm=False)
        seconds.append(round(time.perf_counter() - start, 3))
    print(
        f"seconds per request: {seconds}; tokens hit: {llm.core.kv_cache_manager.prefix_stats.hits}"
    )


if __name__ == "__main__":
    main()
