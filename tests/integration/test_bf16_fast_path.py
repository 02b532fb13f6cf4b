"""The bfloat16 CPU fast path on the real model: packed oneDNN linears, fused C++ layer ops and
the attention kernels. Every parity test runs float32; this checks that the serving default
(bf16) still computes the same model, against the float32 pure-PyTorch reference engine."""

from __future__ import annotations

import pytest
import torch

from inflight import LLM, SamplingParams
from inflight.model.layer_ops import CpuLayerOps
from inflight.model.packed_linear import PackedLinear, can_pack
from inflight.workload.parity import RAW_PROMPTS

pytestmark = pytest.mark.skipif(
    not can_pack(torch.bfloat16, torch.device("cpu")), reason="no oneDNN bf16 on this CPU"
)


def first_token_logprobs(llm: LLM) -> list:
    params = SamplingParams(temperature=0, max_tokens=1, logprobs=5, ignore_eos=True)
    return [out.outputs[0].logprobs[0] for out in llm.generate(RAW_PROMPTS, params, use_tqdm=False)]


def test_bf16_kernels_predict_like_the_float32_reference(default_model):
    fast = LLM(str(default_model), dtype="bfloat16")
    model = fast.core.loaded.model
    assert isinstance(model.ops, CpuLayerOps)
    assert isinstance(model.layers[0].qkv_proj, PackedLinear)
    assert isinstance(model.lm_head, PackedLinear)
    got = first_token_logprobs(fast)
    del fast
    want = first_token_logprobs(LLM(str(default_model), dtype="float32", attention_backend="torch"))

    # prompts up to ~350 tokens: several query and key tiles in the prefill kernel
    same_top = sum(g.token_id == w.token_id for g, w in zip(got, want, strict=True))
    assert same_top >= len(RAW_PROMPTS) - 1, "bf16 rounding may flip at most one near-tie"
    for g, w in zip(got, want, strict=True):
        reference = dict(w.top)
        assert g.token_id in reference, "the bf16 choice is among float32's top 5"
        assert abs(g.logprob - reference[g.token_id]) < 0.25
