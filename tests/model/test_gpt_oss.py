"""gpt-oss: its YaRN RoPE against transformers' own, its published config read, and its
attention sinks in the C++ kernels (the reference where a backend takes none). The tiny model's
greedy parity with transformers runs with every family's, in test_parity_tiny; its GGUF file,
MXFP4 experts included, in test_gguf."""

from __future__ import annotations

import logging
import math

import pytest
import torch
from transformers import GptOssConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from inflight import LLM
from inflight.attention.torch_ref import TorchReferenceBackend
from inflight.model.arch import LlamaArchConfig
from inflight.model.llama import rope_inv_freq

GPT_OSS_20B = {  # openai/gpt-oss-20b's config.json, as published
    "architectures": ["GptOssForCausalLM"], "attention_bias": True, "attention_dropout": 0.0,
    "eos_token_id": 200002, "experts_per_token": 4, "head_dim": 64, "hidden_act": "silu",
    "hidden_size": 2880, "initial_context_length": 4096, "initializer_range": 0.02,
    "intermediate_size": 2880, "layer_types": ["sliding_attention", "full_attention"] * 12,
    "max_position_embeddings": 131072, "model_type": "gpt_oss", "num_attention_heads": 64,
    "num_experts_per_tok": 4, "num_hidden_layers": 24, "num_key_value_heads": 8,
    "num_local_experts": 32, "output_router_logits": False, "pad_token_id": 199999,
    "rms_norm_eps": 1e-05, "rope_scaling": {"beta_fast": 32.0, "beta_slow": 1.0, "factor": 32.0,
    "original_max_position_embeddings": 4096, "rope_type": "yarn", "truncate": False},
    "rope_theta": 150000, "router_aux_loss_coef": 0.9, "sliding_window": 128,
    "swiglu_limit": 7.0, "tie_word_embeddings": False, "vocab_size": 201088,
}  # fmt: skip


def test_the_published_config_is_read():
    arch = LlamaArchConfig.from_hf_config(GPT_OSS_20B)
    assert arch.architecture == "gpt_oss"
    assert (arch.num_experts, arch.experts_per_token, arch.expert_intermediate_size) == (
        32,
        4,
        2880,
    )
    assert arch.dense_layers == () and arch.attention_sinks and arch.qkv_bias and arch.o_bias
    assert (arch.swiglu_limit, arch.swiglu_alpha) == (7.0, 1.702)
    assert [arch.layer_window(i) for i in range(4)] == [128, None, 128, None]
    assert arch.rope_scaling_dict["rope_type"] == "yarn"
    assert arch.rope_attention_factor == pytest.approx(0.1 * math.log(32) + 1)


@pytest.mark.parametrize("rope", [
    {"factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
     "original_max_position_embeddings": 4096},  # gpt-oss's
    {"factor": 4.0, "original_max_position_embeddings": 32768},  # Qwen's: truncated, defaults
    {"factor": 40.0, "mscale": 1.0, "mscale_all_dim": 0.707,
     "original_max_position_embeddings": 4096},  # DeepSeek's attention factor
    {"factor": 8.0, "attention_factor": 1.5, "original_max_position_embeddings": 64},
])  # fmt: skip
def test_yarn_frequencies_and_attention_factor_are_transformers_own(rope):
    hf = GptOssConfig(head_dim=64, rope_parameters={"rope_type": "yarn", "rope_theta": 150000.0,
                                                    **rope})  # fmt: skip
    want_freq, want_factor = ROPE_INIT_FUNCTIONS["yarn"](hf, "cpu")
    config = {
        **GPT_OSS_20B,
        "rope_scaling": None,
        "rope_theta": None,
        "rope_parameters": {"rope_type": "yarn", "rope_theta": 150000.0, **rope},
    }
    arch = LlamaArchConfig.from_hf_config(config)
    assert torch.equal(rope_inv_freq(arch), want_freq)
    assert arch.rope_attention_factor == pytest.approx(want_factor, rel=1e-12)


def test_sinks_run_the_cpu_kernels_and_a_backend_without_them_gets_the_reference(
    tiny_model_factory, caplog, monkeypatch
):
    """The C++ kernels take sinks (their tests hold them to the reference); a backend that does
    not (Triton's) is replaced by the reference attention, and the log says so."""
    from inflight.attention.cpu_kernel import CpuKernelBackend

    caplog.set_level(logging.INFO, "inflight.model.loader")
    llm = LLM(str(tiny_model_factory("gpt_oss")), dtype="float32", attention_backend="cpu")
    layer = llm.core.loaded.model.layers[0]
    assert isinstance(layer.attn, CpuKernelBackend) and layer.sinks is not None
    assert "attention sinks run" not in caplog.text
    monkeypatch.setattr(CpuKernelBackend, "takes_sinks", False)
    llm = LLM(str(tiny_model_factory("gpt_oss")), dtype="float32", attention_backend="cpu")
    assert isinstance(llm.core.loaded.model.layers[0].attn, TorchReferenceBackend)
    assert "attention sinks run the PyTorch reference attention" in caplog.text
