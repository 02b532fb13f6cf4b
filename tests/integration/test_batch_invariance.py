"""A token's values never depend on its batch or on preemption: each of 32 greedy requests of the
real default model gets the same tokens and the same log-probabilities, bit for bit, run alone
as beside the 31 others, all at once or in a KV pool so small that requests are preempted and
recomputed, their prompts chunked and mixed with decodes; and a conversation's next turn with
the prefix cache as without it. (Tokens alone rarely show a difference: it takes a near-tie to
flip one. The log-probabilities show any.)

What keeps it: every linear row goes through the GGUF blocks with 16-bit activations (8-bit ones
where K-quant blocks hold most weights) whatever the step's size (float32 on the 8-column layout,
the default there), and every token at or past its prompt attends as a decode, recomputed outputs
included (runner/step_inputs.py); a cached block holding decoded tokens is a hit only for a
request that decodes them too (`KVCacheManager._key`). Before the first two, all 32 requests'
log-probabilities moved; before the last, a next turn's moved by up to 0.03."""

from __future__ import annotations

import pytest

from inflight import LLM, SamplingParams

pytestmark = pytest.mark.integration

SETTINGS = {
    "all_at_once": {},
    # 24 blocks of 16 tokens hold one long request and a few short ones
    "preempted": {"num_kv_blocks": 24, "max_num_batched_tokens": 192},
}


def greedy(llm: LLM, prompts: list[list[int]]) -> list[tuple[list[int], list[float]]]:
    params = [SamplingParams(temperature=0, max_tokens=6 + 2 * (i % 4), ignore_eos=True,
                             logprobs=0) for i in range(len(prompts))]  # fmt: skip
    outputs = [o.outputs[0] for o in llm.generate(prompts, params, use_tqdm=False)]
    return [(o.token_ids, [lp.logprob for lp in o.logprobs]) for o in outputs]


@pytest.fixture(scope="module")
def alone(smollm_prompts, loaded_float32):
    prompts = (smollm_prompts * 2)[:32]
    llm = LLM(dtype="float32", loaded_model=loaded_float32(), max_num_seqs=1)
    return prompts, greedy(llm, prompts)


@pytest.mark.parametrize("setting", list(SETTINGS))
def test_greedy_values_do_not_depend_on_the_batch_or_on_preemption(alone, loaded_float32,
                                                                   setting):  # fmt: skip
    prompts, want = alone
    llm = LLM(dtype="float32", loaded_model=loaded_float32(), **SETTINGS[setting])
    got = greedy(llm, prompts)
    assert (llm.core.scheduler.num_preemptions > 0) == (setting == "preempted")
    moved = [i for i, (g, w) in enumerate(zip(got, want, strict=True)) if g != w]
    assert not moved, f"requests {moved} changed with the batch"


@pytest.fixture(scope="module")
def loaded_default(default_model):
    """The default model as a default engine here loads it, where that is not float32 (a bf16
    engine on a CPU with AVX-512 BF16: decode rows through the blocks, prompt rows through
    inflight's bf16 kernel); float32 engines are the tests above."""
    import torch

    from inflight.model.loader import (
        load_model,
        resolve_engine_dtype,
        resolve_quantized_activations,
    )

    dtype = resolve_engine_dtype("auto", torch.device("cpu"), default_model)
    if dtype == torch.float32:
        pytest.skip("the default engine computes in float32 here: the tests above are its own")
    bits = resolve_quantized_activations("auto", dtype, 64, default_model)
    return load_model(default_model, dtype, torch.device("cpu"), 16, quantized_activations=bits)


def test_the_default_engine_does_not_depend_on_the_batch_or_on_preemption(
    smollm_prompts, loaded_default
):
    """The same for the engine `inflight serve` runs where it is not float32: 16 requests alone,
    then all at once, then in a pool that preempts them (one-token prompts among them, whose
    lone row oneDNN would sum in another order)."""
    prompts = smollm_prompts[:16]
    assert min(len(p) for p in prompts) == 1
    knobs = {"dtype": str(loaded_default.dtype).removeprefix("torch."),
             "loaded_model": loaded_default,
             "quantized_activations": loaded_default.quantized_activations}  # fmt: skip
    want = greedy(LLM(**knobs, max_num_seqs=1), prompts)
    for setting in ("all_at_once", "preempted"):
        llm = LLM(**knobs, **{**SETTINGS[setting], "num_kv_blocks": 20} if setting == "preempted"
                  else SETTINGS[setting])  # fmt: skip
        got = greedy(llm, prompts)
        assert (llm.core.scheduler.num_preemptions > 0) == (setting == "preempted")
        moved = [i for i, (g, w) in enumerate(zip(got, want, strict=True)) if g != w]
        assert not moved, f"{setting}: requests {moved} changed with the batch"


def test_8_bit_activations_do_not_depend_on_the_batch_or_on_preemption(smollm_prompts,
                                                                       loaded_float32):  # fmt: skip
    """The same with x rounded to 8 bits, `auto`'s kind for a Q4_K_M file: 16
    requests alone against a pool that preempts them, their prompts chunked beside decodes."""
    prompts = smollm_prompts[:16]
    loaded = loaded_float32("int8")
    want = greedy(LLM(dtype="float32", loaded_model=loaded, quantized_activations="int8",
                      max_num_seqs=1), prompts)  # fmt: skip
    # (20 blocks: 16 requests preempt each other less than 32 do)
    llm = LLM(dtype="float32", loaded_model=loaded, quantized_activations="int8",
              **{**SETTINGS["preempted"], "num_kv_blocks": 20})  # fmt: skip
    got = greedy(llm, prompts)
    assert llm.core.scheduler.num_preemptions > 0, "no request was preempted"
    assert loaded.model.fused_layers.activation_bits == 8
    moved = [i for i, (g, w) in enumerate(zip(got, want, strict=True)) if g != w]
    assert not moved, f"requests {moved} changed with the batch"


