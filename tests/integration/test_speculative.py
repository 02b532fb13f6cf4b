"""Speculative decoding on the real default model, on prompts it copies from: greedy tokens are
those of decoding one at a time, through preemption and prefix caching, and most drafts are
kept."""

from __future__ import annotations

import pytest

from inflight import LLM, SamplingParams
from inflight.workload.requests import named

pytestmark = pytest.mark.integration


def test_greedy_speculation_keeps_the_tokens_and_most_drafts(default_model):
    knobs = {"max_num_seqs": 4, "num_kv_blocks": 40, "enable_prefix_caching": True}
    plain = LLM(str(default_model), **knobs)
    workload = named("edit", plain.tokenizer, num_requests=5)
    prompts = [r.prompt_token_ids for r in workload]
    params = [SamplingParams(temperature=0, max_tokens=min(r.max_tokens, 48), ignore_eos=True)
              for r in workload]  # fmt: skip
    want = [o.outputs[0].token_ids for o in plain.generate(prompts, params, use_tqdm=False)]
    spec = LLM(str(default_model), loaded_model=plain.core.loaded, num_speculative_tokens=4,
               **knobs)  # fmt: skip
    got = [o.outputs[0].token_ids for o in spec.generate(prompts, params, use_tqdm=False)]
    assert got == want
    speculation = spec.core.scheduler.speculation
    assert speculation.stats.accepted > speculation.stats.drafted / 2
    assert spec.core.scheduler.num_preemptions > 0, "the pool was meant to bind"
    assert spec.core.kv_cache_manager.pool.num_used_blocks == 0
