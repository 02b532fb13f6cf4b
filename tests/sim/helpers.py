"""Hand-sized profiles for simulator tests: round numbers so expected times are easy sums."""

from __future__ import annotations

from inflight.model.arch import LlamaArchConfig
from inflight.sim.hardware import HardwareProfile
from inflight.sim.model_profile import ModelProfile


def toy_model(sliding_window: int | None = None) -> ModelProfile:
    """2 layers, hidden 4, 2 heads (1 KV head) of 2, MLP 8, vocab 10, tied."""
    arch = LlamaArchConfig(
        architecture="mistral" if sliding_window else "llama", vocab_size=10, hidden_size=4,
        intermediate_size=8, num_layers=2, num_heads=2, num_kv_heads=1, head_dim=2,
        rms_norm_eps=1e-5, rope_theta=1e4, max_position_embeddings=1024,
        tie_word_embeddings=True, sliding_window=sliding_window,
    )  # fmt: skip
    return ModelProfile("toy", arch, "bf16", "bf16")


def toy_hardware(**changes) -> HardwareProfile:
    """1 kB/s, 1 kFLOP/s, 1 MB of memory; overrides for efficiencies and overheads."""
    base = HardwareProfile("toy", memory_bytes=10**6, memory_bw=1e3, flops={"bf16": 1e3},
                           host_link_bw=1e2, source="test")  # fmt: skip
    return base.with_overrides(**changes)


def overhead_only(step_s: float = 1.0) -> HardwareProfile:
    """Every step takes `step_s` (device time negligible): schedules in whole seconds."""
    return HardwareProfile("clock", 10**12, 1e30, {"bf16": 1e30}, 1e30, "test",
                           step_overhead_s=step_s)  # fmt: skip
