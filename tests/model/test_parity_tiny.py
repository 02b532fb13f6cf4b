"""Token-for-token greedy parity with transformers on tiny random Llama, Qwen2 and Mistral models.

16 prompts of mixed lengths run together in one batch; then with a prefill chunk so small that
every prompt is chunked; with each attention backend; and, on one architecture, with a KV pool
so small that preemption must happen (or, with whole-length reservations, admission must
wait), one at a time, in static-batching mode and under each policy. Every run must reproduce
transformers' one-at-a-time greedy output exactly.
"""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from inflight import LLM, SamplingParams
from tests.conftest import TINY_ARCHS
from tests.parity import hf_greedy, mixed_max_tokens, random_prompts

ENGINE_SETTINGS = {
    "one_batch": {},
    "chunked_prefill": {"prefill_chunk_size": 8, "max_num_batched_tokens": 64},
    "preemption": {"kv_block_size": 4, "num_kv_blocks": 40, "max_num_batched_tokens": 96},
    # swap preemption: ample swap space, then 8 CPU blocks (1 KiB each) so some recompute
    "preemption_swap": {
        "kv_block_size": 4,
        "num_kv_blocks": 40,
        "max_num_batched_tokens": 96,
        "preemption_mode": "swap",
    },
    "preemption_swap_small": {
        "kv_block_size": 4,
        "num_kv_blocks": 40,
        "max_num_batched_tokens": 96,
        "preemption_mode": "swap",
        "swap_space_bytes": 8192,
    },
    "predictive_admission": {
        "kv_block_size": 4,
        "num_kv_blocks": 40,
        "max_num_batched_tokens": 96,
        "predictive_admission": True,
        "prediction_horizon": 16,
    },
    # whole-length reservations, borrowed early from requests about to end
    "reserve_predictive": {
        "kv_block_size": 4,
        "num_kv_blocks": 40,
        "max_num_batched_tokens": 96,
        "kv_admission": "reserve",
        "predictive_admission": True,
        "prediction_horizon": 16,
    },
    "one_at_a_time": {"max_num_seqs": 1},
    # the pure-PyTorch attention and layer ops (the default on a CPU is the C++ kernels)
    "torch_reference": {"attention_backend": "torch"},
    "torch_reference_chunked": {
        "attention_backend": "torch",
        "prefill_chunk_size": 8,
        "max_num_batched_tokens": 64,
    },
    # decodes by the Triton kernel (under Triton's interpreter without a GPU), small blocks
    "triton_decode": {"attention_backend": "triton", "kv_block_size": 4},
    # static batching: 4 batches of 4, each admitted only once the previous one is done
    "static_batches": {"batching": "static", "max_num_seqs": 4},
    # other admission orders (and priority preemptions), same tokens
    "priority_policy": {"scheduling_policy": "priority", "max_num_seqs": 4},
    "sjf_policy": {"scheduling_policy": "sjf", "max_num_seqs": 4},
    # windowed layers giving their blocks back while requests are preempted (recomputed or
    # swapped) or admitted on a prediction: pages of one layer's block, 200 for ~800 wanted
    "windowed_preemption": {"kv_block_size": 4, "num_kv_blocks": 200,
                            "max_num_batched_tokens": 96},
    "windowed_preemption_swap": {"kv_block_size": 4, "num_kv_blocks": 200,
                                 "max_num_batched_tokens": 96, "preemption_mode": "swap"},
    "windowed_predictive": {"kv_block_size": 4, "num_kv_blocks": 200,
                            "max_num_batched_tokens": 96, "predictive_admission": True,
                            "prediction_horizon": 16},
}  # fmt: skip


@pytest.fixture(scope="module", params=TINY_ARCHS)
def reference(request, tiny_model_factory):
    folder = tiny_model_factory(request.param)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    prompts = random_prompts(model.config.vocab_size)
    max_tokens = mixed_max_tokens(len(prompts))
    expected = hf_greedy(model, prompts, max_tokens)
    assert len({tuple(x) for x in expected}) > 8, "the reference must not be degenerate"
    return request.param, folder, prompts, max_tokens, expected


