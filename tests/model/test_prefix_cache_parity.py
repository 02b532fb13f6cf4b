"""Prefix caching changes no token: requests sharing a long prefix, with the cache on and off,
against transformers, and a second pass that starts from cached blocks."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from inflight import LLM, SamplingParams
from tests.parity import assert_same_outputs, greedy_outputs, hf_greedy, random_prompts


def test_shared_prefixes_match_transformers_with_and_without_the_cache(tiny_model_factory):
    folder = tiny_model_factory("llama")
    reference = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    prefix = random_prompts(reference.config.vocab_size, lengths=(45,), seed=5)[0]
    suffixes = random_prompts(reference.config.vocab_size, lengths=(1, 3, 8, 16, 19, 30), seed=6)
    prompts = [prefix + s for s in suffixes] + [prefix[:20], prefix]
    expected = hf_greedy(reference, prompts, [10] * len(prompts))
    params = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)

    for caching in (False, True):
        llm = LLM(str(folder), dtype="float32", kv_block_size=4, num_kv_blocks=256,
                  enable_prefix_caching=caching)  # fmt: skip
        first = llm.generate(prompts, params, use_tqdm=False)
        second = llm.generate(prompts, params, use_tqdm=False)  # now mostly cached
        assert [o.outputs[0].token_ids for o in first] == expected
        assert [o.outputs[0].token_ids for o in second] == expected
        kv = llm.core.kv_cache_manager
        if caching:
            assert kv.prefix_stats.hits > 0.5 * sum(len(p) for p in prompts)
        else:
            assert kv.prefix_stats.hits == 0 and kv.pool.num_cached_blocks == 0
        assert kv.pool.num_used_blocks == 0


@pytest.mark.parametrize("arch", ["llama", "gemma3", "deepseek_v3"])
def test_a_next_turn_is_the_uncached_one_bit_for_bit(tiny_model_factory, arch):
    """A conversation's next turn holds the last answer in its prompt: its blocks, computed as
    decodes, are not hits for it (a prompt row rounds otherwise), so its tokens and
    log-probabilities are those without the cache, bit for bit, and it hits the first prompt's
    full blocks alone; `reuse_decoded_kv` lets it hit the answer's too."""
    folder = str(tiny_model_factory(arch))
    firsts = random_prompts(400, lengths=(37, 50), seed=3)
    plain = LLM(folder, dtype="float32", enable_prefix_caching=False)
    hits = []
    for reuse in (False, True):
        llm = LLM(folder, dtype="float32", reuse_decoded_kv=reuse)
        first = greedy_outputs(llm, firsts, 21)
        seconds = [p + out[0] + [7, 8, 9] for p, out in zip(firsts, first, strict=True)]
        got, want = greedy_outputs(llm, seconds, 9), greedy_outputs(plain, seconds, 9)
        if not reuse:
            assert_same_outputs(got, want)
        hits.append(llm.core.kv_cache_manager.prefix_stats.hits)
    assert hits[0] == sum(len(p) // 16 * 16 for p in firsts) < hits[1]


def test_a_preempted_request_hits_the_blocks_it_decoded(tiny_model_factory):
    """Recomputed after a preemption, a request's outputs attend as decodes again: its own
    decoded blocks are hits for it, and its tokens and log-probabilities are those of a pool
    that never preempts."""
    folder = str(tiny_model_factory("llama"))
    prompts = random_prompts(400, lengths=(20, 24, 28, 32), seed=4)
    want = greedy_outputs(LLM(folder, dtype="float32"), prompts, 40)
    llm = LLM(folder, dtype="float32", kv_block_size=4, num_kv_blocks=40)
    kv = llm.core.kv_cache_manager
    lookup, past_prompt = kv.get_computed_blocks, []

    def recording(request):
        hit = lookup(request)
        past_prompt.append(hit.num_blocks * 4 > request.num_prompt_tokens)
        return hit

    kv.get_computed_blocks = recording
    assert_same_outputs(greedy_outputs(llm, prompts, 40), want)
    assert llm.core.scheduler.num_preemptions > 0
    assert any(past_prompt), "some hit reaches into its request's own outputs"
