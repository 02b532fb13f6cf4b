"""Benchmark workloads: prompts cut from real prose shipped with the package, long-tailed
output lengths, a fixed seed. Nothing is downloaded.

`mixed64` is the reference workload of the project: 64 requests, prompts ~20-400 tokens,
outputs long-tailed between 8 and 256 tokens, greedy with `ignore_eos`, all arriving at once.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from importlib import resources

from transformers import PreTrainedTokenizerBase


@dataclass(frozen=True)
class WorkloadRequest:
    prompt_token_ids: list[int]
    max_tokens: int


def corpus_text() -> str:
    return resources.files("inflight.bench").joinpath("data/corpus.txt").read_text()


def log_uniform_int(rng: random.Random, low: int, high: int) -> int:
    return round(math.exp(rng.uniform(math.log(low), math.log(high))))


def long_tailed_int(rng: random.Random, low: int, high: int, median: float) -> int:
    """Lognormal around `median` (sigma 0.9), clipped to [low, high]."""
    return max(low, min(high, round(rng.lognormvariate(math.log(median), 0.9))))


def mixed64(tokenizer: PreTrainedTokenizerBase, seed: int = 0) -> list[WorkloadRequest]:
    rng = random.Random(seed)
    corpus = tokenizer(corpus_text(), add_special_tokens=False).input_ids
    requests = []
    for _ in range(64):
        length = log_uniform_int(rng, 20, 400)
        start = rng.randrange(len(corpus))
        prompt = [corpus[(start + i) % len(corpus)] for i in range(length)]
        requests.append(WorkloadRequest(prompt, long_tailed_int(rng, 8, 256, median=48)))
    return requests
