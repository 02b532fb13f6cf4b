"""The Phi family's RoPE variants: partial rotary embeddings (Phi-4-mini rotates the first 3/4 of
each head, the rest passes through) and LongRoPE (per-frequency factors, short ones within the
original context and long ones past it, cos and sin scaled by its attention factor), from HF
configs and GGUF files, held to transformers token for token on each side of the original
context."""

from __future__ import annotations

import math

import pytest
import torch
from gguf import GGMLQuantizationType

from inflight import LLM, SamplingParams
from inflight.errors import ConfigError
from inflight.model.arch import LlamaArchConfig
from tests.gguf_files import write_tiny_gguf
from tests.parity import hf_greedy, random_prompts

ORIGINAL = 64  # the tiny phi4_mini's original context (tests/conftest.py)


def _greedy(llm: LLM, prompts: list[list[int]], n: int = 12) -> list[list[int]]:
    params = SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)
    return [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]


def test_published_phi_configs_are_read():
    """Phi-4-mini's config (transformers 5 spelling); Phi-3.5-mini's (transformers 4: LongRoPE
    under `rope_scaling`, the original context beside it), and the first 128k configs' `su`."""
    factors = [1.0 + i / 10 for i in range(48)]
    phi4_mini = {
        "architectures": ["Phi3ForCausalLM"], "vocab_size": 200064, "hidden_size": 3072,
        "intermediate_size": 8192, "num_hidden_layers": 32, "num_attention_heads": 24,
        "num_key_value_heads": 8, "max_position_embeddings": 131072,
        "rope_parameters": {"rope_type": "longrope", "rope_theta": 10000.0,
                            "partial_rotary_factor": 0.75, "short_factor": factors,
                            "long_factor": [2 * f for f in factors],
                            "original_max_position_embeddings": 4096},
    }  # fmt: skip
    arch = LlamaArchConfig.from_hf_config(phi4_mini)
    assert (arch.head_dim, arch.rotary_dim, arch.rope_dim) == (128, 96, 96)
    assert arch.rope_freq_factors == tuple(factors)
    assert arch.rope_long_factors == tuple(2 * f for f in factors)
    assert arch.rope_scaling_dict["original_max_position_embeddings"] == 4096
    assert arch.rope_attention_factor == math.sqrt(1 + math.log(32) / math.log(4096))
    phi35_mini = {
        "architectures": ["Phi3ForCausalLM"], "vocab_size": 32064, "hidden_size": 3072,
        "intermediate_size": 8192, "num_hidden_layers": 32, "num_attention_heads": 32,
        "max_position_embeddings": 131072, "original_max_position_embeddings": 4096,
        "rope_theta": 10000.0,
        "rope_scaling": {"type": "su", "short_factor": factors, "long_factor": factors},
    }  # fmt: skip
    arch = LlamaArchConfig.from_hf_config(phi35_mini)
    assert (arch.rotary_dim, arch.rope_dim) == (0, 96)
    assert arch.rope_scaling_dict["rope_type"] == "longrope"
    with pytest.raises(ValueError, match="RoPE factors must be 48"):
        short = {"type": "longrope", "short_factor": factors[:-1], "long_factor": factors}
        LlamaArchConfig.from_hf_config({**phi35_mini, "rope_scaling": short})
    with pytest.raises(ValueError, match=r"partial_rotary_factor 1.5 must be in \(0, 1\]"):
        LlamaArchConfig.from_hf_config({**phi35_mini, "partial_rotary_factor": 1.5})


@pytest.mark.parametrize("attention_backend", ["auto", "torch"])
def test_phi4_mini_generates_as_transformers_on_both_sides_of_the_original_context(
    tiny_model_factory, attention_backend
):
    """Within an original context (max_model_len 64) the short factors, past it the long ones
    for every position (transformers takes them from a sequence's first step past it on: for
    prompts longer than 64, all along). The C++ layer loop and the PyTorch reference alike."""
    from transformers import AutoModelForCausalLM

    folder = tiny_model_factory("phi4_mini")
    reference = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    vocab = reference.config.vocab_size
    sides = {ORIGINAL: random_prompts(vocab, lengths=(2, 9, 30, 44)),  # + 12 stay within 64
             512: random_prompts(vocab, lengths=(65, 80, 130))}  # fmt: skip
    for max_model_len, prompts in sides.items():
        expected = hf_greedy(reference, prompts, [12] * len(prompts))
        llm = LLM(str(folder), dtype="float32", max_model_len=max_model_len,
                  attention_backend=attention_backend)  # fmt: skip
        model = llm.core.loaded.model
        assert model.long_rope == (max_model_len > ORIGINAL)
        on_cpu = llm.core.device.type == "cpu"  # the C++ layer loop is a CPU's
        assert (model.fused_layers is not None) == (attention_backend == "auto" and on_cpu)
        assert _greedy(llm, prompts) == expected


def test_engines_sharing_a_longrope_model_must_agree_on_its_side(tiny_model_factory):
    llm = LLM(str(tiny_model_factory("phi4_mini")), dtype="float32", max_model_len=ORIGINAL)
    loaded = llm.core.loaded
    LLM(dtype="float32", loaded_model=loaded, max_model_len=32)  # the same (short) side
    with pytest.raises(ConfigError, match="short factors"):
        LLM(dtype="float32", loaded_model=loaded, max_model_len=512)


def test_a_phi4_mini_gguf_generates_as_its_hf_folder(tmp_path, tiny_model_factory):
    """llama.cpp's converter writes the rotated dimensions as `rope.dimension_count`, LongRoPE's
    factors as the `rope_factors_short` / `rope_factors_long` tensors and its attention factor
    and original context as `rope.scaling.*` fields: the same tokens as the folder, each side."""
    folder = tiny_model_factory("phi4_mini")
    path = write_tiny_gguf(folder, tmp_path / "phi4-mini.gguf", GGMLQuantizationType.F32)
    vocab = LLM(str(folder), dtype="float32").core.arch.vocab_size
    for max_model_len, lengths in ((ORIGINAL, (2, 9, 44)), (512, (65, 130))):
        prompts = random_prompts(vocab, lengths=lengths)
        want = _greedy(LLM(str(folder), dtype="float32", max_model_len=max_model_len), prompts)
        llm = LLM(str(path), dtype="float32", max_model_len=max_model_len,
                  quantized_activations="off")  # fmt: skip
        arch = llm.core.arch
        assert (arch.rotary_dim, arch.rope_scaling_dict["rope_type"]) == (12, "longrope")
        assert arch.rope_attention_factor == pytest.approx(
            math.sqrt(1 + math.log(512 / ORIGINAL) / math.log(ORIGINAL))
        )
        assert _greedy(llm, prompts) == want
