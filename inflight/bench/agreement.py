"""`inflight bench agreement`: how far `int8_activations` moves greedy output from the exact
path, on the parity prompts.

Both engines decode every prompt greedily for the same number of tokens (EOS ignored, so every
continuation is as long); the report counts prompts whose first token agrees, prompts whose whole
continuation agrees, and the tokens that agree before the first difference (after one, the two
continuations condition on different text, so later tokens are not compared).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from inflight.engine.llm import LLM
from inflight.sampling_params import SamplingParams
from inflight.workload.parity import parity_prompts

logger = logging.getLogger(__name__)


def common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def greedy(llm: LLM, prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    outputs = llm.generate(prompts, params, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outputs]


def agreement(reference: list[list[int]], candidate: list[list[int]]) -> dict[str, Any]:
    prefixes = [common_prefix(r, c) for r, c in zip(reference, candidate, strict=True)]
    total = sum(len(r) for r in reference)
    return {
        "prompts": len(reference),
        "first_token_agrees": sum(p > 0 for p in prefixes),
        "all_tokens_agree": sum(p == len(r) for p, r in zip(prefixes, reference, strict=True)),
        "tokens_before_first_difference": sum(prefixes),
        "tokens": total,
        "share_before_first_difference": sum(prefixes) / total if total else 1.0,
        "per_prompt": prefixes,
    }


def run_agreement(knobs: dict[str, Any], out: Path, max_tokens: int = 64) -> str:
    """Runs the exact engine, then the one with 8-bit activations, on the same knobs otherwise;
    writes agreement.json and agreement.md, and returns the latter."""
    runs = {}
    for int8 in (False, True):
        llm = LLM(**{**knobs, "int8_activations": int8})
        prompts = parity_prompts(llm.tokenizer)
        logger.info("greedy, %d prompts, int8_activations=%s", len(prompts), int8)
        runs[int8] = greedy(llm, prompts, max_tokens)
        device, dtype = llm.core.device, llm.core.dtype
        del llm
    result = {**agreement(runs[False], runs[True]), "max_tokens": max_tokens,
              "device": str(device), "dtype": str(dtype).removeprefix("torch.")}  # fmt: skip
    out.mkdir(parents=True, exist_ok=True)
    (out / "agreement.json").write_text(json.dumps(result, indent=2) + "\n")
    r = result
    text = "\n".join([
        "# Token agreement: int8_activations against the exact path", "",
        f"{r['prompts']} parity prompts, {max_tokens} greedy tokens each, {r['dtype']} on "
        f"{r['device']}.", "",
        "| measure | value |", "|---|---|",
        f"| first token agrees | {r['first_token_agrees']} / {r['prompts']} |",
        f"| whole continuation agrees | {r['all_tokens_agree']} / {r['prompts']} |",
        f"| tokens before the first difference | {r['tokens_before_first_difference']} / "
        f"{r['tokens']} ({r['share_before_first_difference']:.1%}) |",
        "", f"Tokens before the first difference, per prompt: {r['per_prompt']}", "",
    ])  # fmt: skip
    (out / "agreement.md").write_text(text)
    return text
