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
