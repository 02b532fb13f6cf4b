"""gpt-oss: its YaRN RoPE against transformers' own, its published config read, and its
attention sinks in the C++ kernels (the reference where a backend takes none). The tiny model's
greedy parity with transformers runs with every family's, in test_parity_tiny; its GGUF file,
MXFP4 experts included, in test_gguf."""

from __future__ import annotations

import json
import logging
import math
import shutil
from pathlib import Path

import pytest
import torch
from transformers import GptOssConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from inflight import LLM, SamplingParams
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
    not is replaced by the reference attention, and the log says so."""
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


def write_mxfp4_checkpoint(folder: Path, out: Path) -> Path:
    """The float gpt-oss folder as the published checkpoints hold it: each expert stack as
    `_blocks` (two FP4 codes a byte, the even element's low) and `_scales` (E8M0), quantized by
    the `gguf` package's MXFP4 quantizer and laid out HF's way; the config says mxfp4."""
    from gguf import GGMLQuantizationType
    from gguf.quants import quantize
    from safetensors.torch import load_file, save_file

    shutil.copytree(folder, out)
    weights = load_file(folder / "model.safetensors")
    for name in [n for n in weights if n.endswith(("experts.gate_up_proj", "experts.down_proj"))]:
        stack = weights.pop(name).transpose(1, 2).contiguous()  # [E, out, in]
        e, rows, cols = stack.shape
        raw = quantize(stack.reshape(-1, cols).numpy(), GGMLQuantizationType.MXFP4)
        gguf = torch.from_numpy(raw).view(e, rows, cols // 32, 17)
        codes = torch.cat([gguf[..., 1:] & 15, gguf[..., 1:] >> 4], dim=-1)  # in element order
        weights[f"{name}_blocks"] = (codes[..., 0::2] | (codes[..., 1::2] << 4)).contiguous()
        weights[f"{name}_scales"] = gguf[..., 0].contiguous()
    (out / "model.safetensors").unlink()
    save_file(weights, out / "model.safetensors")
    config = json.loads((out / "config.json").read_text())
    config["quantization_config"] = {
        "quant_method": "mxfp4",
        "modules_to_not_convert": [
            "model.layers.*.self_attn",
            "model.layers.*.mlp.router",
            "model.embed_tokens",
            "lm_head",
        ],
    }
    (out / "config.json").write_text(json.dumps(config))
    return out


def test_an_mxfp4_checkpoint_generates_as_transformers_and_keeps_its_experts_as_blocks(
    tiny_model_factory, tmp_path
):
    """The published checkpoints' MXFP4 experts: greedy tokens equal to transformers' over the
    same folder (which dequantizes them), exact and over the blocks; the experts multiply from
    their blocks, as a GGUF file's do, with no float copy."""
    from transformers import AutoModelForCausalLM

    from inflight.model.packed_linear import PackedLinear, blocks_serve_every_batch
    from tests.parity import hf_greedy, random_prompts

    folder = write_mxfp4_checkpoint(tiny_model_factory("gpt_oss"), tmp_path / "mxfp4")
    reference = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    prompts = random_prompts(reference.config.vocab_size, lengths=(2, 9, 30, 64, 100))
    expected = hf_greedy(reference, prompts, [12] * len(prompts))
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    for knob in ("off", "auto"):
        llm = LLM(str(folder), dtype="float32", quantized_activations=knob)
        got = [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
        assert got == expected, knob
        experts = [m for layer in llm.core.loaded.model.layers for m in layer.experts.modules()
                   if isinstance(m, PackedLinear)]  # fmt: skip
        blocks = knob == "auto" and blocks_serve_every_batch(torch.float32, 16)
        assert len(experts) == 16 and all(m.blocks_only == blocks for m in experts)


def test_mxfp4_checkpoint_bytes_become_gguf_blocks_of_the_same_values():
    """Every code and exponent (subnormal scales and 2^127 among them): the GGUF blocks
    dequantize to transformers' values of the checkpoint's bytes (equal as numbers: its code 8 is
    -0.0, ggml's +0.0)."""
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    from inflight.model.gguf_blocks import dequantize
    from inflight.model.mxfp4 import to_gguf_blocks

    gen = torch.Generator().manual_seed(0)
    blocks = torch.randint(0, 256, (2, 3, 256, 16), dtype=torch.uint8, generator=gen)
    scales = torch.arange(2 * 3 * 256, dtype=torch.int64).remainder(256).to(torch.uint8)
    scales = scales.view(2, 3, 256)
    want = convert_moe_packed_tensors(blocks, scales, dtype=torch.float32).transpose(1, 2)
    got = dequantize(to_gguf_blocks(blocks, scales))  # [2, 3, 256 x 32]
    assert torch.equal(got, want) and want.isinf().any()
    with pytest.raises(ValueError, match="do not pair"):
        to_gguf_blocks(blocks, scales[..., 1:])
