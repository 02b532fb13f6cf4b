"""Speculation's speed on a model whose own drafts cannot be had (random weights never repeat
their prompt, so n-gram lookup finds nothing): each request's greedy answer is computed first,
then the speculative engine drafts from it (`Speculation.propose` replaced), every draft right
for a `--kept` share of the steps and spoiled after a random count of them otherwise; the cost
rule is held off. Prints whether the tokens are the plain engine's, both runs' seconds (each
after a warm-up run of the same requests) and the drafts kept.

    .venv/bin/python scripts/forced_drafts.py F [--requests 8] [--kept 0.5] [--drafts 3]
"""

from __future__ import annotations

import argparse
import random
import time

from inflight import LLM, SamplingParams
from inflight.core.speculation import Speculation, StepCostFit


def timed_tokens(llm: LLM, prompts: list[list[int]], params: SamplingParams):
    start = time.perf_counter()
    outs = llm.generate(prompts, params, use_tqdm=False)
    return [o.outputs[0].token_ids for o in outs], time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model")
    parser.add_argument("--requests", type=int, default=1, help="all at once, a seat each")
    parser.add_argument("--kept", type=float, default=1.0, help="share of steps all right")
    parser.add_argument("--drafts", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=64)
    args = parser.parse_args()
    prompts = [[100 + 7 * i + j for j in range(40 + 8 * i)] for i in range(args.requests)]
    params = SamplingParams(temperature=0, max_tokens=args.max_tokens, ignore_eos=True)
    plain = LLM(args.model, max_num_seqs=args.requests)
    timed_tokens(plain, prompts, params)
    want, plain_s = timed_tokens(plain, prompts, params)
    del plain
    answers = {tuple(p): w for p, w in zip(prompts, want, strict=True)}
    rng = random.Random(0)

    def drafts(self, request, limit):
        answer = answers[tuple(request.prompt_token_ids)]
        n = len(request.output_token_ids)
        true = answer[n : n + min(self.k, limit)]
        right = len(true) if rng.random() < args.kept else rng.randrange(max(len(true), 1))
        return true[:right] + [t - 1 if t else 1 for t in true[right:]]

    Speculation.propose = drafts
    StepCostFit.break_even_rate = lambda self: 0.0
    spec = LLM(args.model, max_num_seqs=args.requests, num_speculative_tokens=args.drafts)
    timed_tokens(spec, prompts, params)
    before = spec.core.scheduler.speculation.stats
    drafted, kept = before.drafted, before.accepted
    got, spec_s = timed_tokens(spec, prompts, params)
    stats = spec.core.scheduler.speculation.stats
    drafted, kept = stats.drafted - drafted, stats.accepted - kept
    print(
        f"tokens the plain engine's: {got == want}; plain {plain_s:.2f} s, speculative "
        f"{spec_s:.2f} s ({plain_s / spec_s:.2f}x); drafts kept {kept} of {drafted}"
    )


if __name__ == "__main__":
    main()
