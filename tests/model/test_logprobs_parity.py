"""Logprobs against transformers where greedy tokens cannot tell: a transform of the logits that
keeps their order (Granite's divisor, Gemma 2's final soft cap) leaves every argmax as it was,
so the tiny models' greedy parity cannot see it; the first token's logprob after each prompt
can, and is held to transformers' log-softmax here, through the C++ layer loop and the
PyTorch reference."""

from __future__ import annotations

import pytest
import torch

from inflight import LLM, SamplingParams
from tests.parity import random_prompts


@pytest.mark.parametrize("attention_backend", ["auto", "torch"])
@pytest.mark.parametrize("arch", ["granite", "gemma2"])
def test_first_token_logprobs_are_transformers(tiny_model_factory, arch, attention_backend):
    from transformers import AutoModelForCausalLM

    folder = tiny_model_factory(arch)
    reference = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    prompts = random_prompts(reference.config.vocab_size, lengths=(2, 9, 30))
    want = []
    with torch.inference_mode():
        for prompt in prompts:
            logits = reference(torch.tensor([prompt])).logits[0, -1]
            logprobs = torch.log_softmax(logits.double(), dim=-1)
            want.append((int(logprobs.argmax()), float(logprobs.max())))
    llm = LLM(str(folder), dtype="float32", attention_backend=attention_backend)
    params = SamplingParams(temperature=0, max_tokens=1, logprobs=0)
    outputs = llm.generate(prompts, params, use_tqdm=False)
    got = [(o.outputs[0].token_ids[0], o.outputs[0].logprobs[0].logprob) for o in outputs]
    assert [t for t, _ in got] == [t for t, _ in want]
    for (_, ours), (_, theirs) in zip(got, want, strict=True):
        assert ours == pytest.approx(theirs, abs=1e-4)
    assert max(-lp for _, lp in want) > 0.1  # far from a certain token: the transform shows


def test_prompt_logprobs_are_transformers_through_chunks_preemption_and_the_cache(
    tiny_model_factory,
):
    """Every prompt token after the first is scored by the logits before it, as transformers
    scores it: with prompts split into chunks, preempted and computed again (scores kept once),
    and a twin prompt that the prefix cache holds (its prompt is computed, not taken)."""
    from transformers import AutoModelForCausalLM

    folder = tiny_model_factory("llama")
    reference = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    prompts = random_prompts(reference.config.vocab_size, lengths=(1, 9, 30, 70))
    prompts.append(list(prompts[-1]))  # the twin
    llm = LLM(str(folder), dtype="float32", kv_block_size=4, num_kv_blocks=40,
              max_num_batched_tokens=96, prefill_chunk_size=8,
              enable_prefix_caching=True)  # fmt: skip
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, prompt_logprobs=2)
    outputs = llm.generate(prompts, params, use_tqdm=False)
    assert llm.core.scheduler.num_preemptions > 0, "the pool was meant to force preemption"

    for prompt, out in zip(prompts, outputs, strict=True):
        with torch.inference_mode():
            logits = reference(torch.tensor([prompt])).logits[0, :-1]
        want = torch.log_softmax(logits.double(), dim=-1)
        got = out.prompt_logprobs
        assert got is not None and len(got) == len(prompt) and got[0] is None
        for position, (entry, token) in enumerate(zip(got[1:], prompt[1:], strict=True)):
            row = want[position]
            assert entry.token_id == token
            assert entry.logprob == pytest.approx(float(row[token]), abs=1e-4)
            assert entry.rank == int((row > row[token]).sum()) + 1
            assert [t for t, _ in entry.top] == row.topk(2).indices.tolist()
    pool = llm.core.kv_cache_manager.pool
    assert pool.num_free_blocks == pool.num_blocks


def test_prompt_logprobs_of_n_samples_come_once_and_leave_the_samples_alone(tiny_model_factory):
    folder = tiny_model_factory("llama")
    llm = LLM(str(folder), dtype="float32")
    prompt = random_prompts(400, lengths=(12,))[0]
    plain = llm.generate([prompt], SamplingParams(n=2, seed=5, max_tokens=8), use_tqdm=False)[0]
    scored = llm.generate(
        [prompt], SamplingParams(n=2, seed=5, max_tokens=8, prompt_logprobs=0), use_tqdm=False
    )[0]
    assert plain.prompt_logprobs is None
    assert [c.token_ids for c in scored.outputs] == [c.token_ids for c in plain.outputs]
    assert scored.prompt_logprobs is not None and len(scored.prompt_logprobs) == 12
    assert all(e.top == [] for e in scored.prompt_logprobs[1:])
