"""The cost model and model profiles against hand-computed examples."""

from __future__ import annotations

import dataclasses

import pytest

from inflight.core.outputs import ScheduledRequest, SchedulerOutput
from inflight.sampling_params import SamplingParams
from inflight.sim.cost_model import CostModel, StepWork, model_step_work, step_work
from inflight.sim.hardware import PROFILES
from inflight.sim.model_profile import load_model_profile
from tests.sim.helpers import toy_hardware, toy_model


def scheduled(start: int, n: int, sample: bool = True) -> ScheduledRequest:
    return ScheduledRequest("r", [0] * n, start, [], sample, SamplingParams(), [], [])


def test_toy_model_counts():
    m = toy_model()
    # q 4x4, k and v 4x2 each, o 4x4, MLP 3 x 4x8 = 16 + 16 + 16 + 96 = 144 per layer
    assert m.linear_params_per_layer == 144 and m.linear_params == 288
    assert m.head_params == 40 and m.num_params == 328  # tied: the head is the embedding
    assert m.kv_bytes_per_token == 2 * 2 * 1 * 2 * 2  # K and V, 2 layers, 1 head of 2, bf16
    assert m.weight_bytes_per_step == (288 + 40) * 2
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
    assert int4.weight_bytes_per_step == pytest.approx(int4.linear_params * 0.515625 + head * 2)
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


def test_a_short_convolution_model_is_counted_layer_by_layer(tiny_model_factory):
    """LFM2's convolution layers hold in (3H) and out (H) projections and no KV: the profile
    counts transformers' linear weights of the model and the engine's KV bytes a token."""
    import torch
    from transformers import AutoModelForCausalLM

    from inflight import LLM
    from inflight.sim.model_profile import ModelProfile

    folder = tiny_model_factory("lfm2")
    hf = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    linears = sum(m.weight.numel() for name, m in hf.named_modules()
                  if isinstance(m, torch.nn.Linear) and name != "lm_head")  # fmt: skip
    llm = LLM(str(folder), dtype="float32", num_kv_blocks=16)
    profile = ModelProfile("tiny-lfm2", llm.core.arch, weight_dtype="fp32", kv_dtype="fp32")
    assert profile.linear_params == linears
    cache = llm.core.kv_cache
    assert profile.kv_bytes_per_token == cache.num_bytes // (16 * cache.block_size)
