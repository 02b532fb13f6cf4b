"""`inflight bench agreement`: how far `quantized_activations` (int16, int8), or with
`kv_cache_dtypes` a KV cache in bf16 or 8 bits, moves the model from the exact path.

Two measures. Greedy, on the parity prompts: both engines decode every prompt for the same
number of tokens (EOS ignored, so every continuation is as long); the report counts prompts whose
first token agrees, prompts whose whole continuation agrees, and the tokens that agree before the
first difference (after one, the two continuations condition on different text, so later tokens
are not compared). A near-tie flips a greedy token, so the second measure scores a fixed text
instead, every position conditioned on the same tokens: each engine's perplexity of it, the share
of positions whose most likely next token agrees with the reference's, and the mean change in the
text's own tokens' log-probabilities (llama.cpp's `llama-perplexity` reports the like). The text
is CPython's own help topics (`pydoc_data`), the same on every machine of a Python version.
"""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path
from typing import Any

from inflight.config import ModelConfig
from inflight.engine.llm import LLM
from inflight.model.loader import resolve_engine_dtype, resolve_model_path
from inflight.platform import describe_device, resolve_device
from inflight.request import Logprobs
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


def scoring_text() -> str:
    """Some 450 kB of English prose and code that ships with every CPython."""
    from pydoc_data.topics import topics

    return "\n\n".join(topics[key] for key in sorted(topics))


# the scored text: this many windows of this many tokens, each scored from its own start
SCORED_WINDOWS, SCORED_WINDOW_TOKENS = 8, 512


def score(llm: LLM, ids: list[int]) -> list[list[Logprobs]]:
    """Each window's log-probabilities of its tokens after the first, with the most likely
    next token's at every position."""
    n = SCORED_WINDOW_TOKENS
    windows = [ids[i * n : (i + 1) * n] for i in range(SCORED_WINDOWS) if len(ids) >= (i + 1) * n]
    params = SamplingParams(max_tokens=1, prompt_logprobs=1)
    outputs = llm.generate(windows, params, use_tqdm=False)
    return [[lp for lp in o.prompt_logprobs[1:] if lp is not None] for o in outputs]


def perplexity(rows: list[list[Logprobs]]) -> float:
    scored = [lp.logprob for row in rows for lp in row]
    return math.exp(-sum(scored) / len(scored))


def score_agreement(reference: list[list[Logprobs]], candidate: list[list[Logprobs]]) -> dict:
    pairs = [(r, c) for rr, cr in zip(reference, candidate, strict=True)
             for r, c in zip(rr, cr, strict=True)]  # fmt: skip
    return {
        "perplexity": perplexity(candidate),
        "top_token_agrees": sum(r.top[0][0] == c.top[0][0] for r, c in pairs) / len(pairs),
        "mean_abs_logprob_change": sum(abs(r.logprob - c.logprob) for r, c in pairs) / len(pairs),
        "scored_tokens": len(pairs),
    }


KINDS = ("int16", "int8")


def quantized_dtype(knobs: dict[str, Any]) -> str:
    """The dtype an engine of these knobs computes in with quantized activations."""
    dtype = resolve_engine_dtype(
        knobs.get("dtype", ModelConfig.dtype),
        resolve_device(knobs.get("device", ModelConfig.device)),
        resolve_model_path(knobs.get("model")),
        "int16",
    )
    return str(dtype).removeprefix("torch.")


