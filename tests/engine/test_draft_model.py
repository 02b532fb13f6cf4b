"""Draft-model speculation: greedy output is the non-speculative output token for token
(preemption by recompute and by swap, prefix caching on), a target drafting for itself has
every draft kept (so the drafter's lazily filled KV is right), and a draft model that cannot
share the target's tokens is refused."""

from __future__ import annotations

import pytest

from inflight import LLM, SamplingParams
from inflight.core.speculation import StepCostFit
from inflight.errors import ConfigError
from inflight.runner.kv_cache import kv_bytes_per_token
from tests.conftest import build_tiny_model
from tests.engine.test_speculative import generate, repetitive_prompts

BASE = {"dtype": "float32", "max_num_seqs": 6, "enable_prefix_caching": True}


@pytest.fixture(autouse=True)
def always_draft(monkeypatch):
    """These tests are about the drafts' tokens and KV, so every step drafts: on tiny models a
    drafter pass costs about what a step does, and the cost rule (its own test in
    test_speculative.py) would turn drafting off."""
    monkeypatch.setattr(StepCostFit, "break_even_rate", lambda self: 0.0)


BINDING = {"num_kv_blocks": 40, "kv_block_size": 4}  # a pool that binds: preemption


def greedy_params(count: int) -> list[SamplingParams]:
    return [SamplingParams(temperature=0, max_tokens=20 + i, ignore_eos=True)
            for i in range(count)]  # fmt: skip


@pytest.mark.parametrize("knobs", [
    {},
    BINDING,
    {**BINDING, "preemption_mode": "swap"},
])  # fmt: skip
def test_greedy_tokens_are_unchanged_by_a_draft_model(tiny_model_factory, knobs):
    target, draft = tiny_model_factory("llama"), tiny_model_factory("llama3_rope")
    plain = LLM(str(target), **BASE, **knobs)
    prompts = repetitive_prompts(plain.vocab_size)
    params = greedy_params(len(prompts))
    want = generate(plain, prompts, params)
    spec = LLM(str(target), num_speculative_tokens=3, speculative_model=str(draft), **BASE, **knobs)
    assert generate(spec, prompts, params) == want
    speculation = spec.core.scheduler.speculation
    assert speculation.stats.drafted > 0
    if knobs:
        assert spec.core.scheduler.num_preemptions > 0, "the pool was meant to bind"
    assert spec.core.kv_cache_manager.pool.num_used_blocks == 0
    if knobs.get("preemption_mode") == "swap":  # swap space holds the target's KV alone
        core = spec.core
        per_block = kv_bytes_per_token(core.arch, core.dtype) * BINDING["kv_block_size"]
        swap_bytes = core.config.cache.swap_space_bytes
        assert core.kv_cache.cpu_slots[0][0].shape[0] == swap_bytes // per_block


@pytest.mark.parametrize("knobs", [{}, BINDING])
def test_a_model_drafting_for_itself_has_every_draft_kept(tiny_llama, knobs):
    """Its drafts are its own greedy tokens, if the drafter's KV holds every token before them
    at the right slot; a token skipped or misplaced shows as a rejected draft."""
    llm = LLM(str(tiny_llama), num_speculative_tokens=4, speculative_model=str(tiny_llama),
              **BASE, **knobs)  # fmt: skip
    prompts = repetitive_prompts(llm.vocab_size)
    generate(llm, prompts, greedy_params(len(prompts)))
    speculation = llm.core.scheduler.speculation
    assert speculation.stats.drafted > 50
    assert speculation.stats.accepted == speculation.stats.drafted
    if knobs:
        assert llm.core.scheduler.num_preemptions > 0


def test_sampled_requests_draft_and_finish(tiny_model_factory):
    target, draft = tiny_model_factory("llama"), tiny_model_factory("llama3_rope")
    llm = LLM(str(target), num_speculative_tokens=2, speculative_model=str(draft), **BASE)
    params = SamplingParams(temperature=0.8, max_tokens=16, ignore_eos=True, seed=3)
    outputs = generate(llm, repetitive_prompts(llm.vocab_size, 6), params)
    assert [len(o) for o in outputs] == [16] * 6
    assert all(0 <= t < llm.vocab_size for o in outputs for t in o)
    assert llm.core.scheduler.speculation.stats.drafted > 0


def test_a_draft_model_needs_draft_tokens(tiny_llama):
    with pytest.raises(ConfigError, match="num_speculative_tokens"):
        LLM(str(tiny_llama), speculative_model=str(tiny_llama))
    with pytest.raises(ConfigError, match="speculative_model must be a path"):
        LLM(str(tiny_llama), num_speculative_tokens=2, speculative_model=7)


def test_a_draft_model_with_another_vocabulary_is_refused(tiny_llama, tmp_path):
    target_vocab = LLM(str(tiny_llama), dtype="float32").vocab_size
    other = build_tiny_model(tmp_path, "llama", vocab_size=target_vocab + 8)
    with pytest.raises(ConfigError, match="must share its tokenizer"):
        LLM(str(tiny_llama), num_speculative_tokens=2, speculative_model=str(other))
