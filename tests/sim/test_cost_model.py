"""The cost model and model profiles against hand-computed examples."""

from __future__ import annotations

import dataclasses

import pytest

from inflight.core.outputs import ScheduledRequest, SchedulerOutput
from inflight.sampling_params import SamplingParams
from inflight.sim.cost_model import (
    CostModel,
    StepWork,
    model_step_work,
    step_amounts,
    step_work,
)
from inflight.sim.hardware import PROFILES
from inflight.sim.model_profile import load_model_profile
from tests.sim.helpers import toy_hardware, toy_model


def scheduled(start: int, n: int, sample: bool = True) -> ScheduledRequest:
    return ScheduledRequest("r", [0] * n, start, [], sample, SamplingParams(), [], [])


def test_toy_model_counts():
    m = toy_model()
    # q 4x4, k and v 4x2 each, o 4x4, MLP 3 x 4x8 = 16 + 16 + 16 + 96 = 144 per layer
    assert m.linear_params == m.active_linear_params == 288
    assert m.head_params == 40 and m.num_params == 328  # tied: the head is the embedding
    assert m.kv_bytes_per_token == 2 * 2 * 1 * 2 * 2  # K and V, 2 layers, 1 head of 2, bf16
    assert m.step_weight_bytes(1) == m.step_weight_bytes(64) == (288 + 40) * 2
    assert m.step_weight_bytes(0) == 0
    assert m.attention_flops_per_pair == 4 * 2 * 2 * 2


@pytest.mark.parametrize(
    ("preset", "weights", "hf_count", "kv_per_token"),
    [
        # HF's parameter counts include the RMSNorm weights (2 per layer + the final one).
        ("llama-3.3-70b", "bf16", 70_553_706_496, 327_680),
        ("smollm2-135m", "bf16", 134_515_008, 23_040),
    ],
)
def test_presets_match_published_parameter_counts(preset, weights, hf_count, kv_per_token):
    m = load_model_profile(preset, weights)
    norms = (2 * m.arch.num_layers + 1) * m.arch.hidden_size
    assert m.num_params + norms == hf_count
    assert m.kv_bytes_per_token == kv_per_token


def test_quantized_weights_keep_embedding_and_head_in_16_bits():
    fp8 = load_model_profile("llama-3.3-70b", "fp8")
    head = 128256 * 8192
    assert fp8.weight_bytes_total == fp8.linear_params + 2 * head * 2
    int4 = load_model_profile("llama-3.3-70b", "int4")
    assert int4.step_weight_bytes(1) == pytest.approx(int4.linear_params * 0.515625 + head * 2)
    assert int4.compute_dtype == "bf16" and fp8.compute_dtype == "fp8"


def test_step_work_counts_causal_pairs_and_context():
    out = SchedulerOutput(scheduled=[scheduled(4, 3, sample=False), scheduled(9, 1)],
                          swap_out=[(1, 2)], swap_in=[(3, 4), (5, 6)])  # fmt: skip
    work = step_work(out)
    # chunk at 4..6: queries attend to 5, 6, 7 keys = 18 pairs; the decode at 9 attends to 10
    assert work == StepWork(num_tokens=4, num_seqs=2, num_sampled=1, kv_read_tokens=7 + 10,
                            attention_pairs=18 + 10, swapped_blocks=3)  # fmt: skip


def test_sliding_window_caps_attention():
    work = step_work(SchedulerOutput(scheduled=[scheduled(100, 1), scheduled(100, 4)]), 8)
    assert work.attention_pairs == 8 + 4 * 8
    assert work.kv_read_tokens == 8 + (8 + 3)


def test_a_window_over_some_layers_caps_their_share():
    """Gemma 3: five windowed layers in six; a decode at 100 attends 101 keys in the global
    layer and 8 in the others."""
    arch = dataclasses.replace(toy_model(8).arch, num_layers=6, full_attention_layers=(5,))
    assert arch.windowed_fraction == pytest.approx(5 / 6)
    work = model_step_work(SchedulerOutput(scheduled=[scheduled(100, 1)]), arch)
    assert work.attention_pairs == pytest.approx((5 * 8 + 101) / 6)
    assert work.kv_read_tokens == pytest.approx((5 * 8 + 101) / 6)
    assert toy_model().arch.windowed_fraction == 0.0


