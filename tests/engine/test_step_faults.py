"""A step that fails on one request ends that request alone; the model failing stops the engine.

Faults are injected with the runner's test-only `fault_hook`, which sees every request of a batch
before its forward pass (and again when the batch is split to find the culprit).
"""

from __future__ import annotations

import pytest
import torch

from inflight import LLM, SamplingParams
from inflight.core.outputs import ScheduledRequest
from inflight.errors import ModelFailedError
from inflight.runner import sampler as sampler_module
from inflight.runner.sampler import Sampler
from tests.runner.test_sampler import logits_of, req

GREEDY = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
POISON = [7, 7, 7, 7, 7, 7, 7, 7, 7]  # the prompt whose processing the hook breaks


@pytest.fixture(scope="module")
def llm(tiny_llama) -> LLM:
    return LLM(str(tiny_llama), dtype="float32", max_model_len=128, num_kv_blocks=64)


def prompts() -> list[list[int]]:
    return [[5 + i, 20 + 3 * i, 40 + i, 60 + 2 * i][: 2 + i % 3] for i in range(16)]


@pytest.mark.parametrize("fail_at_output", [0, 4])  # in the prompt's step, or mid-decode
def test_a_poisoned_request_fails_alone_and_the_others_keep_their_tokens(llm, fail_at_output):
    alone = [llm.generate([p], GREEDY, use_tqdm=False)[0].outputs[0].token_ids for p in prompts()]

    def hook(s: ScheduledRequest) -> None:
        if s.prompt_token_ids == POISON and len(s.output_token_ids) == fail_at_output:
            raise RuntimeError("poisoned input")

    llm.core.runner.fault_hook = hook
    try:
        outs = llm.generate([*prompts()[:8], POISON, *prompts()[8:]], GREEDY, use_tqdm=False)
    finally:
        llm.core.runner.fault_hook = None
    poisoned = outs.pop(8).outputs[0]
    assert poisoned.finish_reason == "error"
    assert poisoned.stop_reason == "RuntimeError: poisoned input"
    assert len(poisoned.token_ids) == fail_at_output
    assert [o.outputs[0].token_ids for o in outs] == alone
    assert all(o.outputs[0].finish_reason == "length" for o in outs)
    assert llm.core.kv_cache_manager.pool.num_used_blocks == 0
    # the engine serves on
    assert llm.generate([prompts()[0]], GREEDY, use_tqdm=False)[0].outputs[0].token_ids == alone[0]


def test_a_model_that_fails_on_everything_stops_the_engine(tiny_llama):
    llm = LLM(str(tiny_llama), dtype="float32", max_model_len=128, num_kv_blocks=64)

    def broken(*args, **kwargs):
        raise RuntimeError("device lost")

    llm.core.runner.model = broken
    with pytest.raises(ModelFailedError, match="device lost"):
        llm.generate(prompts()[:3], GREEDY, use_tqdm=False)


def test_a_sampling_call_retried_after_a_failure_draws_what_a_clean_run_draws(monkeypatch):
    """Seeded draws are functions of (seed, output position), with no state for a failure
    to leave half-advanced: the retry samples the tokens of one clean run."""
    logits = logits_of([1.0] * 8, [1.0] * 8)
    batch = [req("a", temperature=1.0, seed=3), req("b", temperature=1.0, seed=4)]
    expected = Sampler(torch.device("cpu")).sample(logits, batch)[0]

    faulty = Sampler(torch.device("cpu"))
    calls = []

    def failing_logprobs(*args):
        calls.append(1)
        raise RuntimeError("late failure")

    with_logprobs = [req("a", temperature=1.0, seed=3, logprobs=1), batch[1]]
    monkeypatch.setattr(sampler_module, "token_logprobs", failing_logprobs)  # after the draws
    with pytest.raises(RuntimeError):
        faulty.sample(logits, with_logprobs)
    assert calls
    monkeypatch.undo()
    assert faulty.sample(logits, with_logprobs)[0] == faulty.sample(logits, batch)[0] == expected
