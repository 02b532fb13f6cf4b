"""Prefix caching changes no token: requests sharing a long prefix, with the cache on and off,
against transformers, and a second pass that starts from cached blocks."""

from __future__ import annotations

import torch
from transformers import AutoModelForCausalLM

from inflight import LLM, SamplingParams
from tests.parity import hf_greedy, random_prompts


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
