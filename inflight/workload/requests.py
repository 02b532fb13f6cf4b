"""Benchmark workloads: prompts cut from real prose shipped with the package, length
distributions, arrival processes, a fixed seed, JSONL files. Nothing is downloaded.

Named workloads:
- `mixed64`: the project's reference: 64 requests, prompts ~20-400 tokens, outputs long-tailed
  between 8 and 256 tokens, greedy with `ignore_eos`, all arriving at once.
- `longtail`: 128 requests, prompts 20-400 tokens, outputs lognormal around 32 clipped to
  [8, 512]: a batch that waits for its longest member wastes most of its seats.
- `shared_prefix`: 64 requests behind one 300-token system prompt (prefix-caching benchmark).
- `prefix_groups`: 128 requests behind 16 different 300-token system prompts (what a router
  that sends a prefix back to the replica holding it is for).
- `chat`: a chat-like mix: 80% short questions with medium answers, 20% long documents with
  short answers.
- `edit`: 32 requests to copy a passage of 60-200 tokens, each asking for as many tokens as its
  passage: output that repeats the prompt, where speculative n-gram lookup pays.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from importlib import resources
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING

from inflight.request import DEFAULT_TENANT

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


@dataclass(frozen=True)
class WorkloadRequest:
    prompt_token_ids: list[int]
    max_tokens: int
    arrival_time: float = 0.0  # seconds after the start of the run
    priority: int = 0
    tenant: str = DEFAULT_TENANT  # whose share it uses (`fair` scheduling)


# ------------------------------------------------------------------ length laws
LengthLaw = Callable[[random.Random], int]


def fixed(n: int) -> LengthLaw:
    return lambda rng: n


def uniform(low: int, high: int) -> LengthLaw:
    return lambda rng: rng.randint(low, high)


def log_uniform(low: int, high: int) -> LengthLaw:
    return lambda rng: round(math.exp(rng.uniform(math.log(low), math.log(high))))


def lognormal(median: float, sigma: float, low: int, high: int) -> LengthLaw:
    """Long-tailed: lognormal around `median`, clipped to [low, high]."""
    return lambda rng: max(low, min(high, round(rng.lognormvariate(math.log(median), sigma))))


def mixture(*parts: tuple[float, LengthLaw]) -> LengthLaw:
    weights = [w for w, _ in parts]
    return lambda rng: rng.choices([law for _, law in parts], weights)[0](rng)


# -------------------------------------------------------------- arrival laws
def arrivals(
    kind: str, n: int, rng: random.Random, rate: float = 1.0, cv: float = 3.0
) -> list[float]:
    """Arrival times: `all` at once, `poisson` at `rate`/s, or `gamma` bursts (coefficient of
    variation `cv` > 1 clusters requests) at the same mean rate."""
    if kind == "all":
        return [0.0] * n
    if kind == "poisson":
        gaps = [rng.expovariate(rate) for _ in range(n)]
    elif kind == "gamma":
        shape = 1.0 / (cv * cv)
        gaps = [rng.gammavariate(shape, 1.0 / (rate * shape)) for _ in range(n)]
    else:
        raise ValueError(f"unknown arrival process {kind!r}: all, poisson or gamma")
    times, t = [], 0.0
    for gap in gaps:
        times.append(t)
        t += gap
    return times


# ---------------------------------------------------------------------- prompts
class WordTokenizer:
    """A stand-in tokenizer for simulations, which need token counts, not a model: one token per
    whitespace-separated word, ids in order of first appearance (equal words, equal ids, so
    shared prefixes stay shared)."""

    def __init__(self) -> None:
        self.vocab: dict[str, int] = {}

    def __call__(self, text: str, add_special_tokens: bool = False) -> SimpleNamespace:
        return SimpleNamespace(input_ids=[self.vocab.setdefault(w, len(self.vocab))
                                          for w in text.split()])  # fmt: skip


def corpus_text() -> str:
    return resources.files("inflight.workload").joinpath("data/corpus.txt").read_text()


def synthetic(
    tokenizer: PreTrainedTokenizerBase,
    num_requests: int,
    prompt_len: LengthLaw,
    output_len: LengthLaw | None,
    seed: int = 0,
    arrival: str = "all",
    rate: float = 1.0,
    shared_prefix: int = 0,
    num_prefixes: int = 1,
    task: tuple[str, str] | None = None,
) -> list[WorkloadRequest]:
    """Prompts are windows of the shipped corpus (wrapping around) of `prompt_len` tokens,
    after a `shared_prefix`-token system prompt: the corpus's first tokens, or with
    `num_prefixes` > 1 one of that many consecutive windows, drawn per request. A `task`
    (text before, text after) frames each window as something to rewrite; `output_len` None
    asks for as many tokens as the window has."""
    rng = random.Random(seed)
    corpus = tokenizer(corpus_text(), add_special_tokens=False).input_ids
    before, after = ([tokenizer(t, add_special_tokens=False).input_ids for t in task]
                     if task else ([], []))  # fmt: skip
    times = arrivals(arrival, num_requests, random.Random(seed + 1), rate)
    requests = []
    for i in range(num_requests):
        length = prompt_len(rng)
        start = rng.randrange(len(corpus))
        group = rng.randrange(num_prefixes) if num_prefixes > 1 else 0
        first = group * shared_prefix
        prefix = [corpus[(first + j) % len(corpus)] for j in range(shared_prefix)]
        window = [corpus[(start + j) % len(corpus)] for j in range(length)]
        max_tokens = output_len(rng) if output_len is not None else length
        requests.append(WorkloadRequest(prefix + before + window + after, max_tokens, times[i]))
    return requests


NAMED: dict[str, dict] = {
    "mixed64": dict(num_requests=64, prompt_len=log_uniform(20, 400),
                    output_len=lognormal(48, 0.9, 8, 256)),
    "longtail": dict(num_requests=128, prompt_len=log_uniform(20, 400),
                     output_len=lognormal(32, 1.0, 8, 512)),
    "shared_prefix": dict(num_requests=64, shared_prefix=300, prompt_len=log_uniform(10, 100),
                          output_len=lognormal(32, 0.7, 8, 128)),
    "prefix_groups": dict(num_requests=128, shared_prefix=300, num_prefixes=16,
                          prompt_len=log_uniform(10, 100), output_len=lognormal(32, 0.7, 8, 128)),
    "chat": dict(num_requests=96, prompt_len=mixture((0.8, uniform(20, 150)),
                                                     (0.2, uniform(400, 1000))),
                 output_len=mixture((0.8, lognormal(120, 0.6, 16, 400)),
                                    (0.2, uniform(16, 64)))),
    "edit": dict(num_requests=32, prompt_len=uniform(60, 200), output_len=None,
                 task=("Copy the passage below exactly, then stop.\n\nPassage:\n",
                       "\n\nCopy:\n")),
}  # fmt: skip


def named(
    name: str,
    tokenizer: PreTrainedTokenizerBase,
    seed: int = 0,
    num_requests: int | None = None,
    arrival: str = "all",
    rate: float = 1.0,
) -> list[WorkloadRequest]:
    if name not in NAMED:
        raise ValueError(f"unknown workload {name!r}; named workloads: {', '.join(NAMED)}")
    spec = dict(NAMED[name])
    if num_requests is not None:
        spec["num_requests"] = num_requests
    return synthetic(tokenizer, seed=seed, arrival=arrival, rate=rate, **spec)


def require_simultaneous(workload: list[WorkloadRequest], peer: str) -> None:
    """Peers that take a whole workload at once cannot honour arrival times."""
    if any(r.arrival_time > 0 for r in workload):
        raise ValueError(f"{peer} only runs workloads whose requests all arrive at once")


def pad_batches(
    workload: list[WorkloadRequest], batch_size: int, pad_id: int
) -> list[WorkloadRequest]:
    """The work of static batching as transformers `generate` does it, request by request:
    consecutive batches of `batch_size` in workload order, each prompt left-padded with `pad_id`
    to its batch's longest prompt and decoding until its batch's longest `max_tokens`. (Where
    `generate` masks the pads, these rows attend to them: the same compute, other tokens.)"""
    padded = []
    for i in range(0, len(workload), batch_size):
        batch = workload[i : i + batch_size]
        width = max(len(r.prompt_token_ids) for r in batch)
        longest = max(r.max_tokens for r in batch)
        padded += [replace(r, prompt_token_ids=[pad_id] * (width - len(r.prompt_token_ids))
                           + r.prompt_token_ids, max_tokens=longest) for r in batch]  # fmt: skip
    return padded


# ------------------------------------------------------------------------ JSONL
def save_jsonl(requests: list[WorkloadRequest], path: Path) -> None:
    """One request a line: `prompt` (token ids), `max_tokens`, `arrival_time`, `priority`,
    `tenant`."""
    with path.open("w") as f:
        for r in requests:
            row = asdict(r)
            row["prompt"] = row.pop("prompt_token_ids")
            f.write(json.dumps(row) + "\n")


def load_jsonl(
    path: Path, tokenizer: PreTrainedTokenizerBase | None = None
) -> list[WorkloadRequest]:
    """Reads a workload file; a `prompt` given as text is tokenized with `tokenizer`."""
    requests = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        row = json.loads(line)
        prompt = row["prompt"]
        if isinstance(prompt, str):
            if tokenizer is None:
                raise ValueError(f"{path}:{n}: a text prompt needs a tokenizer")
            prompt = tokenizer(prompt, add_special_tokens=False).input_ids
        requests.append(
            WorkloadRequest(prompt, int(row["max_tokens"]), float(row.get("arrival_time", 0.0)),
                            int(row.get("priority", 0)), str(row.get("tenant", DEFAULT_TENANT)))
        )  # fmt: skip
    return requests