def test_a_conversations_next_turn_does_not_depend_on_the_prefix_cache(smollm_prompts,
                                                                       loaded_float32):  # fmt: skip
    """Second turns (a first prompt, its answer, a new message) of 8 conversations give the
    tokens and log-probabilities they give without the cache, bit for bit, though the first
    turns' blocks are cached: the answers, decoded, are computed again as prompt rows.
    `reuse_decoded_kv` hits them as decoded (on the Zen 4 VM some log-probabilities then
    moved)."""
    firsts = [p for p in smollm_prompts if len(p) >= 16][:8]
    loaded = loaded_float32()
    knobs = {"dtype": "float32", "loaded_model": loaded}
    first = greedy(LLM(**knobs, enable_prefix_caching=False), firsts)
    seconds = [p + out + p[:9] for p, (out, _) in zip(firsts, first, strict=True)]
    want = greedy(LLM(**knobs, enable_prefix_caching=False), seconds)
    got = {}
    for reuse in (False, True):
        llm = LLM(**knobs, reuse_decoded_kv=reuse)
        assert greedy(llm, firsts) == first
        got[reuse] = greedy(llm, seconds), llm.core.kv_cache_manager.prefix_stats.hits
    assert got[False][0] == want
    assert 0 < got[False][1] < got[True][1]  # (the knob's hits reach into the answers)


def seeded(llm: LLM, prompts: list[list[int]], logprobs: int | None = 0) -> list[tuple]:
    """Sampled at temperature 1 with a seed per prompt, twins (equal prompts) sharing theirs;
    tokens, and their log-probabilities where asked for."""
    seeds: dict[tuple[int, ...], int] = {}
    for p in prompts:
        seeds.setdefault(tuple(p), 1000 + len(seeds))
    params = [SamplingParams(temperature=1.0, top_p=0.95, seed=seeds[tuple(p)],
                             max_tokens=12, ignore_eos=True, logprobs=logprobs)
              for p in prompts]  # fmt: skip
    outputs = [o.outputs[0] for o in llm.generate(prompts, params, use_tqdm=False)]
    return [(o.token_ids, [lp.logprob for lp in o.logprobs or []]) for o in outputs]


SEEDED_SETTINGS = {
    "preempted": SETTINGS["preempted"],
    # all at once, n-gram drafts verified on the rows of those that draft
    "speculating": {"num_speculative_tokens": 3},
}


@pytest.fixture(scope="module")
def seeded_alone(smollm_prompts, loaded_float32):
    prompts = smollm_prompts[:16]
    llm = LLM(dtype="float32", loaded_model=loaded_float32(), max_num_seqs=1)
    return prompts, seeded(llm, prompts)


@pytest.mark.parametrize("setting", list(SEEDED_SETTINGS))
def test_seeded_samples_do_not_depend_on_the_batch_a_twin_preemption_or_speculation(
    seeded_alone, loaded_float32, setting
):
    """The same seed gives the same tokens and log-probabilities, bit for bit, alone and in a
    batch holding each prompt twice (twins sent together): preempted and recomputed, or all at
    once with n-gram drafts verified on its rows (tokens alone there: a request that wants
    logprobs is never drafted for)."""
    prompts, alone = seeded_alone
    assert len({tuple(tokens) for tokens, _ in alone}) == len(prompts)  # it really samples
    speculating = setting == "speculating"
    llm = LLM(dtype="float32", loaded_model=loaded_float32(), **SEEDED_SETTINGS[setting])
    got = seeded(llm, prompts + prompts, None if speculating else 0)
    assert (llm.core.scheduler.num_preemptions > 0) == (setting == "preempted")
    want = [(tokens, [] if speculating else values) for tokens, values in alone + alone]
    if speculating:
        stats = llm.core.scheduler.speculation.stats
        assert stats.accepted > 0 and stats.drafted > stats.accepted  # drafts kept and replaced
    moved = [i for i, (g, w) in enumerate(zip(got, want, strict=True)) if g != w]
    assert not moved, f"requests {moved} changed with their company"


def test_the_default_engine_samples_alike_beside_twins_and_drafts(smollm_prompts, loaded_default):
    """Seeded sampling in the default engine where it is not float32: 16 seeded requests alone,
    then twice each at once with n-gram drafts verified on their rows (the drafts' rows go
    through the blocks as decodes, the prompts' through the bf16 kernel)."""
    prompts = smollm_prompts[:16]
    knobs = {"dtype": str(loaded_default.dtype).removeprefix("torch."),
             "loaded_model": loaded_default,
             "quantized_activations": loaded_default.quantized_activations}  # fmt: skip
    alone = seeded(LLM(**knobs, max_num_seqs=1), prompts, None)
    llm = LLM(**knobs, num_speculative_tokens=3)
    got = seeded(llm, prompts + prompts, None)
    stats = llm.core.scheduler.speculation.stats
    assert stats.accepted > 0 and stats.drafted > stats.accepted
    moved = [i for i, (g, w) in enumerate(zip(got, alone + alone, strict=True)) if g != w]
    assert not moved, f"requests {moved} changed with their company"