def test_step_time_roofline_and_serial():
    model = toy_model()
    work = StepWork(num_tokens=2, num_seqs=2, num_sampled=1, kv_read_tokens=10,
                    attention_pairs=6, swapped_blocks=1)  # fmt: skip
    weight_bytes = (288 + 40) * 2  # 656
    kv_bytes = (10 + 2) * 16  # 192
    flops = 2 * 288 * 2 + 2 * 40 * 1 + 32 * 6  # 1424
    swap_s = 16 * 16 / 1e2  # one block of 16 tokens x 16 bytes over 100 B/s
    roofline = CostModel(toy_hardware(), model, block_size=16).cost(work)
    assert (roofline.weight_bytes, roofline.kv_bytes, roofline.flops) == (
        weight_bytes, kv_bytes, flops)  # fmt: skip
    assert roofline.seconds == pytest.approx(max(0.848, 1.424) + swap_s)
    serial = CostModel(
        toy_hardware(combine="sum", step_overhead_s=0.5, seq_overhead_s=0.25,
                     kv_bw_efficiency=0.5, compute_efficiency=0.5), model, 16,
    ).cost(work)  # fmt: skip
    assert serial.seconds == pytest.approx(0.5 + 2 * 0.25 + 0.656 + 0.384 + 2.848 + swap_s)


def test_fp8_on_a100_runs_at_the_bf16_peak():
    model = load_model_profile("llama-3.1-8b", "fp8")
    assert CostModel(PROFILES["a100-80gb"], model, 16).peak == 312e12
    assert CostModel(PROFILES["h100-sxm"], model, 16).peak == 1979e12


def test_empty_step_costs_only_overhead():
    cost = CostModel(toy_hardware(step_overhead_s=0.1), toy_model(), 16).cost(StepWork())
    assert cost.seconds == pytest.approx(0.1) and cost.weight_bytes == 0


def hf_linear_weights(folder) -> int:
    """transformers' weights of a model's linear maps (2-D or stacked experts' 3-D), without
    the embedding, the LM head, the convolutions' kernels and biases."""
    import torch
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    skipped = ("embed_tokens", "lm_head", "bias")
    kernels = (".conv.conv.weight", ".conv1d.weight")  # (LFM2's, Qwen3.5's)
    return sum(p.numel() for name, p in hf.named_parameters()
               if p.dim() >= 2 and not any(s in name for s in skipped)
               and not name.endswith(kernels))  # fmt: skip


@pytest.mark.parametrize(
    "family",
    ["llama", "arcee", "lfm2", "lfm2_moe", "qwen3_moe", "qwen2_moe", "glm4_moe", "deepseek_v2",
     "qwen3_5", "qwen3_5_moe"],
)  # fmt: skip
def test_the_profile_counts_each_familys_layers_as_transformers_holds_them(
    tiny_model_factory, family
):
    """Every layer kind (attention with and without an output gate, latent attention, LFM2's
    convolutions, Qwen3.5's DeltaNet layers; gated, ungated and sparse MLPs with their routers
    and shared experts): the profile's linear weights are transformers' (every expert), and its
    KV bytes a token the engine's. A token multiplies its experts_per_token of each sparse
    layer's experts; a step of many tokens reads nearly all of them, one token its own."""
    from inflight import LLM
    from inflight.sim.model_profile import ModelProfile

    folder = tiny_model_factory(family)
    llm = LLM(str(folder), dtype="float32", num_kv_blocks=16)
    arch = llm.core.arch
    profile = ModelProfile(f"tiny-{family}", arch, weight_dtype="fp32", kv_dtype="fp32")
    assert profile.linear_params == hf_linear_weights(folder)
    cache = llm.core.kv_cache
    assert profile.kv_bytes_per_token == cache.num_bytes // (16 * cache.block_size)
    sparse = [i for i in range(arch.num_layers) if arch.num_experts and i not in arch.dense_layers]
    expert = 3 * arch.hidden_size * arch.expert_intermediate_size
    unused = (arch.num_experts - arch.experts_per_token) * expert * len(sparse)
    assert profile.active_linear_params == profile.linear_params - unused
    one, many = profile.step_weight_bytes(1), profile.step_weight_bytes(10_000)
    assert one == pytest.approx(many - unused * 4)
    embedding = 0 if arch.tie_word_embeddings else profile.head_bytes
    assert many == pytest.approx(profile.weight_bytes_total - embedding)
    # a sequence's state (convolution inputs, DeltaNet matrices) as the runner holds it, its
    # rows a seat's, the saved states', a zero and a scratch row; read and written each step
    state = llm.core.runner.conv_state
    if state is None:
        assert profile.sequence_state_bytes == 0
    else:
        rows = llm.core.config.scheduler.max_num_seqs + state.num_snapshots + 2
        assert state.num_bytes == rows * profile.sequence_state_bytes > 0
    _, moved, _ = step_amounts(profile, StepWork(num_tokens=3, num_seqs=3, kv_read_tokens=30))
    assert moved == 33 * profile.kv_bytes_per_token + 6 * profile.sequence_state_bytes
