"""On the GPU machine: why are the first prompt steps of a new shape slow?
(`python cold_steps.py MODEL_FOLDER [--enforce-eager]`)

The first GPU session saw prompt steps of 0.5-3.6 s while warm ones took 0.05 s. Each round here
submits 16 prompts of fresh random lengths (2 output tokens each, so the rounds are prompt steps)
and reports the forward time of its steps, the new Triton compilations (files added to Triton's
cache) and, for the round run under cuDNN attention switched off, whether that was the cost.
The last round runs under `torch.profiler` and prints the ops that took the host's time.
"""

from __future__ import annotations

import os
import random
import sys
import time
from pathlib import Path

import torch

from inflight import LLM, SamplingParams

CACHE = Path(os.environ.get("TRITON_CACHE_DIR", Path.home() / ".triton" / "cache"))


def cache_entries() -> int:
    return sum(1 for _ in CACHE.rglob("*.json")) if CACHE.exists() else 0


def one_round(llm: LLM, rng: random.Random, label: str, lengths: list[int] | None = None) -> list:
    lengths = lengths or [rng.randint(20, 700) for _ in range(16)]
    prompts = [[rng.randint(100, 40000) for _ in range(n)] for n in lengths]
    timer = llm.core.enable_profiling()
    before = cache_entries()
    start = time.perf_counter()
    llm.generate(
        prompts, SamplingParams(max_tokens=2, ignore_eos=True, temperature=0), use_tqdm=False
    )
    wall = time.perf_counter() - start
    forwards = [s.seconds.get("forward", 0.0) for s in timer.steps]
    slow = [f"{1e3 * f:.0f}" for f in forwards if f > 0.1]
    print(
        f"{label}: {wall:.2f} s, {len(forwards)} steps, forward {1e3 * sum(forwards):.0f} ms "
        f"(max {1e3 * max(forwards):.0f}), steps over 100 ms: {slow or 'none'}, "
        f"new Triton cache files: {cache_entries() - before}",
        flush=True,
    )
    return lengths


def main() -> None:
    model, eager = sys.argv[1], "--enforce-eager" in sys.argv
    print(f"enforce_eager={eager}, Triton cache {CACHE} ({cache_entries()} files)")
    llm = LLM(model, max_num_seqs=64, enforce_eager=eager)
    rng = random.Random(0)
    one_round(llm, rng, "round 1, cold")
    lengths = one_round(llm, rng, "round 2, new lengths")
    one_round(llm, rng, "round 3, round 2's lengths again", lengths)
    one_round(llm, rng, "round 4, new lengths")
    torch.backends.cuda.enable_cudnn_sdp(False)
    one_round(llm, rng, "round 5, new lengths, cuDNN attention off")
    torch.backends.cuda.enable_cudnn_sdp(True)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        one_round(llm, rng, "round 6, new lengths, profiled")
    print(
        prof.key_averages().table(
            sort_by="self_cpu_time_total", row_limit=14, max_name_column_width=60
        )
    )


if __name__ == "__main__":
    main()