def run_agreement(
    knobs: dict[str, Any], out: Path, max_tokens: int = 64, reference_dtype: str | None = None,
    kv_cache_dtypes: tuple[str, ...] = (),
) -> str:  # fmt: skip
    """Runs the exact engine, then each kind of quantized activations, on the same knobs
    otherwise; writes agreement.json and agreement.md, and returns the latter. With
    `reference_dtype` (float32, say) the reference is the exact path in that dtype instead, and
    the engine's own exact path is compared with it too: a bf16 engine's rounding moves tokens
    as well, so only that comparison says which path is closer to the model. With
    `kv_cache_dtypes` the runs differ in the KV cache's dtype alone (the reference: `auto`, the
    model's), and the report adds the tokens of KV each GiB holds."""
    if kv_cache_dtypes:
        reference, column = "auto", "kv_cache_dtype"
        plan = [(kind, {**knobs, "kv_cache_dtype": kind}) for kind in ("auto", *kv_cache_dtypes)]
    else:
        reference = "off" if reference_dtype is None else f"off in {reference_dtype}"
        column = "quantized_activations"
        # by default the exact path in the dtype the kinds compute in, which `auto` can make
        # another (a K-quant file on a CPU with bf16: bf16 exact, float32 quantized)
        dtype_knob = {"dtype": reference_dtype or quantized_dtype(knobs)}
        kinds = KINDS if reference_dtype is None else ("off", *KINDS)
        plan = [(reference, {**knobs, **dtype_knob, "quantized_activations": "off"})]
        plan += [(kind, {**knobs, "quantized_activations": kind}) for kind in kinds]
    runs: dict[str, list[list[int]]] = {}
    scores: dict[str, list[list[Logprobs]]] = {}
    tokens_per_gib: dict[str, int] = {}
    text_ids: list[int] = []  # the scored text, encoded once: every run shares the tokenizer
    for label, run_knobs in plan:
        llm = LLM(**run_knobs)
        prompts = parity_prompts(llm.tokenizer)
        logger.info("greedy, %d prompts, %s", len(prompts), label)
        runs[label] = greedy(llm, prompts, max_tokens)
        logger.info("scoring %d windows of text, %s", SCORED_WINDOWS, label)
        text_ids = text_ids or llm.tokenizer.encode(scoring_text())
        scores[label] = score(llm, text_ids)
        cache = llm.core.kv_cache
        tokens_per_gib[label] = 2**30 * cache.num_blocks * cache.block_size // cache.num_bytes
        if label != reference:
            device, dtype = llm.core.device, llm.core.dtype
        del llm
    results = {label: {**agreement(runs[reference], runs[label]),
                       "kv_tokens_per_gib": tokens_per_gib[label],
                       "text": score_agreement(scores[reference], scores[label])}
               for label in runs if label != reference}  # fmt: skip
    meta = {"max_tokens": max_tokens, "device": describe_device(device),
            "dtype": str(dtype).removeprefix("torch."), "reference": reference,
            "reference_kv_tokens_per_gib": tokens_per_gib[reference],
            "reference_perplexity": perplexity(scores[reference])}  # fmt: skip
    out.mkdir(parents=True, exist_ok=True)
    (out / "agreement.json").write_text(json.dumps({**meta, "kinds": results}, indent=2) + "\n")
    prompts_n = len(runs[reference])
    what = "KV cache dtypes" if kv_cache_dtypes else "quantized activations"
    lines = [
        f"# Token agreement: {what} against the exact path ({column} {reference})", "",
        f"{prompts_n} parity prompts, {max_tokens} greedy tokens each, {meta['dtype']} on "
        f"{meta['device']}; the reference's KV cache holds "
        f"{tokens_per_gib[reference]:,} tokens per GiB.", "",
        f"| {column} | first token agrees | whole continuation agrees "
        "| tokens before the first difference | KV tokens per GiB |",
        "|---|---|---|---|---|",
    ]  # fmt: skip
    for kind, r in results.items():
        lines.append(
            f"| {kind} | {r['first_token_agrees']} / {r['prompts']} | {r['all_tokens_agree']} / "
            f"{r['prompts']} | {r['tokens_before_first_difference']} / {r['tokens']} "
            f"({r['share_before_first_difference']:.1%}) | {r['kv_tokens_per_gib']:,} |"
        )
    scored = next(iter(results.values()))["text"]["scored_tokens"] if results else 0
    lines += [
        "", f"Scoring {scored:,} tokens of CPython's help topics, each position after the same "
        f"tokens (the reference's perplexity: {meta['reference_perplexity']:.3f}):", "",
        f"| {column} | perplexity | change | top token agrees | mean abs. log-prob change |",
        "|---|---|---|---|---|",
    ]  # fmt: skip
    for kind, r in results.items():
        t = r["text"]
        change = t["perplexity"] / meta["reference_perplexity"] - 1
        agrees, moved = t["top_token_agrees"], t["mean_abs_logprob_change"]
        lines.append(f"| {kind} | {t['perplexity']:.3f} | {change:+.2%} | {agrees:.2%} | "
                     f"{moved:.4f} |")  # fmt: skip
    lines += ["", "Tokens before the first difference, per prompt:"]
    lines += [f"- {kind}: {r['per_prompt']}" for kind, r in results.items()]
    text = "\n".join(lines) + "\n"
    (out / "agreement.md").write_text(text)
    return text
