"""`int8_activations` on the real model stays close to the exact path on the parity prompts
(`inflight bench agreement` measures the same over 64 tokens; docs/benchmarks.md has those
figures, and the speed)."""

from __future__ import annotations

import pytest
import torch

from inflight import LLM
from inflight.bench.agreement import agreement, greedy
from inflight.kernels import load_extension
from inflight.model.packed_linear import can_pack
from inflight.workload.parity import parity_prompts

pytestmark = pytest.mark.skipif(
    not (
        load_extension().gguf_int8_linear_available()
        and can_pack(torch.float32, torch.device("cpu"))
    ),
    reason="no AVX2, FMA and F16C on this CPU",
)


def test_int8_activations_keep_the_first_tokens_of_the_exact_path(default_model):
    exact = LLM(str(default_model), dtype="float32")
    prompts = parity_prompts(exact.tokenizer)
    want = greedy(exact, prompts, 8)
    del exact
    fast = LLM(str(default_model), dtype="float32", int8_activations=True)
    got = greedy(fast, prompts, 8)
    result = agreement(want, got)
    assert result["first_token_agrees"] >= len(prompts) - 1, result
    assert result["share_before_first_difference"] >= 0.6, result