# Settings that change only which tokens run in which step (admission, preemption, policies),
# never how a layer computes them: one architecture covers them, as the scheduler's own tests
# and the simulator's parity test cover the schedules. (Prompt chunks and attention backends do
# change the computation, so they run on every architecture.)
SCHEDULING_ONLY = {
    "preemption", "preemption_swap", "preemption_swap_small", "predictive_admission",
    "reserve_predictive", "one_at_a_time", "static_batches", "priority_policy", "sjf_policy",
}  # fmt: skip
SCHEDULING_ARCH = "llama"
# The same with KV groups: Gemma 3's (one full group beside five windowed ones) and Mistral's
# (one windowed group)
WINDOWED_SCHEDULING = {"windowed_preemption", "windowed_preemption_swap", "windowed_predictive"}
WINDOWED_ARCHS = ("gemma3", "mistral")
# pages of Mistral's 2 layers: a request holds at most 31 (its window of 24 and a chunk of 96)
WINDOWED_POOLS = {"mistral": {"num_kv_blocks": 40}}
# Families that differ from Llama in their MLP alone (experts): the attention backends'
# settings compute nothing else for them, and Llama's runs cover those
MLP_ONLY_ARCHS = ("qwen3_moe", "mixtral", "qwen2_moe", "ernie4_5_moe", "dots1", "hunyuan_moe",
                  "granitemoe")  # fmt: skip
ATTENTION_SETTINGS = {"torch_reference", "torch_reference_chunked", "triton_decode"}

# Under Triton's interpreter a run takes minutes on a small CPU: only on mistral, whose
# sliding window (24) leaves some prompts inside it and some beyond, and only the first
# `INTERPRETED_MAX_TOKENS` tokens of each output (greedy outputs are prefixes of longer ones;
# 8 steps still take a 17-token prompt across the window). test_attention checks the kernels
# on every shape with and without a window.
INTERPRETED_ARCHS = ("mistral",)
INTERPRETED_MAX_TOKENS = 8


@pytest.mark.parametrize(
    "setting",
    [
        pytest.param(s, marks=pytest.mark.slow) if s == "triton_decode" else s
        for s in ENGINE_SETTINGS
    ],
)
def test_greedy_parity_with_transformers(reference, setting):
    arch, folder, prompts, max_tokens, expected = reference
    if setting in SCHEDULING_ONLY and arch != SCHEDULING_ARCH:
        pytest.skip(f"a scheduling-only setting: {SCHEDULING_ARCH} covers it")
    if setting in WINDOWED_SCHEDULING and arch not in WINDOWED_ARCHS:
        pytest.skip(f"a scheduling setting of KV groups: {', '.join(WINDOWED_ARCHS)} cover it")
    on_gpu = torch.cuda.is_available()  # there the setting runs the experts on the GPU too
    if setting in ATTENTION_SETTINGS and arch in MLP_ONLY_ARCHS and not on_gpu:
        pytest.skip("an attention backend's setting: the Llama-attention families cover it")
    interpreted = setting == "triton_decode" and not on_gpu
    if interpreted and arch not in INTERPRETED_ARCHS:
        pytest.skip("Triton's interpreter: mistral covers its attention")
    if interpreted:  # every fourth prompt: still some inside the window (24) and some beyond
        prompts, max_tokens, expected = prompts[::4], max_tokens[::4], expected[::4]
        assert min(map(len, prompts)) < 24 < max(map(len, prompts))
        max_tokens = [min(n, INTERPRETED_MAX_TOKENS) for n in max_tokens]
        expected = [want[:n] for want, n in zip(expected, max_tokens, strict=True)]
    knobs = ENGINE_SETTINGS[setting]
    if setting in WINDOWED_SCHEDULING:
        knobs = {**knobs, **WINDOWED_POOLS.get(arch, {})}
    llm = LLM(str(folder), dtype="float32", **knobs)
    params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in max_tokens]
    priority = [i % 3 for i in range(len(prompts))]  # only the priority policy looks at it
    outputs = llm.generate(prompts, params, use_tqdm=False, priority=priority)

    for i, (out, want) in enumerate(zip(outputs, expected, strict=True)):
        assert out.outputs[0].token_ids == want, f"prompt {i} (len {len(prompts[i])}) diverged"
        assert out.outputs[0].finish_reason == "length"
    scheduler = llm.core.scheduler
    if setting.startswith(("preemption", "windowed_preemption")):
        assert scheduler.num_preemptions > 0, "the pool was meant to force preemption"
    if setting in WINDOWED_SCHEDULING:  # the windowed layers gave pages back
        assert llm.core.kv_cache_manager.num_window_releases > 0
    if setting == "preemption_swap":
        assert scheduler.num_swaps == scheduler.num_preemptions
    if setting in ("predictive_admission", "reserve_predictive"):
        assert scheduler.admission.stats.predictive_admissions > 0
    if setting == "reserve_predictive":
        assert scheduler.num_preemptions == scheduler.admission.stats.prediction_failures
    if setting == "preemption_swap_small":
        assert 0 < scheduler.num_swaps < scheduler.num_preemptions
    pool = llm.core.kv_cache_manager.pool
    assert pool.num_free_blocks == pool.num_blocks
